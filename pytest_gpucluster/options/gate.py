"""Options of the regression gate: the baseline results.json, the default tolerance, and whether a
confirmed regression fails or only warns.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.spec import Option, user_path


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
    "an earlier results.json to gate regressions against",
    None,
    user_path,
    "RESULTS_JSON",
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
