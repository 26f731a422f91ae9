"""Options of the regression gate: the baseline results.json, the default tolerance, and whether a
confirmed regression fails or only warns.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.options.spec import Option, user_path


@dataclass(frozen=True, slots=True)
class HistoryRuns:
    """``--baseline history:N``: the baseline is the median of the last N healthy runs of the
    ``--gpucluster-history`` store (``results/history/baseline.py``)."""

    last: int

    def __str__(self) -> str:
        return f"history:{self.last}"


def _baseline(text: str) -> Path | HistoryRuns:
    if not text.startswith("history:"):
        return user_path(text)
    count = text.removeprefix("history:")
    if not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"expected history:N with N the number of healthy runs to take the median of (history:5), got {text!r}"
        )
    return HistoryRuns(int(count))


def _gate_mode(text: str) -> str:
    if text not in ("fail", "warn"):
        raise ValueError(f"expected 'fail' or 'warn', got {text!r}")
    return text


def _percent(text: str) -> float:
    from pytest_gpucluster.profiles.quantities import parse_fraction

    return parse_fraction(text if text.endswith("%") else f"{text}%" if float(text) > 1 else text)


BASELINE = Option(
    "--baseline",
    "baseline",
    "an earlier results.json (or a fleet baseline) to gate regressions against, or history:N for "
    "the median of the last N healthy runs in the --gpucluster-history store; a results.json also "
    "calibrates the plan (--gpucluster-dry-run, --gpucluster-budget) with the job times it recorded",
    None,
    _baseline,
    "RESULTS_JSON|history:N",
)
MAX_REGRESSION = Option(
    "--max-regression",
    "max_regression",
    "largest allowed regression against --baseline past the baseline's noise, e.g. 5%, for metrics "
    "the profile's regression: tolerances do not name",
    0.05,
    _percent,
    "PERCENT",
)
REGRESSION_GATE = Option(
    "--regression-gate",
    "regression_gate",
    "with --baseline: 'fail' (a confirmed regression fails its test) or 'warn' (compared and "
    "reported, never failed on: runs on different machines)",
    "fail",
    _gate_mode,
    "MODE",
)
