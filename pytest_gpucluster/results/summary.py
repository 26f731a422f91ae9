"""The end-of-session terminal table: measured vs threshold per metric, failures first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.results.recorder import Recorder, format_value

_ORDER = {"fail": 0, "pass": 1, "info": 2}


def _threshold(m: Measurement) -> str:
    if m.threshold is None:
        return "-"
    return f"{m.comparison} {format_value(m.threshold, m.unit)}"


def _subject(m: Measurement) -> str:
    labels = ",".join(f"{k}={v}" for k, v in m.labels.items())
    parts = [m.metric, f"[{m.scope}]" if m.scope else "", f"({labels})" if labels else ""]
    return " ".join(p for p in parts if p)


def summary_lines(recorder: Recorder, results_dir: Path) -> list[str]:
    measurements = sorted(recorder.measurements, key=lambda m: (_ORDER.get(m.verdict, 3), m.metric))
    lines: list[str] = []
    if measurements:
        rows = [
            (m.verdict.upper(), _subject(m), format_value(m.value, m.unit), _threshold(m))
            for m in measurements
        ]
        widths = [
            max(len(r[i]) for r in [("VERDICT", "METRIC", "MEASURED", "THRESHOLD"), *rows]) for i in range(4)
        ]
        header = ("VERDICT", "METRIC", "MEASURED", "THRESHOLD")
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    else:
        lines.append("no measurements were recorded")
    counts = Counter(o.category for o in recorder.outcomes)
    if counts:
        order = ("pass", "performance", "infrastructure", "failure", "skipped")
        names = {
            "pass": "passed",
            "performance": "below threshold",
            "infrastructure": "infrastructure errors",
            "failure": "other failures",
            "skipped": "skipped",
        }
        lines.append("tests: " + ", ".join(f"{counts[c]} {names[c]}" for c in order if counts.get(c)))
    lines.append(f"results: {results_dir / 'results.json'}")
    return lines
