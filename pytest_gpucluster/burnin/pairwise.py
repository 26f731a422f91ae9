"""Pairwise localization: name the slow node or link in two rounds of node-pair tests, not n^2.

A collective over the whole cluster that is slow says only "something is slow". Testing every
pair of nodes names the culprit but costs n(n-1)/2 jobs. Two rounds are enough:

1. **Disjoint pairs**: ``(n0, n1), (n2, n3), ...``, all at once (each node is in one pair). A
   pair *fails* when its job fails, when its bus bandwidth is below the profile's absolute floor,
   or when it is slower than the median of the round by more than the tolerance, a fraction of
   time (busbw below ``median / (1 + tolerance)``; the healthier middle value with an even count,
   see `stragglers`). Nodes of passing pairs are
   known-good. With an odd count the last node sits out round 1.
2. **Each node of a failing pair against a known-good node** (and the node that sat out),
   spread over different good nodes so the pairs stay disjoint where possible. Judged against
   round 1's healthy figure.

Then, for a failing pair ``(a, b)``: if only ``a`` also fails with a good partner, ``a`` is the
suspect; if both do, both are; if neither does, the **link** between them is (a cable or switch
port: each node is fine with others). Jobs: ``floor(n/2)`` in round 1 and at most two per failing
pair (plus one) in round 2, so the count grows linearly with the number of nodes and with the
number of bad nodes.

With 2 or 3 nodes round 1 holds a single pair, which is its own median: only the absolute floor
can fail it. With only 2 nodes, or when no pair passes, there is no known-good node: every node of
a failing pair is named, and the reason says they could not be told apart. When more than half of the
pairs are slow, the median is a slow pair and only the absolute floor (``pair_min_busbw``) can
catch them: set it on real clusters.

Pure: the jobs are run by the ``run_round`` callable (`burnin.runner` in real runs, a fake in
the tests). Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.burnin.stragglers import reference_of
from pytest_gpucluster.results.text import format_value

__all__ = [
    "JudgedPair",
    "Localization",
    "Pair",
    "PairResult",
    "first_round",
    "judge_pairs",
    "localize",
    "second_round",
    "waves",
]

Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PairResult:
    """What one pair test measured: bus bandwidth in bytes/s, or why the job failed."""

    pair: Pair
    busbw: float | None
    error: str | None = None
    job_id: str | None = None
    duration_s: float | None = None

    def text(self) -> str:
        """``n1<->n2 1.2 GB/s`` or ``n1<->n2 failed: <why>``, for progress lines."""
        measured = f"{self.busbw / 1e9:.3g} GB/s" if self.busbw is not None else f"failed: {self.error}"
        return f"{self.pair[0]}<->{self.pair[1]} {measured}"


@dataclass(frozen=True, slots=True)
class JudgedPair:
    result: PairResult
    round: int
    passed: bool
    why: str
    """Empty when it passed; else the sentence with the numbers."""

    @property
    def pair(self) -> Pair:
        return self.result.pair

    def text(self) -> str:
        a, b = self.pair
        value = format_value(self.result.busbw, "B/s") if self.result.busbw is not None else "job failed"
        return f"{a}<->{b} {value}"


RoundRunner = Callable[[int, Sequence[Pair]], Sequence[PairResult]]
"""``run_round(round_number, pairs)`` -> one `PairResult` per pair (any order)."""


def first_round(nodes: Sequence[str]) -> tuple[list[Pair], list[str]]:
    """Disjoint pairs of consecutive nodes, and the node left over when the count is odd."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    leftover = [nodes[-1]] if len(nodes) % 2 else []
    return pairs, leftover


def second_round(to_test: Sequence[str], good: Sequence[str]) -> list[Pair]:
    """Each node to test against a good node, the good nodes taken in turn (disjoint pairs as
    long as there are at least as many good nodes as nodes to test)."""
    if not good:
        return []
    return [(node, good[i % len(good)]) for i, node in enumerate(to_test)]


