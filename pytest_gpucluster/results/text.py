"""How values and checks read to people: human units, and the sentence a failed `Check` fails with.

Pure: no pytest, no I/O. Shared by the recorder (failure messages), the summary, the reports and
the `checks/` modules that quote a value in a hint.
"""

from __future__ import annotations

from pytest_gpucluster.results.model import Check

__all__ = ["failure_message", "format_value"]

_SCALES = {
    "B/s": (1e9, "GB/s"),
    "s": (1.0, "s"),
    "B": (2**30, "GiB"),
    "FLOP/s": (1e12, "TFLOP/s"),
    "fraction": (0.01, "%"),
}


def format_value(value: float, unit: str) -> str:
    """Human units for canonical ones: 1.2e9 B/s -> '1.2 GB/s', 0.004 s -> '4 ms', 0.93 -> '93%'."""
    if value != value:  # NaN
        return "n/a"
    if unit == "bool":
        return "yes" if value else "no"
    if unit == "s":
        if abs(value) < 1e-3:
            return f"{value * 1e6:.4g} us"
        if abs(value) < 1:
            return f"{value * 1e3:.4g} ms"
        return f"{value:.4g} s"
    if unit in _SCALES:
        scale, shown = _SCALES[unit]
        return f"{value / scale:.4g}{'' if shown == '%' else ' '}{shown}"
    return f"{value:.4g} {unit}".rstrip()


_EXPECTED = {">=": "at least", "<=": "at most", "==": "exactly"}


def failure_message(check: Check) -> str:
    """``[NOT MEASURED: |BROKEN MEASUREMENT: ]metric [scope] (labels): measured X, expected at least Y (threshold from profile P: key);
    median of n, range a..b. <hint>`` — the value, the threshold, where it comes from, the noise,
    and what to look at next."""
    where = f" [{check.scope}]" if check.scope else ""
    labels = ", ".join(f"{k}={v}" for k, v in check.labels.items())
    labels = f" ({labels})" if labels else ""
    spread = check.spread
    noise = ""
    if spread is not None and spread.n > 1:
        noise = (
            f"; median of {spread.n}, range {format_value(spread.min, check.unit)}"
            f"..{format_value(spread.max, check.unit)}"
        )
    src = f" (threshold from {check.ref})" if check.ref is not None else ""
    threshold = "n/a" if check.threshold is None else format_value(check.threshold, check.unit)
    problem = f"{check.problem.upper()}: " if check.problem else ""
    text = (
        f"{problem}{check.metric}{where}{labels}: measured {format_value(check.value, check.unit)}, expected "
        f"{_EXPECTED[check.comparison]} {threshold}{src}{noise}"
    )
    return f"{text}. {check.hint}".rstrip() if check.hint else text
