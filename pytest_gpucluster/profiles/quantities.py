"""Quantities with units, as profile authors write them: ``"920Gbps"``, ``"60GiB"``, ``"50us"``, ``"92%"``.

Each parser returns the value in one canonical unit (bytes/s, bytes, seconds, a fraction, FLOP/s)
and raises ``ValueError`` with a sentence saying what was expected; the profile schema turns that
into an error naming the file and key. Plain numbers are refused on purpose where a unit is
ambiguous (is ``100`` GB/s or Gbps?) — a silent default would be a wrong threshold.
"""

from __future__ import annotations

import re

__all__ = [
    "format_bandwidth",
    "format_bytes",
    "format_duration",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "parse_flops",
    "parse_fraction",
]

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[A-Za-zµ/%]*)\s*$")

_BYTE_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
# Bandwidth: bytes per second, or bits per second (the unit NICs are sold in).
_BANDWIDTH_UNITS = {
    "b/s": 1,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "kib/s": 2**10,
    "mib/s": 2**20,
    "gib/s": 2**30,
    "bps": 1 / 8,
    "kbps": 1e3 / 8,
    "mbps": 1e6 / 8,
    "gbps": 1e9 / 8,
    "tbps": 1e12 / 8,
    "gbit/s": 1e9 / 8,
    "mbit/s": 1e6 / 8,
}
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "h": 3600.0,
}
_FLOPS_UNITS = {
    "flop/s": 1,
    "flops": 1,
    "gflop/s": 1e9,
    "gflops": 1e9,
    "tflop/s": 1e12,
    "tflops": 1e12,
    "pflop/s": 1e15,
    "pflops": 1e15,
}


def _split(text: object, kind: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise ValueError(f"expected a {kind} such as {example!r}, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    if not isinstance(text, str):
        raise ValueError(f"expected a {kind} such as {example!r}, got {type(text).__name__} {text!r}")
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"expected a {kind} such as {example!r}, got {text!r}")
    return float(match.group("num")), match.group("unit")


def _scaled(text: object, units: dict[str, float], kind: str, example: str, *, allow_bare: bool) -> float:
    number, unit = _split(text, kind, example)
    if not unit:
        if allow_bare:
            return number
        raise ValueError(f"expected a {kind} with a unit such as {example!r}, got {text!r} (no unit)")
    # "Gbps" and "GB/s" differ by 8x: decide case-sensitively on the b/B before folding case.
    key = unit.lower()
    if key not in units:
        known = ", ".join(sorted({u for u in units if u.isascii()}))
        raise ValueError(f"expected a {kind} such as {example!r}, got unknown unit {unit!r} (known: {known})")
    if (
        kind == "bandwidth"
        and unit.endswith("/s")
        and unit[-3:-2] == "b"
        and not unit.lower().endswith("bit/s")
    ):
        # "Gb/s" means gigabits per second; only "GB/s" is bytes.
        return number * units[key] / 8
    return number * units[key]


def parse_bandwidth(text: object) -> float:
    """Bytes per second from ``"115GB/s"``, ``"920Gbps"`` (bits), ``"400Gb/s"`` (bits)."""
    value = _scaled(text, _BANDWIDTH_UNITS, "bandwidth", "115GB/s", allow_bare=False)
    return _non_negative(value, text, "bandwidth")


def parse_bytes(text: object) -> float:
    """Bytes from ``"64MiB"``, ``"16GB"``; a bare integer is a byte count."""
    value = _scaled(text, _BYTE_UNITS, "size", "64MiB", allow_bare=True)
    return _non_negative(value, text, "size")


def parse_duration(text: object) -> float:
    """Seconds from ``"7.8s"``, ``"50us"``, ``"2min"``."""
    value = _scaled(text, _DURATION_UNITS, "duration", "50us", allow_bare=False)
    return _non_negative(value, text, "duration")


def parse_flops(text: object) -> float:
    """FLOP/s from ``"989TFLOP/s"``."""
    value = _scaled(text, _FLOPS_UNITS, "compute rate", "989TFLOP/s", allow_bare=False)
    return _non_negative(value, text, "compute rate")


def parse_fraction(text: object) -> float:
    """A fraction from ``"92%"`` or a bare ``0.92``; must lie in [0, 1] for a percentage."""
    number, unit = _split(text, "percentage", "92%")
    if unit == "%":
        number /= 100.0
    elif unit:
        raise ValueError(f"expected a percentage such as '92%' or 0.92, got {text!r}")
    if number < 0:
        raise ValueError(f"expected a non-negative percentage, got {text!r}")
    return number


def _non_negative(value: float, text: object, kind: str) -> float:
    if value < 0:
        raise ValueError(f"expected a non-negative {kind}, got {text!r}")
    return value


def format_bandwidth(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
