"""Text helpers the GPU session's summary modules share (`gpu_summary.py`, `gpu_summary_numerics.py`):
values in human units, labels, verdicts, and lookups in a ``results.json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_gpucluster.results.text import format_value

__all__ = [
    "failed_tests",
    "fmt",
    "labels_text",
    "outcome",
    "outcome_counts",
    "outcome_lines",
    "outcome_message",
    "read_json",
    "threshold_text",
    "verdict_of",
]


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else format_value(float(value), unit)


def labels_text(labels: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in labels.items() if k not in set(skip))
    return f" ({shown})" if shown else ""


def verdict_of(m: Mapping[str, Any]) -> str:
    return str(m.get("problem") or m.get("verdict") or "?").upper()


def threshold_text(m: Mapping[str, Any]) -> str:
    if m.get("threshold") is None:
        return ""
    return f" [{m.get('comparison', '')} {fmt(m['threshold'], m['unit'])}]"


def outcome(results: Mapping[str, Any], test_name: str) -> Mapping[str, Any] | None:
    for o in results.get("outcomes") or []:
        if str(o.get("test_id", "")).endswith(test_name) or f"::{test_name}[" in str(o.get("test_id", "")):
            return o
    return None


def outcome_message(results: Mapping[str, Any], test_name: str, default: str) -> str:
    o = outcome(results, test_name)
    if o is None:
        return default
    return f"{o.get('outcome')}: {' '.join(str(o.get('message') or '').split())[:300]}"


def outcome_counts(results: Mapping[str, Any]) -> str:
    """``2 failed, 5 passed, 13 skipped``: the step's tests by outcome."""
    counts: dict[str, int] = {}
    for o in results.get("outcomes") or []:
        counts[str(o.get("outcome"))] = counts.get(str(o.get("outcome")), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no test recorded"


def failed_tests(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [o for o in results.get("outcomes") or [] if o.get("outcome") in ("failed", "error")]


def outcome_lines(results: Mapping[str, Any]) -> list[str]:
    """The counts, then every failed test with its message, then every skip with its reason."""
    lines = [f"tests: {outcome_counts(results)}"]
    for o in failed_tests(results):
        lines.append(f"  FAILED {o.get('test_id')}: {' '.join(str(o.get('message') or '').split())[:400]}")
    for o in results.get("outcomes") or []:
        if o.get("outcome") == "skipped":
            message = " ".join(str(o.get("message") or "").split())[:200]
            lines.append(f"  skipped {str(o.get('test_id')).split('::')[-1]}: {message}")
    return lines
