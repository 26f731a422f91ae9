"""Stragglers: ranks, nodes or node pairs slower than their peers by more than a tolerance.

The overall number of a job ("all_reduce busbw is 20% low") does not say where to look. Each rank
of a job measures its own time (or rate); a straggler is a sample **slower** than the median of
all samples by more than ``tolerance``, a fraction of time: a time above ``median * (1 + t)``, or
a rate below ``median / (1 + t)`` (tolerance 1.0: twice as slow). For times it must also exceed
the median by ``min_excess`` seconds, below which a difference is timer noise. The median, not the mean or the best, is the
reference: one slow rank cannot drag it, and one lucky fast rank cannot make the rest look slow.

With an even number of samples the reference is the *healthier* of the two middle values
(``median_low`` of times, ``median_high`` of rates): with 2 ranks the slow one is compared with
the fast one, not with their average, which a single straggler would pull halfway to itself.

What a rank's "own time" is depends on the job. In a collective every rank finishes together
(the fast ones wait inside the call), so :func:`sweep_samples` uses the time each rank spent
*outside* the collective calls per iteration (``lag``): the late rank is the one with the lag.
In the health job each rank times its own matmul (:func:`value_samples`).

Pure: standard library and the parent-side sweep summary; no torch, no pytest.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.maths.sweep import summarize_sweep
from pytest_gpucluster.results.text import format_value

__all__ = [
    "Sample",
    "Straggler",
    "Verdict",
    "find_stragglers",
    "reference_of",
    "sweep_samples",
    "value_samples",
    "worst_per_host",
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured value of one rank, node or node pair."""

    key: str
    """What the value belongs to, as a person names it: ``rank 3``, ``node17``, ``n1<->n2``."""
    value: float
    host: str | None = None
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class Straggler:
    sample: Sample
    reference: float
    """The median the sample was compared with."""
    excess: float
    """How much slower, as a fraction of time (``inf`` when the reference time is 0 or the rate is)."""

    def sentence(self, what: str, unit: str, tolerance: float, higher_is_better: bool = False) -> str:
        s = self.sample
        where = s.key if s.host is None or s.host in s.key else f"{s.key} on {s.host}"
        if self.excess == float("inf"):
            pct = ""
        elif self.excess >= 9:  # "286731% slower" reads worse than "2868x as slow"
            pct = f"{self.excess + 1:.0f}x as slow, "
        else:
            pct = f"{self.excess:.0%} slower, "
        return (
            f"{where}: {what} {format_value(s.value, unit)}, the median of its peers "
            f"{format_value(self.reference, unit)} ({pct}tolerance {tolerance:.0%})"
        )

    def suspect(self, what: str, unit: str, tolerance: float, *, higher_is_better: bool = False) -> Suspect:
        s = self.sample
        return Suspect(
            node=s.host or s.key,
            rank=s.rank,
            check="straggler",
            reason=self.sentence(what, unit, tolerance, higher_is_better),
            evidence={"value": s.value, "median": self.reference, "unit": unit, "tolerance": tolerance},
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    samples: tuple[Sample, ...]
    reference: float | None
    """None with fewer than 2 samples: nobody to compare with."""
    stragglers: tuple[Straggler, ...]
    tolerance: float
    higher_is_better: bool

    @property
    def ok(self) -> bool:
        return not self.stragglers


def reference_of(values: Sequence[float], higher_is_better: bool = False) -> float:
    """The median, and with an even count the healthier middle value (see the module doc)."""
    if not values:
        raise BurninError("cannot take the median of no samples")
    return statistics.median_high(values) if higher_is_better else statistics.median_low(values)


def find_stragglers(
    samples: Iterable[Sample],
    *,
    tolerance: float,
    min_excess: float = 0.0,
    higher_is_better: bool = False,
) -> Verdict:
    """Samples slower than the median by more than ``tolerance`` (a fraction of time) and by more
    than ``min_excess`` in the samples' unit. Times by default; rates with ``higher_is_better``."""
    if not tolerance >= 0:
        raise BurninError(f"a straggler tolerance must be a fraction >= 0, got {tolerance}")
    items = tuple(samples)
    for s in items:
        if s.value != s.value or s.value < 0:
            raise BurninError(f"{s.key} has an impossible measurement {s.value!r} (negative or NaN)")
    if len(items) < 2:
        return Verdict(items, None, (), tolerance, higher_is_better)
    ref = reference_of([s.value for s in items], higher_is_better)
    found = []
    for s in items:
        if higher_is_better:  # rates: how much longer the same work takes at this rate
            slower = ref / s.value - 1 if s.value > 0 else float("inf")
            gap = ref - s.value
        else:
            slower = s.value / ref - 1 if ref > 0 else float("inf")
            gap = s.value - ref
        if gap > 0 and slower > tolerance and gap > min_excess:
            found.append(Straggler(s, ref, slower))
    found.sort(key=lambda st: -st.excess)
    return Verdict(items, ref, tuple(found), tolerance, higher_is_better)


def worst_per_host(samples: Iterable[Sample], higher_is_better: bool = False) -> list[Sample]:
    """One sample per host, its worst rank's value: stragglers between nodes, not ranks."""
    worst: dict[str, Sample] = {}
    for s in samples:
        host = s.host or s.key
        current = worst.get(host)
        if current is None or (s.value < current.value if higher_is_better else s.value > current.value):
            worst[host] = Sample(key=host, value=s.value, host=host, rank=s.rank)
    return list(worst.values())


def _rank_host(values: Sequence[Mapping[str, Any]]) -> dict[int, str | None]:
    return {int(v["rank"]): (str(v["host"]) if v.get("host") else None) for v in values}


def sweep_samples(rank_values: Sequence[Mapping[str, Any]]) -> list[Sample]:
    """Per rank: the median, over the sweep's points, of its time outside the collective calls
    per iteration, in seconds (from :func:`.collectives.sweep` values)."""
    points = summarize_sweep(list(rank_values))
    hosts = _rank_host(rank_values)
    nranks = points[0].nranks
    out = []
    for rank in range(nranks):
        lag_s = statistics.median(p.per_rank_lag_us[rank] for p in points) * 1e-6
        out.append(Sample(key=f"rank {rank}", value=lag_s, host=hosts.get(rank), rank=rank))
    return out


def value_samples(rank_values: Sequence[Mapping[str, Any]], *path: str) -> list[Sample]:
    """Per rank: the number at ``path`` inside its value (``"cpu", "matmul_s"``); ranks whose
    value lacks it (a skipped part) are left out."""
    out = []
    for value in sorted(rank_values, key=lambda v: int(v["rank"])):
        node: Any = value
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            rank = int(value["rank"])
            host = str(value["host"]) if value.get("host") else None
            out.append(Sample(key=f"rank {rank}", value=float(node), host=host, rank=rank))
    return out
