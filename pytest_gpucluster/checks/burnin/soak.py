"""Verdicts of the soak (``--gpucluster-soak``): busbw that holds over minutes, not a peak once.

- :func:`soak_points`: what soaks — every ``collectives.checks`` entry with a ``min_busbw`` (the
  gated sizes, on their scopes), and :func:`runnable` which of them this session can run;
- :func:`collect`: the ranks' samples (``workloads/soak.py``) as one :class:`Series` per point and
  group — a node (intra-node), a node pair (inter-node) or all nodes (full); each sample's time is
  the slowest rank's (nccl-tests ``-a 3``), its moment the group's first rank's;
- :func:`soak_checks`: per series, the **lowest** sample against the point's floor times
  ``burnin.soak.min_busbw_fraction`` (the floor holds at every moment, not only at the median of a
  few repeats) and the **coefficient of variation** against ``burnin.soak.max_cv``; the series rides
  along as the check's spread (values and times), so results.json keeps it and the report draws it
  over time. A failure names the node or the pair and says when the busbw first fell below the floor
  and what the halves of the window measured, so a degradation half-way shows as such.

Pure: no torch, no pytest.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.maths.metrics import busbw
from pytest_gpucluster.profiles.schema import CollectivesSection, SoakSettings
from pytest_gpucluster.results.model import Check, Spread, ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = ["Series", "SoakPoint", "collect", "runnable", "soak_checks", "soak_points", "weighted_cv"]


@dataclass(frozen=True, slots=True)
class SoakPoint:
    """One gated busbw point of ``collectives.checks`` (``index``), soaked on its scope."""

    index: int
    collective: str
    scope: str
    size_bytes: int
    floor: float
    """``min_busbw`` of the check, B/s."""
    dtype: str = "float32"

    @property
    def title(self) -> str:
        from pytest_gpucluster.checks.collectives import human_size

        return f"{self.collective} {human_size(self.size_bytes)} {self.scope}"

    def options(self) -> dict[str, Any]:
        """The point as the rank side reads it."""
        return {
            "collective": self.collective,
            "size_bytes": self.size_bytes,
            "scope": self.scope,
            "dtype": self.dtype,
        }


def soak_points(collectives: CollectivesSection) -> list[SoakPoint]:
    """Every check with a busbw floor, in the profile's order."""
    return [
        SoakPoint(i, c.collective, c.scope, int(c.size), float(c.min_busbw), collectives.sweep.dtype)
        for i, c in enumerate(collectives.checks)
        if c.min_busbw is not None
    ]


def runnable(
    points: Sequence[SoakPoint], nodes: int, ranks_per_node: int
) -> tuple[list[SoakPoint], list[str]]:
    """The points this session can soak, and a sentence for each it cannot."""
    kept, why = [], []
    for point in points:
        if point.scope == "intra-node" and ranks_per_node < 2:
            why.append(f"{point.title}: 1 rank per node, so no intra-node traffic")
        elif point.scope == "inter-node" and nodes < 2:
            why.append(f"{point.title}: needs 2+ nodes, the session has {nodes} (pass --hostfile)")
        elif point.scope == "full" and nodes * ranks_per_node < 2:
            why.append(f"{point.title}: needs 2+ ranks")
        else:
            kept.append(point)
    return kept, why


@dataclass(frozen=True, slots=True)
class Series:
    """One group's busbw over the window at one point."""

    point: SoakPoint
    name: str
    """The node, ``a<->b`` for a pair, ``all N nodes``."""
    hosts: tuple[str, ...]
    ranks: int
    times: tuple[float, ...]
    busbw: tuple[float, ...]
    durations: tuple[float, ...] = ()
    """Seconds each sample took (its calls x the slowest rank's time per call): the weights of the
    window's statistics, so a slow spell counts for the time it lasted, not for the few samples it
    had time to produce."""

    def weights(self) -> tuple[float, ...]:
        return self.durations if len(self.durations) == len(self.busbw) else (1.0,) * len(self.busbw)

    @property
    def labels(self) -> dict[str, Any]:
        """The point, and who: ``node`` (intra-node), ``pair`` (inter-node) or ``nodes`` (full)."""
        who: dict[str, Any]
        if self.point.scope == "intra-node":
            who = {"node": self.name}
        elif self.point.scope == "inter-node":
            who = {"pair": self.name}
        else:
            who = {"nodes": len(self.hosts)}
        return {"collective": self.point.collective, "size_bytes": self.point.size_bytes, **who}

    @property
    def who(self) -> str:
        kind = {"intra-node": "node", "inter-node": "pair"}.get(self.point.scope, "group")
        return f"{kind} {self.name}"


