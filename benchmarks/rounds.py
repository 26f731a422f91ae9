"""Interleaved rounds of harness against reference, until the ratio is known well enough.

One round runs both sides once, back to back; the order alternates (harness first in even
rounds, the reference first in odd ones), so that neither side always inherits the other's warm
caches or always runs into the same phase of a neighbour's load. Every side returns one value
per comparison key (``"all_reduce 16 MiB"``, ``"step time"``...); a round's ratio per key is
harness / reference. :func:`run_interleaved` keeps adding rounds until every key's median ratio
has its 95% interval within the tolerance (:class:`StopRule`), or a limit is reached:

- ``max_rounds``, a round limit;
- ``max_seconds``, a time budget, checked before each new round against the mean round so
  far, so that the run ends inside it. It does not cut a run below ``min_rounds``: a ratio
  without an interval would not be worth the minutes already spent.

Pure standard library plus :mod:`ratio_stats`; the clock is a parameter so tests need no time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ratio_stats import MedianCI, ci_line, median_ci, paired_ratios, ratio_line

__all__ = ["Comparison", "RoundRecord", "StopRule", "report_lines", "run_interleaved"]

Side = Callable[[], Mapping[str, float]]
"""One side of a round: run it once, return its value per comparison key."""


@dataclass(frozen=True, slots=True)
class StopRule:
    tolerance: float = 0.02
    """Stop once every key's interval lies within this fraction of its median."""
    confidence: float = 0.95
    min_rounds: int = 6
    """Rounds before the first stop test (6 is the fewest with a 95% order-statistic interval)."""
    max_rounds: int = 40
    max_seconds: float = 170.0

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be a fraction between 0 and 1, got {self.tolerance!r}")
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(
                f"need 1 <= min_rounds <= max_rounds, got min {self.min_rounds}, max {self.max_rounds}"
            )
        if self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds!r}")


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """What one round measured."""

    index: int
    harness_first: bool
    harness: Mapping[str, float]
    reference: Mapping[str, float]
    seconds: float


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every round of a run, and why it stopped."""

    keys: tuple[str, ...]
    rounds: tuple[RoundRecord, ...]
    stopped: str
    elapsed_s: float
    confidence: float = 0.95
    tolerance: float = 0.02
    cis: Mapping[str, MedianCI] = field(default_factory=dict)

    def values(self, key: str, side: str) -> list[float]:
        return [float(getattr(r, side)[key]) for r in self.rounds]

    def ratios(self, key: str) -> list[float]:
        return paired_ratios(self.values(key, "harness"), self.values(key, "reference"))


def _cis(keys: Sequence[str], rounds: Sequence[RoundRecord], confidence: float) -> dict[str, MedianCI]:
    out = {}
    for key in keys:
        harness = [r.harness[key] for r in rounds]
        reference = [r.reference[key] for r in rounds]
        out[key] = median_ci(paired_ratios(harness, reference), confidence)
    return out


def _checked(
    values: Mapping[str, float], keys: tuple[str, ...] | None, side: str, index: int
) -> tuple[str, ...]:
    got = tuple(values)
    if keys is not None and set(got) != set(keys):
        raise ValueError(
            f"round {index + 1}: the {side} side measured {sorted(got)}, earlier rounds {sorted(keys)}"
        )
    return keys or got


def run_interleaved(
    harness: Side,
    reference: Side,
    rule: StopRule,
    *,
    on_round: Callable[[RoundRecord, Mapping[str, MedianCI]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Comparison:
    """Rounds of both sides, alternating which goes first, until ``rule`` says stop."""
    started = clock()
    rounds: list[RoundRecord] = []
    keys: tuple[str, ...] | None = None
    cis: dict[str, MedianCI] = {}
    stopped = ""
    while not stopped:
        index = len(rounds)
        harness_first = index % 2 == 0
        round_start = clock()
        values: dict[str, Mapping[str, float]] = {}
        for side in ("harness", "reference") if harness_first else ("reference", "harness"):
            values[side] = (harness if side == "harness" else reference)()
            keys = _checked(values[side], keys, side, index)
        record = RoundRecord(
            index, harness_first, values["harness"], values["reference"], clock() - round_start
        )
        rounds.append(record)
        assert keys is not None
        cis = _cis(keys, rounds, rule.confidence)
        if on_round is not None:
            on_round(record, cis)
        stopped = _stop_reason(rule, rounds, cis, clock() - started)
    assert keys is not None
    return Comparison(keys, tuple(rounds), stopped, clock() - started, rule.confidence, rule.tolerance, cis)


def _stop_reason(
    rule: StopRule, rounds: Sequence[RoundRecord], cis: Mapping[str, MedianCI], elapsed: float
) -> str:
    n = len(rounds)
    if n < rule.min_rounds:
        return ""
    if all(ci.within(rule.tolerance) for ci in cis.values()):
        return f"converged: every {rule.confidence * 100:g}% CI within +-{rule.tolerance * 100:g}% after {n} rounds"
    if n >= rule.max_rounds:
        return (
            f"round limit: {n} rounds (--max-rounds) before every CI came within +-{rule.tolerance * 100:g}%"
        )
    mean_round = elapsed / n
    if elapsed + mean_round > rule.max_seconds:
        return (
            f"time budget: another round (~{mean_round:.0f} s) would pass {rule.max_seconds:.0f} s"
            f" (--max-seconds) before every CI came within +-{rule.tolerance * 100:g}%"
        )
    return ""


def report_lines(
    comparison: Comparison, label: Callable[[str], str], unit: str, harness_name: str, reference_name: str
) -> list[str]:
    """Per key: both sides' medians, the ratio line (ratio last) and the interval line."""
    lines = [f"stopped, {comparison.stopped} ({comparison.elapsed_s:.0f} s)"]
    for key in comparison.keys:
        ci = comparison.cis[key]
        ours = median_ci(comparison.values(key, "harness"), comparison.confidence).median
        theirs = median_ci(comparison.values(key, "reference"), comparison.confidence).median
        lines.append(
            f"{label(key)}: {harness_name} {ours:.4g} {unit}, {reference_name} {theirs:.4g} {unit} (medians)"
        )
        lines.append(ratio_line(f"{label(key)} {harness_name}/{reference_name}", ci))
        lines.append(ci_line(ci, comparison.tolerance))
    return lines
