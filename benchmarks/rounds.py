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

With ``drop_converged`` a key whose interval came within the tolerance (after at least
``min_rounds``) is not measured again: each side is then called with the keys still pending
(``None`` for all of them, in the warm-up and the first round) and returns just those, so the
rounds get cheaper as keys settle and the budget goes to the noisy ones. Stopping a key at the
first round its interval fits is a sequential test; its coverage is a little below the nominal
95% (which the order-statistic interval exceeds by its discreteness), and the report names the
rounds each key had.

Pure standard library plus :mod:`ratio_stats`; the clock is a parameter so tests need no time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ratio_stats import MedianCI, ci_line, median_ci, paired_ratios, ratio_line

__all__ = [
    "Comparison",
    "RoundRecord",
    "StopRule",
    "add_stop_options",
    "print_one_key",
    "progress_line",
    "report_lines",
    "run_interleaved",
]

Side = Callable[..., Mapping[str, float]]
"""One side of a round: run it once, return its value per comparison key. Called with no
argument, or with the pending keys (a tuple, or None for all) under ``drop_converged``."""


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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StopRule:
        """The rule of the options `add_stop_options` added, at 95% confidence."""
        return cls(args.tolerance, 0.95, args.min_rounds, args.max_rounds, args.max_seconds)


def add_stop_options(parser: argparse.ArgumentParser, *, max_rounds: int, max_seconds: float) -> None:
    """A benchmark's ``--tolerance``, ``--min-rounds``, ``--max-rounds`` and ``--max-seconds``
    (its own limits as defaults), read back by `StopRule.from_args`."""
    rule = StopRule()
    parser.add_argument(
        "--tolerance", type=float, default=rule.tolerance, help="stop once every CI is this close"
    )
    parser.add_argument("--min-rounds", type=int, default=rule.min_rounds)
    parser.add_argument("--max-rounds", type=int, default=max_rounds)
    parser.add_argument("--max-seconds", type=float, default=max_seconds, help="the time budget")


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
        """The side's value of ``key`` in every round that measured it."""
        return [float(getattr(r, side)[key]) for r in self.rounds if key in r.harness]

    def ratios(self, key: str) -> list[float]:
        return paired_ratios(self.values(key, "harness"), self.values(key, "reference"))


def _cis(keys: Sequence[str], rounds: Sequence[RoundRecord], confidence: float) -> dict[str, MedianCI]:
    out = {}
    for key in keys:
        measured = [r for r in rounds if key in r.harness]
        harness = [r.harness[key] for r in measured]
        reference = [r.reference[key] for r in measured]
        out[key] = median_ci(paired_ratios(harness, reference), confidence)
    return out


def _checked(
    values: Mapping[str, float], expected: Sequence[str] | None, side: str, index: int
) -> tuple[str, ...]:
    got = tuple(values)
    if expected is not None and set(got) != set(expected):
        raise ValueError(
            f"round {index + 1}: the {side} side measured {sorted(got)}, the round asked for {sorted(expected)}"
        )
    return tuple(expected) if expected is not None else got


def _settled(key: str, cis: Mapping[str, MedianCI], rule: StopRule) -> bool:
    ci = cis.get(key)
    return ci is not None and ci.n >= rule.min_rounds and ci.within(rule.tolerance)


def run_interleaved(
    harness: Side,
    reference: Side,
    rule: StopRule,
    *,
    on_round: Callable[[RoundRecord, Mapping[str, MedianCI]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    warmup_rounds: int = 0,
    drop_converged: bool = False,
) -> Comparison:
    """Rounds of both sides, alternating which goes first, until ``rule`` says stop.

    ``warmup_rounds`` rounds run first and are not recorded: on the 2-vCPU VM the first
    round or two of a run read 10-20% apart (page cache, the host's view of an idle VM), after
    which paired rounds agree within 1-2%. Their time counts against ``rule.max_seconds``.
    ``drop_converged``: see the module's docstring.
    """
    if warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be 0 or more, got {warmup_rounds}")
    sides = {"harness": harness, "reference": reference}

    def call(side: str, pending: tuple[str, ...] | None) -> Mapping[str, float]:
        return sides[side](pending) if drop_converged else sides[side]()

    started = clock()
    for _ in range(warmup_rounds):
        call("harness", None)
        call("reference", None)
    rounds: list[RoundRecord] = []
    keys: tuple[str, ...] | None = None
    cis: dict[str, MedianCI] = {}
    stopped = ""
    while not stopped:
        index = len(rounds)
        harness_first = index % 2 == 0
        pending = (
            keys
            if keys is None or not drop_converged
            else tuple(k for k in keys if not _settled(k, cis, rule))
        )
        round_start = clock()
        values: dict[str, Mapping[str, float]] = {}
        for side in ("harness", "reference") if harness_first else ("reference", "harness"):
            values[side] = call(side, pending)
            pending = _checked(values[side], pending, side, index)
        keys = keys or pending
        record = RoundRecord(
            index, harness_first, values["harness"], values["reference"], clock() - round_start
        )
        rounds.append(record)
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
    if all(ci.n >= rule.min_rounds and ci.within(rule.tolerance) for ci in cis.values()):
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


def progress_line(record: RoundRecord, cis: Mapping[str, MedianCI], measured: str) -> str:
    """One round as the benchmarks print it: which side went first, how long it took, what it
    ``measured`` (the caller's words and numbers), and the widest interval so far."""
    first = "harness" if record.harness_first else "reference"
    widest = max(cis.values(), key=lambda ci: ci.relative_half_width)
    which = "CI" if len(cis) == 1 else "widest CI"
    width = f"{which} +-{widest.relative_half_width * 100:.1f}%" if widest.has_interval else "no CI yet"
    return f"round {record.index + 1} ({first} first, {record.seconds:.0f} s): {measured}; {width}"


def print_one_key(
    key: str, harness_name: str, reference_name: str, *, digits: int = 4
) -> Callable[[RoundRecord, Mapping[str, MedianCI]], None]:
    """An ``on_round`` for a benchmark with one key: both sides' seconds and the round's ratio."""

    def on_round(record: RoundRecord, cis: Mapping[str, MedianCI]) -> None:
        ours, theirs = record.harness[key], record.reference[key]
        measured = (
            f"{harness_name} {ours:.{digits}f} s, {reference_name} {theirs:.{digits}f} s,"
            f" this round {ours / theirs:.3f}"
        )
        print(progress_line(record, cis, measured), flush=True)

    return on_round


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
