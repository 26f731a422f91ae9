"""What a physics check reports: findings located by key path, and how numbers are written in them.

Every check module (links, cases, NCCL environment, burn-in) appends to a :class:`Collector`;
``physics.check_profile`` turns it into a :class:`PhysicsReport`, and the loader locates each
finding at a file and line. Imports nothing from this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Collector",
    "Finding",
    "KeyPath",
    "PhysicsReport",
    "format_key",
    "gbs",
    "gib",
    "pct",
    "seconds",
    "sig",
    "tflops",
]

KeyPath = tuple[str | int, ...]


def format_key(path: Sequence[str | int]) -> str:
    """``("sft", "cases", 0, "max_step_time")`` -> ``sft.cases[0].max_step_time``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@dataclass(frozen=True, slots=True)
class Finding:
    level: Literal["error", "warning"]
    key: KeyPath
    """Where in the profile, e.g. ``("sft", "cases", 0, "min_samples_per_s")``."""
    message: str


@dataclass(frozen=True, slots=True)
class PhysicsReport:
    findings: tuple[Finding, ...]
    checked: int
    """How many thresholds were held against a peak."""
    skipped: tuple[str, ...]
    """Thresholds that could not be checked, each with why (no device peak, unknown model...)."""

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "warning")


@dataclass
class Collector:
    """Mutable accumulator the check functions share while one profile is checked."""

    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    checked: int = 0

    def error(self, key: KeyPath, message: str) -> None:
        self.findings.append(Finding("error", key, message))

    def warning(self, key: KeyPath, message: str) -> None:
        self.findings.append(Finding("warning", key, message))

    def skip(self, key: KeyPath, reason: str) -> None:
        self.skipped.append(f"{format_key(key)}: {reason}")

    def report(self) -> PhysicsReport:
        return PhysicsReport(tuple(self.findings), self.checked, tuple(self.skipped))


def sig(x: float, digits: int = 4) -> str:
    """``digits`` significant digits with thousands separators, never an exponent."""
    return f"{x:,.0f}" if abs(x) >= 10**digits else f"{x:,.{digits}g}"


def gbs(bytes_per_s: float) -> str:
    return f"{sig(bytes_per_s / 1e9)} GB/s"


def tflops(flops: float) -> str:
    return f"{sig(flops / 1e12)} TFLOP/s"


def gib(n: float) -> str:
    return f"{sig(n / 2**30)} GiB ({sig(n / 1e9)} GB)"


def pct(fraction: float) -> str:
    return f"{sig(fraction * 100, 3)}%"


def seconds(s: float) -> str:
    """``770 s (12.8 min)``: seconds, and minutes once they help."""
    return f"{sig(s)} s ({sig(s / 60, 3)} min)" if s >= 120 else f"{sig(s)} s"
