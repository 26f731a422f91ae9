"""The data a run leaves behind: measurements, test outcomes, and the versioned results.json layout.

Pure data and (de)serialisation; no pytest, no I/O beyond what callers pass in. ``results.json``
is the baseline of the next regression gate, so its layout is versioned (``schema_version``) and
every change to it must stay readable by ``from_json``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 1

Comparison = Literal[">=", "<=", "=="]
Verdict = Literal["pass", "fail", "info"]
Category = Literal["pass", "performance", "infrastructure", "failure", "skipped"]
"""How a test ended: passed; a measured value missed its threshold; the job could not run or a rank
crashed/hung; any other failure (a bug, a wrong result); skipped. Never conflated in the summary."""


@dataclass(frozen=True, slots=True)
class Spread:
    """Repeated measurements of one point: the median is gated, the rest shows the noise."""

    median: float
    min: float
    max: float
    mad: float
    n: int
    values: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Measurement:
    test_id: str
    metric: str
    """Stable name across runs, e.g. ``collectives.all_reduce.busbw``; the baseline gate matches on
    (metric, scope, labels)."""
    value: float
    unit: str
    threshold: float | None = None
    comparison: Comparison = ">="
    verdict: Verdict = "info"
    scope: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    spread: Spread | None = None
    source: str | None = None
    """Where the threshold comes from (profile file and key, seed, baseline run)."""
    time: float = 0.0

    @property
    def key(self) -> str:
        """Identity across runs: metric, scope and labels (not the test id, which may be renamed)."""
        labels = ",".join(f"{k}={self.labels[k]}" for k in sorted(self.labels))
        return f"{self.metric}|{self.scope or ''}|{labels}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["value"] = _finite_or_none(self.value)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        spread = data.get("spread")
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["spread"] = Spread(**{**spread, "values": tuple(spread.get("values", ()))}) if spread else None
        fields["value"] = float("nan") if data.get("value") is None else float(data["value"])
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class TestOutcome:
    test_id: str
    outcome: Literal["passed", "failed", "skipped", "error"]
    category: Category
    duration_s: float
    message: str = ""


def _finite_or_none(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def compare(value: float, threshold: float, comparison: Comparison) -> bool:
    if math.isnan(value):
        return False
    if comparison == ">=":
        return value >= threshold
    if comparison == "<=":
        return value <= threshold
    return value == threshold
