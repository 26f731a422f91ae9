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

__all__ = ["fmt", "labels_text", "outcome", "outcome_message", "read_json", "threshold_text", "verdict_of"]


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