def waves(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """Split a round into groups of node-disjoint pairs that may run at the same time."""
    remaining = list(pairs)
    out: list[list[Pair]] = []
    while remaining:
        busy: set[str] = set()
        wave, later = [], []
        for pair in remaining:
            if busy.isdisjoint(pair):
                wave.append(pair)
                busy.update(pair)
            else:
                later.append(pair)
        out.append(wave)
        remaining = later
    return out


def judge_pairs(
    results: Iterable[PairResult],
    round_number: int,
    *,
    reference: float | None,
    tolerance: float,
    floor: float | None = None,
) -> list[JudgedPair]:
    """Pass or fail each pair: a failed job, below ``floor``, or slower than ``reference`` by more
    than ``tolerance`` (busbw below ``reference / (1 + tolerance)``)."""
    judged = []
    for result in results:
        if result.busbw is None:
            error = (result.error or "no result").strip().splitlines()
            judged.append(
                JudgedPair(result, round_number, False, f"the job failed: {error[0] if error else ''}")
            )
            continue
        value = format_value(result.busbw, "B/s")
        if floor is not None and result.busbw < floor:
            why = f"{value}, below the floor of {format_value(floor, 'B/s')}"
            judged.append(JudgedPair(result, round_number, False, why))
        elif reference is not None and result.busbw * (1 + tolerance) < reference:
            slower = reference / result.busbw - 1 if result.busbw > 0 else float("inf")
            why = (
                f"{value}, {slower:.0%} slower than the healthy pairs' "
                f"{format_value(reference, 'B/s')} (tolerance {tolerance:.0%})"
            )
            judged.append(JudgedPair(result, round_number, False, why))
        else:
            judged.append(JudgedPair(result, round_number, True, ""))
    return judged


@dataclass(frozen=True)
class Localization:
    nodes: tuple[str, ...]
    rounds: tuple[tuple[JudgedPair, ...], ...]
    reference: float | None
    """Round 1's healthy pair bus bandwidth (the median), bytes/s."""
    suspects: tuple[Suspect, ...]
    good: tuple[str, ...]
    """Nodes seen in a passing pair."""
    tolerance: float
    floor: float | None = None

    @property
    def pair_tests(self) -> int:
        return sum(len(r) for r in self.rounds)

    @property
    def ok(self) -> bool:
        return not self.suspects

    def lines(self) -> list[str]:
        """The rounds as a person reads them, then the verdict."""
        ref = format_value(self.reference, "B/s") if self.reference is not None else "n/a"
        out = [
            f"pairwise localization of {len(self.nodes)} nodes: {self.pair_tests} pair tests in "
            f"{len(self.rounds)} round(s); healthy pair busbw {ref}, tolerance {self.tolerance:.0%}"
            + (f", floor {format_value(self.floor, 'B/s')}" if self.floor is not None else "")
        ]
        for index, judged in enumerate(self.rounds, start=1):
            cells = [f"{j.text()}{'' if j.passed else ' FAIL'}" for j in judged]
            out.append(f"  round {index}: " + ", ".join(cells))
        if self.suspects:
            out += [f"  suspect {s.line()}" for s in self.suspects]
        else:
            out.append("  no suspect: every pair is within tolerance")
        return out


def _evidence(judged: Sequence[JudgedPair], node: str) -> dict[str, float | str | None]:
    return {
        f"round {j.round} {j.pair[0]}<->{j.pair[1]}": (
            j.result.busbw if j.result.busbw is not None else f"failed: {j.why}"
        )
        for j in judged
        if node in j.pair
    }


def localize(
    nodes: Sequence[str],
    run_round: RoundRunner,
    *,
    tolerance: float,
    floor: float | None = None,
) -> Localization:
    """Run the two rounds through ``run_round`` and name the suspects (see the module doc)."""
    nodes = tuple(nodes)
    if len(set(nodes)) != len(nodes):
        raise BurninError(f"pairwise localization got a node twice: {', '.join(nodes)}")
    if not tolerance >= 0:
        raise BurninError(f"the pair tolerance must be a fraction >= 0, got {tolerance}")
    if len(nodes) < 2:
        return Localization(nodes, (), None, (), nodes, tolerance, floor)

    pairs, leftover = first_round(nodes)
    results1 = _run(run_round, 1, pairs)
    measured = [r.busbw for r in results1 if r.busbw is not None]
    reference = reference_of(measured, higher_is_better=True) if measured else None
    round1 = judge_pairs(results1, 1, reference=reference, tolerance=tolerance, floor=floor)
    good = tuple(n for j in round1 if j.passed for n in j.pair)
    failed = [j for j in round1 if not j.passed]
    to_test = [n for j in failed for n in j.pair] + leftover
    ref_text = format_value(reference, "B/s") if reference is not None else "none measured"

    if not to_test:
        return Localization(nodes, (tuple(round1),), reference, (), good, tolerance, floor)
    if not good:
        suspects = tuple(
            Suspect(
                node=n,
                check="pairwise",
                reason=(
                    f"pair {j.pair[0]}<->{j.pair[1]} failed ({j.why}) and no pair passed, so there is "
                    "no known-good node to tell the two apart"
                ),
                evidence=_evidence([j], n),
            )
            for j in failed
            for n in j.pair
        )
        return Localization(nodes, (tuple(round1),), reference, suspects, good, tolerance, floor)

    results2 = _run(run_round, 2, second_round(to_test, good))
    round2 = judge_pairs(results2, 2, reference=reference, tolerance=tolerance, floor=floor)
    suspects = _second_round_suspects(
        failed, leftover, round1, round2, f"{ref_text} (tolerance {tolerance:.0%})"
    )
    return Localization(nodes, (tuple(round1), tuple(round2)), reference, suspects, good, tolerance, floor)


def _second_round_suspects(
    failed: Sequence[JudgedPair],
    leftover: Sequence[str],
    round1: Sequence[JudgedPair],
    round2: Sequence[JudgedPair],
    healthy: str,
) -> tuple[Suspect, ...]:
    """A node of a failed pair that also fails with a known-good partner is suspect; a failed pair
    whose nodes are both fine with others points at the link between them."""
    failed2 = {j.pair[0]: j for j in round2 if not j.passed}
    everything = [*round1, *round2]
    out: list[Suspect] = []
    for j in failed:
        a, b = j.pair
        bad = [n for n in (a, b) if n in failed2]
        for node in bad:
            again = failed2[node]
            reason = (
                f"slow with every partner: {j.text()} in round 1, {again.text()} with known-good "
                f"{again.pair[1]} in round 2; healthy pairs reach {healthy}"
            )
            out.append(
                Suspect(node=node, check="pairwise", reason=reason, evidence=_evidence(everything, node))
            )
        if not bad:
            reason = (
                f"{j.text()} failed in round 1 ({j.why}), yet each node is fine with a known-good "
                "partner: suspect the link between them (cable, NIC port, switch port)"
            )
            evidence = {**_evidence(everything, a), **_evidence(everything, b)}
            out.append(
                Suspect(node=a, peer=b, kind="link", check="pairwise", reason=reason, evidence=evidence)
            )
    for node in leftover:
        if node in failed2:
            again = failed2[node]
            reason = f"{again.text()} with known-good {again.pair[1]} in round 2 ({again.why})"
            out.append(
                Suspect(node=node, check="pairwise", reason=reason, evidence=_evidence(everything, node))
            )
    return tuple(out)


def _run(run_round: RoundRunner, number: int, pairs: Sequence[Pair]) -> list[PairResult]:
    results = list(run_round(number, list(pairs)))
    by_pair = {r.pair: r for r in results}
    missing = [p for p in pairs if p not in by_pair]
    if missing:
        raise BurninError(
            f"round {number}: the runner returned no result for pair(s) "
            f"{', '.join(f'{a}<->{b}' for a, b in missing)}"
        )
    return [by_pair[p] for p in pairs]
