"""The end-of-session terminal table: measured vs threshold per metric, failures first.

Test outcomes are told apart, never conflated: an infrastructure error (the job could not run), a
performance failure (a value missed its threshold) and any other failure are listed under their
own headings before the table. Info-only sweeps (many points, no threshold) fold into one row per
metric and scope so a 200-point busbw sweep does not bury the verdict. ``measurement_rows`` is
shared with report.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.model import Measurement, TestOutcome
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.results.text import format_value

_ORDER = {"fail": 0, "pass": 1, "info": 2}
HEADER = ("VERDICT", "METRIC", "MEASURED", "THRESHOLD")
CATEGORY_NAMES = {
    "pass": "passed",
    "performance": "below threshold",
    "not measured": "not measured",
    "infrastructure": "infrastructure errors",
    "failure": "other failures",
    "skipped": "skipped",
}
FAILURE_HEADINGS = (
    ("infrastructure", "INFRASTRUCTURE ERRORS (the job could not run, a rank crashed or hung)"),
    ("performance", "PERFORMANCE FAILURES (a measured value missed its threshold)"),
    ("not measured", "NOT MEASURED (a threshold the profile sets had no value, or a broken measurement)"),
    ("failure", "OTHER FAILURES (a bug or a wrong result, not a measurement)"),
)


def _threshold(m: Measurement) -> str:
    if m.threshold is None:
        return "-"
    return f"{m.comparison} {format_value(m.threshold, m.unit)}"


def subject(m: Measurement) -> str:
    labels = ",".join(f"{k}={v}" for k, v in m.labels.items())
    parts = [m.metric, f"[{m.scope}]" if m.scope else "", f"({labels})" if labels else ""]
    return " ".join(p for p in parts if p)


def measurement_rows(measurements: Sequence[Measurement]) -> list[tuple[str, str, str, str]]:
    """(verdict, metric, measured, threshold) rows: gated values one by one, failures first; info
    values of one metric and scope folded into a single 'N values, min..max' row."""
    gated = sorted(
        (m for m in measurements if m.verdict != "info"), key=lambda m: (_ORDER[m.verdict], m.metric)
    )
    rows = [(m.verdict_label, subject(m), format_value(m.value, m.unit), _threshold(m)) for m in gated]
    info: dict[tuple[str, str | None], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.verdict == "info":
            info[(m.metric, m.scope)].append(m)
    for (metric, scope), group in sorted(info.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if len(group) == 1:
            m = group[0]
            rows.append(("INFO", subject(m), format_value(m.value, m.unit), "-"))
            continue
        values = sorted(m.value for m in group if m.value == m.value)
        unit = group[0].unit
        span = f"{format_value(values[0], unit)}..{format_value(values[-1], unit)}" if values else "n/a"
        name = f"{metric} [{scope}]" if scope else metric
        rows.append(("INFO", f"{name} ({len(group)} values)", span, "-"))
    return rows


def table_lines(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]


def outcome_counts(outcomes: Sequence[TestOutcome]) -> str:
    counts = Counter(o.category for o in outcomes)
    return ", ".join(f"{counts[c]} {name}" for c, name in CATEGORY_NAMES.items() if counts.get(c))


def failure_lines(outcomes: Sequence[TestOutcome]) -> list[str]:
    """Failed tests under three headings that are never merged."""
    lines: list[str] = []
    for category, heading in FAILURE_HEADINGS:
        failed = [o for o in outcomes if o.category == category]
        if failed:
            lines.append(f"{heading}: {len(failed)}")
            lines += [
                f"  {o.test_id}: {o.message.splitlines()[0] if o.message else o.outcome}" for o in failed
            ]
    return lines


def threshold_lines(thresholds: Mapping[str, Any] | None) -> list[str]:
    """The fail-closed tally (``checks/fail_closed.py``): thresholds excused by a capability the
    cluster lacks (which, and why) and those not run in this selection; the unmeasured ones fail as
    checks, per node and GPU where they are missing."""
    if not thresholds:
        return []
    lines = []
    excused = thresholds.get("excused") or []
    if excused:
        lines.append(f"thresholds not judged, the cluster lacks what their tests need: {len(excused)}")
        lines += [f"  {e['key']}: {e['why']}" for e in excused]
    not_run = thresholds.get("not_run") or []
    judged = thresholds.get("measured") or excused or thresholds.get("not_measured")
    if not_run and judged:  # none of the suite ran: nothing to say
        shown = ", ".join(not_run[:8]) + (f" and {len(not_run) - 8} more" if len(not_run) > 8 else "")
        lines.append(f"thresholds not run in this selection: {len(not_run)} ({shown})")
    missing = thresholds.get("not_measured") or []
    if missing:
        lines.append(
            f"NOT MEASURED: {len(missing)} threshold(s) the profile sets had no value: {', '.join(missing)}"
        )
        where = [w for w in thresholds.get("not_measured_where") or () if w.get("host")]
        if where:
            named = ", ".join(
                f"{w['key']} on {w['host']}" + (f" GPU {w['gpu']}" if w.get("gpu") is not None else "")
                for w in where[:8]
            )
            lines.append(f"  missing on: {named}" + (f" and {len(where) - 8} more" if len(where) > 8 else ""))
    return lines


def summary_lines(
    recorder: Recorder,
    results_dir: Path,
    *,
    comparison_lines: Sequence[str] = (),
    reports: Sequence[Path] = (),
    report_note: str | None = None,
    finding_lines: Sequence[str] = (),
    signoff_line: str = "",
) -> list[str]:
    lines = failure_lines(recorder.outcomes)
    if recorder.measurements:
        lines += table_lines(measurement_rows(recorder.measurements))
    else:
        lines.append("no measurements were recorded")
    lines += threshold_lines(recorder.header.get("thresholds"))
    lines += finding_lines
    used = recorder.header.get("nodes_used") or {}
    if used.get("line"):
        lines.append(f"nodes: {used['line']}")
    if signoff_line:
        lines.append(signoff_line)
    if recorder.outcomes:
        lines.append("tests: " + outcome_counts(recorder.outcomes))
    if comparison_lines:
        lines.append("")
        lines += comparison_lines
    lines.append(f"results: {results_dir / 'results.json'}")
    if reports:
        lines.append("report: " + ", ".join(str(p) for p in reports))
    if report_note:
        lines.append(f"report: {report_note}")
    return lines
