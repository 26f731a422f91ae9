"""Burn-in verdicts that compare nodes and ranks with each other: stragglers, pairwise localization,
version drift, and ECC/XID counters that grew during the run.

Each is a count that must stay at zero (no straggler, no suspect pair, no version finding, no
counter increase), recorded beside the samples it was found in, with the suspects named in the
hint; the `Suspect` s themselves go to the drain list. The detection lives in ``burnin/``
(`stragglers`, `pairwise`, `drift`); this module only turns its results into checks.

Pure: no torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.burnin.drift import DriftFinding
from pytest_gpucluster.burnin.pairwise import Localization
from pytest_gpucluster.burnin.stragglers import Sample, Verdict, find_stragglers
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = [
    "counter_check",
    "injected_straggler",
    "pairwise_checks",
    "slow_alone",
    "straggler_checks",
    "version_check",
]


def straggler_checks(
    verdict: Verdict, metric: str, what: str, unit: str, **labels: Any
) -> tuple[list[Check], list[Suspect]]:
    """Every sample (information), then the number of stragglers (at most 0), each named; and the
    stragglers as suspects. ``what`` says what the samples are, for the sentences."""
    checks = [
        Check(
            metric,
            s.value,
            unit,
            labels={"host": s.host or s.key, **({"rank": s.rank} if s.rank is not None else {}), **labels},
        )
        for s in verdict.samples
    ]
    named = [
        st.suspect(what, unit, verdict.tolerance, higher_is_better=verdict.higher_is_better)
        for st in verdict.stragglers
    ]
    checks.append(
        Check(
            f"{metric}.stragglers",
            float(len(named)),
            "ranks" if "rank" in metric else "nodes",
            0.0,
            "<=",
            labels=labels,
            hint="\n".join(
                [f"Stragglers (slower than the median by more than {verdict.tolerance:.0%}):"]
                + [f"  {s.reason}" for s in named]
            ),
        )
    )
    return checks, named


def slow_alone(per_node_busbw: Mapping[str, float], tolerance: float) -> set[str]:
    """Nodes whose own intra-node all_reduce is a straggler among the nodes': the pairwise
    localization leaves them out, where they would only make their partners look bad."""
    if len(per_node_busbw) < 2:
        return set()
    samples = [Sample(host, busbw, host) for host, busbw in per_node_busbw.items()]
    verdict = find_stragglers(samples, tolerance=tolerance, higher_is_better=True)
    return {st.sample.key for st in verdict.stragglers}


def injected_straggler(verdict: Verdict, slow_rank: int, delay_s: float) -> tuple[list[Check], str | None]:
    """The detector's self-test: every rank's time outside the all_reduce (information, the slowed
    rank labelled ``injected``), and why the detector failed it — it must name the slowed rank and
    its host, and nobody else — or None."""
    checks = [
        Check(
            "burnin.injected_straggler_lag",
            s.value,
            "s",
            labels={"rank": s.rank, "host": s.host, "injected": s.rank == slow_rank},
        )
        for s in verdict.samples
    ]
    host = next((s.host for s in verdict.samples if s.rank == slow_rank), None)
    named = [(st.sample.rank, st.sample.host) for st in verdict.stragglers]
    if named == [(slow_rank, host)]:
        return checks, None
    return checks, (
        f"rank {slow_rank} on {host} slept {delay_s * 1e3:g} ms before every call, and the detector named "
        f"{named or 'nobody'} (tolerance {verdict.tolerance:.0%}, median {verdict.reference}); "
        f"samples: {[(s.key, s.value) for s in verdict.samples]}"
    )


def pairwise_checks(found: Localization, jobs: int, excluded: Sequence[str] = ()) -> list[Check]:
    """Each pair's busbw per round and the number of pair jobs (information), then the number of
    suspects the localization named (at most 0)."""
    checks = [
        Check(
            "burnin.pair_busbw",
            j.result.busbw,
            "B/s",
            scope="inter-node",
            labels={"pair": f"{j.pair[0]}<->{j.pair[1]}", "round": index},
        )
        for index, judged in enumerate(found.rounds, start=1)
        for j in judged
        if j.result.busbw is not None
    ]
    nodes = len(found.nodes)
    checks.append(Check("burnin.pair_jobs", float(jobs), "jobs", labels={"nodes": nodes}))
    left_out = f" ({', '.join(sorted(excluded))} left out: slow on their own)" if excluded else ""
    checks.append(
        Check(
            "burnin.pairwise_suspects",
            float(len(found.suspects)),
            "suspects",
            0.0,
            "<=",
            labels={"nodes": nodes},
            hint="\n".join(found.lines()) + left_out,
        )
    )
    return checks


def version_check(findings: Sequence[DriftFinding], profile: str, pins: Mapping[str, str]) -> Check:
    """The number of version findings (at most 0): pins missed, and nodes that disagree."""
    shown = ", ".join(f"{k} {v}" for k, v in pins.items()) or "none"
    return Check(
        "burnin.version_drift",
        float(len(findings)),
        "findings",
        0.0,
        "<=",
        ThresholdRef(profile, ("versions",)) if pins else None,
        hint="\n".join([*(f.message for f in findings), f"Pins of profile {profile}: {shown}."]),
    )


def counter_check(grown: Sequence[Suspect]) -> Check:
    """The number of GPUs whose ECC, retired-page or remapped-row counters grew, or that logged an
    XID, during the run (at most 0)."""
    return Check(
        "burnin.counter_increases",
        float(len(grown)),
        "GPUs",
        0.0,
        "<=",
        hint="\n".join(s.line() for s in grown),
    )