def collect(values: Sequence[Mapping[str, Any]], points: Sequence[SoakPoint]) -> list[Series]:
    """One series per (point, group) from every rank's value (rank order)."""
    merged: dict[tuple[int, tuple[int, ...]], dict[int, Mapping[str, Any]]] = {}
    hosts = list(values[0].get("hosts") or []) if values else []
    for rank, value in enumerate(values):
        for entry in value.get("series") or []:
            merged.setdefault((int(entry["point"]), tuple(entry["group"])), {})[rank] = entry
    out = []
    for (index, group), by_rank in sorted(merged.items()):
        entries = [by_rank[r] for r in sorted(by_rank)]
        name = str(entries[0]["name"])
        counts = {len(e["samples"]) for e in entries}
        if sorted(by_rank) != sorted(group) or len(counts) != 1:
            raise JobFailed(
                f"soak point {index}, group {name}: ranks {sorted(by_rank)} of {list(group)} reported, with "
                f"{[len(e['samples']) for e in entries]} samples; the ranks must agree (see the job's rank logs)"
            )
        point = points[index]
        times = tuple(float(t) for t, _ in entries[0]["samples"])  # the group's first rank's clock
        slowest = [max(float(e["samples"][k][1]) for e in entries) for k in range(len(times))]
        size = int(entries[0]["size_bytes"])
        rates = tuple(busbw(point.collective, size, t / 1e6, len(group)) for t in slowest)
        spent = tuple(int(entries[0].get("iters", 1)) * t / 1e6 for t in slowest)
        who = tuple(dict.fromkeys(hosts[r] for r in group)) if hosts else ()
        out.append(Series(point, name, who, len(group), times, rates, spent))
    return out


def weighted_cv(values: Sequence[float], weights: Sequence[float]) -> float:
    """Standard deviation / mean of ``values``, each weighted (by the time its sample took: the
    weighted mean of busbw is then the window's average bandwidth, bytes over seconds)."""
    total = sum(weights)
    if len(values) < 2 or total <= 0:
        return 0.0
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
    if mean <= 0:
        return 0.0
    variance = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / total
    return variance**0.5 / mean


def _story(series: Series, floor: float) -> str:
    """What the window looked like: the lowest sample and when, the halves, the first dip below the floor."""
    values, times = series.busbw, series.times
    low = min(range(len(values)), key=values.__getitem__)
    end = times[-1] + series.weights()[-1] if series.durations else times[-1]
    text = (
        f"{series.point.title}, {series.who}: {len(values)} samples over {end - times[0]:.0f} s, "
        f"lowest {format_value(values[low], 'B/s')} at {times[low]:.0f} s, median "
        f"{format_value(statistics.median(values), 'B/s')}"
    )
    middle = (times[0] + end) / 2
    first = [v for t, v in zip(times, values, strict=True) if t < middle]
    second = [v for t, v in zip(times, values, strict=True) if t >= middle]
    if first and second:
        text += (
            f"; first half of the window median {format_value(statistics.median(first), 'B/s')}, second "
            f"half {format_value(statistics.median(second), 'B/s')}"
        )
    below = next((i for i, v in enumerate(values) if v < floor), None)
    if below is not None:
        count = sum(v < floor for v in values)
        text += f"; first below the floor at {times[below]:.0f} s ({count} of {len(values)} samples below)"
    return text


def _series_checks(series: Series, settings: SoakSettings, profile: str) -> list[Check]:
    point, values = series.point, series.busbw
    floor = point.floor * settings.min_busbw_fraction
    story = _story(series, floor)
    origin = (
        f"The floor {format_value(floor, 'B/s')} is {settings.min_busbw_fraction:.0%} "
        f"(burnin.soak.min_busbw_fraction) of collectives.checks[{point.index}].min_busbw."
    )
    look = (
        " Look at that pair's link: the fabric counters (test_fabric_after), and -m burnin's pairwise "
        "localization to tell a node from the link."
        if point.scope == "inter-node"
        else ""
    )
    lowest = Check(
        "burnin.soak.busbw_min",
        min(values),
        "B/s",
        floor,
        ">=",
        ThresholdRef(profile, ("burnin", "soak", "min_busbw_fraction")),
        scope=point.scope,
        labels=series.labels,
        spread=Spread.of(values, series.times),
        hint=f"{story}. {origin}{look}",
    )
    cv_ref = ThresholdRef(profile, ("burnin", "soak", "max_cv")) if settings.max_cv is not None else None
    how = "standard deviation / mean of the samples, each weighted by the time it took"
    variation = Check(
        "burnin.soak.busbw_cv",
        weighted_cv(values, series.weights()),
        "fraction",
        settings.max_cv,
        "<=",
        cv_ref,
        scope=point.scope,
        labels=series.labels,
        hint=f"{story}. Coefficient of variation: {how}.{look}",
    )
    return [lowest, variation]


def soak_checks(
    series: Sequence[Series], settings: SoakSettings, profile: str
) -> tuple[list[Check], list[Suspect]]:
    """Per series its lowest sample and its variation (see the module doc); the nodes and pairs of the
    series that failed, as suspects (a pair is a link suspect: it is never drained)."""
    checks: list[Check] = []
    suspects: list[Suspect] = []
    for one in series:
        if not one.busbw:
            continue
        mine = _series_checks(one, settings, profile)
        checks += mine
        failed = [c for c in mine if c.failed]
        if not failed or one.point.scope == "full":
            continue
        reason = (
            "soak: "
            + "; ".join(
                f"{'lowest busbw' if c.metric.endswith('min') else 'busbw variation'} "
                f"{format_value(c.value, c.unit)} (limit {format_value(c.threshold or 0.0, c.unit)})"
                for c in failed
            )
            + f" at {one.point.title}"
        )
        if one.point.scope == "inter-node" and len(one.hosts) == 2:
            suspects.append(Suspect(one.hosts[0], reason, "soak", "link", peer=one.hosts[1]))
        else:
            suspects.append(Suspect(one.name, reason, "soak"))
    return checks, suspects
