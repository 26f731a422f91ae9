"""Planning and judging the collective acceptance tests (``acceptance/test_collectives.py``).

Pure: no torch, no pytest, no launching. The test file asks this module

- which tests there are (:func:`cases`): every collective on ``intra-node`` (a busbw curve for the
  report, checked or not), plus each (collective, scope) the profile's ``collectives.checks`` name;
- how many nodes a scope means (:func:`scope_nodes`): intra-node 1, inter-node 2, full all;
- what to sweep (:func:`sweep_requests`, :func:`plan_jobs`): the profile's ``-b -e -f`` grid per
  collective, and a one-size sweep for every checked size off that grid. Scopes that land on the
  same node count share one job, and one job sweeps every collective (``collectives:sweep_many``),
  because each launch costs seconds of imports and rendezvous;
- what the ranks measured (:func:`collect`), and what to record and gate (:func:`gates`): busbw per
  size and placement, the time of each out-of-place point as ``latency``, and the wrong elements,
  the median over ``repeat`` spans gated, the spread recorded, and a failure context that names the
  size, scope, node count and the slowest rank with its host.

It also turns parsed nccl-tests runs into the same points (:func:`points_from_runs`), so the
binaries' output is gated by the same code.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.errors import JobFailed, ProfileError
from pytest_gpucluster.maths.metrics import COLLECTIVES, summarize
from pytest_gpucluster.maths.sweep import (
    DTYPE_SIZES,
    Point,
    layout,
    summarize_sweep,
    sweep_sizes,
)
from pytest_gpucluster.parsers.nccl_tests import Run
from pytest_gpucluster.profiles.schema import CollectiveCheck, CollectivesSection, SweepSettings
from pytest_gpucluster.results.model import Spread

__all__ = [
    "SCOPES",
    "WORKLOAD",
    "Case",
    "CollectiveData",
    "Gate",
    "SweepRequest",
    "cases",
    "collect",
    "gates",
    "human_size",
    "job_options",
    "job_timeout",
    "plan_jobs",
    "points_from_runs",
    "scope_nodes",
    "sweep_requests",
]

SCOPES = ("intra-node", "inter-node", "full")
WORKLOAD = "pytest_gpucluster.workloads.collectives:sweep_many"


def human_size(size: float) -> str:
    """``16777216`` -> ``"16 MiB"``, ``1000`` -> ``"1000 B"`` (nccl-tests sizes are powers of 2)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------- the tests


@dataclass(frozen=True, slots=True)
class Case:
    """One test: a collective on a scope, with the profile's checks for that pair (maybe none)."""

    collective: str
    scope: str
    checks: tuple[tuple[int, CollectiveCheck], ...] = ()
    """(index in ``collectives.checks``, check): the index names the profile key in messages."""

    @property
    def id(self) -> str:
        return f"{self.collective}-{self.scope}"


def cases(section: CollectivesSection) -> list[Case]:
    """Every collective on intra-node, then each other (collective, scope) that has checks."""
    by_pair: dict[tuple[str, str], list[tuple[int, CollectiveCheck]]] = {}
    for index, check in enumerate(section.checks):
        by_pair.setdefault((check.collective, check.scope), []).append((index, check))
    pairs = [(c, "intra-node") for c in COLLECTIVES]
    pairs += [(c, s) for s in SCOPES[1:] for c in COLLECTIVES if (c, s) in by_pair]
    return [Case(c, s, tuple(by_pair.get((c, s), ()))) for c, s in pairs]


def scope_nodes(scope: str, available_nodes: int) -> tuple[int, str | None]:
    """(nodes, None), or (0, why it cannot run) — intra-node 1, inter-node 2, full all of them."""
    if scope == "intra-node":
        return 1, None
    if scope == "inter-node":
        if available_nodes < 2:
            return 0, (
                f"inter-node checks run on 2 nodes; this session has {available_nodes} "
                "(pass --hostfile with 2 or more hosts)"
            )
        return 2, None
    if scope == "full":
        return max(available_nodes, 1), None
    raise ValueError(f"unknown scope {scope!r}; known: {', '.join(SCOPES)}")


# ----------------------------------------------------------------------------------- the sweeps


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """One sweep of one collective over ``sweep_sizes(min_bytes, max_bytes, factor)``."""

    collective: str
    min_bytes: int
    max_bytes: int
    factor: int


def _factor(settings: SweepSettings) -> int:
    if settings.factor != int(settings.factor):
        raise ProfileError(
            f"collectives.sweep.factor is {settings.factor:g}; the sweep multiplies sizes by an integer, "
            "like nccl-tests -f (use 2, 4...)"
        )
    return int(settings.factor)


def sweep_requests(case: Case, settings: SweepSettings) -> list[SweepRequest]:
    """The profile's grid for the case's collective, plus one one-size sweep per checked size
    that the grid does not visit (a 32 GB check beyond a 16 GiB grid, a 3 MiB one between points)."""
    factor = _factor(settings)
    lo, hi = int(settings.min_bytes), int(settings.max_bytes)
    grid = set(sweep_sizes(lo, hi, factor))
    requests = [SweepRequest(case.collective, lo, hi, factor)]
    for size in sorted({int(check.size) for _, check in case.checks} - grid):
        requests.append(SweepRequest(case.collective, size, size, factor))
    return requests


def plan_jobs(
    selected: Sequence[Case], settings: SweepSettings, available_nodes: int
) -> dict[int, list[SweepRequest]]:
    """``nodes -> sweeps``: one job per node count, every sweep the selected cases need once."""
    plan: dict[int, list[SweepRequest]] = {}
    for case in selected:
        nodes, reason = scope_nodes(case.scope, available_nodes)
        if reason is not None:
            continue
        requests = plan.setdefault(nodes, [])
        requests += [r for r in sweep_requests(case, settings) if r not in requests]
    return plan


def job_options(requests: Sequence[SweepRequest], settings: SweepSettings, repeat: int) -> dict[str, Any]:
    """The ``options`` of one ``sweep_many`` job."""
    common = {
        "warmup": settings.warmup,
        "iters": settings.iters,
        "dtype": settings.dtype,
        "op": settings.op,
        "check": settings.check,
        "repeat": repeat,
    }
    sweeps = [
        {
            **common,
            "collective": r.collective,
            "min_bytes": r.min_bytes,
            "max_bytes": r.max_bytes,
            "factor": r.factor,
        }
        for r in requests
    ]
    return {"sweeps": sweeps}


def job_timeout(
    requests: Sequence[SweepRequest], settings: SweepSettings, repeat: int, backend: str
) -> float:
    """A deadline for one sweep job that no healthy run comes near: every collective call of the
    plan (warm-up, sync, ``repeat`` x ``iters`` timed, the check; both placements) moving its
    bytes at a floor rate far below any working fabric — 0.05 GB/s for gloo (a 2-core VM does
    1.2 GB/s), 2 GB/s for NCCL — plus 5 s per sweep and 120 s for start-up."""
    floor = 0.05e9 if backend == "gloo" else 2e9
    calls = 2 * (repeat * settings.iters + 2) + 2 * settings.warmup
    moved = sum(sum(sweep_sizes(r.min_bytes, r.max_bytes, r.factor)) * calls for r in requests)
    return 120.0 + 5.0 * len(requests) + moved / floor


# ----------------------------------------------------------------------------------- the results


@dataclass(frozen=True, slots=True)
class CollectiveData:
    """What one job measured of one collective: its points, or why it could not run."""

    collective: str
    points: tuple[Point, ...] = ()
    skipped: str | None = None
    hosts: tuple[str, ...] = ()
    """Host of each rank, in rank order."""
    wrong_by_rank: Mapping[tuple[int, bool], tuple[int, ...]] = field(default_factory=dict)
    """``(size_bytes, in_place) -> wrong elements per rank`` where the check ran."""


def collect(
    values: Sequence[Mapping[str, Any]], requests: Sequence[SweepRequest]
) -> dict[str, CollectiveData]:
    """Per collective, the points of all its sweeps in one job (``values``: each rank's return
    value of ``sweep_many``, in rank order), merged by size and placement."""
    if not values:
        raise JobFailed("the collective sweep job returned no rank values")
    hosts = tuple(str(v.get("host", "?")) for v in values)
    count = len(values[0]["sweeps"])
    if count != len(requests):
        raise JobFailed(f"the sweep job returned {count} sweeps for {len(requests)} requested")
    merged: dict[str, dict[tuple[int, bool], Point]] = {}
    skipped: dict[str, str] = {}
    wrong: dict[str, dict[tuple[int, bool], tuple[int, ...]]] = {}
    for index, request in enumerate(requests):
        per_rank = [v["sweeps"][index] for v in values]
        reasons = sorted({str(p["skipped"]) for p in per_rank if "skipped" in p})
        if reasons:
            skipped[request.collective] = "; ".join(reasons)
            continue
        points = merged.setdefault(request.collective, {})
        for point in summarize_sweep(per_rank):
            points.setdefault((point.size_bytes, point.in_place), point)
        for n, raw in enumerate(per_rank[0]["points"]):
            for placement in ("out_of_place", "in_place"):
                cells = [r["points"][n].get(placement) for r in per_rank]
                if cells[0] is not None and all(c and c.get("wrong") is not None for c in cells):
                    key = (int(raw["size_bytes"]), placement == "in_place")
                    wrong.setdefault(request.collective, {})[key] = tuple(int(c["wrong"]) for c in cells)
    out: dict[str, CollectiveData] = {}
    for collective in dict.fromkeys(r.collective for r in requests):
        if collective in skipped:
            out[collective] = CollectiveData(collective, skipped=skipped[collective], hosts=hosts)
        else:
            points = tuple(v for _, v in sorted(merged.get(collective, {}).items()))
            out[collective] = CollectiveData(collective, points, None, hosts, wrong.get(collective, {}))
    return out


def points_from_runs(runs_per_repeat: Sequence[Sequence[Run]]) -> list[Point]:
    """Points from nccl-tests output, one list of parsed runs per repetition of the same command:
    per size, the median over the repetitions (nccl-tests prints no per-rank times)."""
    cells: dict[tuple[int, bool], list[tuple[float, float, float, int | None]]] = {}
    meta: dict[int, tuple[str, int, int]] = {}
    for runs in runs_per_repeat:
        for run in runs:
            for row in run.rows:
                meta[row.size_bytes] = (run.collective or "?", row.count, run.nranks or 0)
                for in_place, m in ((False, row.out_of_place), (True, row.in_place)):
                    if m is not None:
                        cells.setdefault((row.size_bytes, in_place), []).append(
                            (m.time_us, m.algbw_gbs, m.busbw_gbs, m.wrong)
                        )
    points = []
    for (size, in_place), rows in sorted(cells.items()):
        collective, count, nranks = meta[size]
        times = tuple(r[0] for r in rows)
        busbws = [r[2] for r in rows]
        wrongs = [r[3] for r in rows]
        points.append(
            Point(
                collective=collective,
                size_bytes=size,
                count=count,
                in_place=in_place,
                nranks=nranks,
                time_us=statistics.median(times),
                algbw_gbs=statistics.median(r[1] for r in rows),
                busbw_gbs=statistics.median(busbws),
                wrong=None if any(w is None for w in wrongs) else sum(int(w) for w in wrongs),
                slowest_rank=-1,
                per_rank_time_us=(),
                per_rank_lag_us=(),
                repeat_time_us=times,
                busbw_spread=summarize(busbws),
            )
        )
    return points


# ----------------------------------------------------------------------------------- the verdicts


@dataclass(frozen=True, slots=True)
class Gate:
    """One call of ``Recorder.check``: a value, its threshold (None records it as info), and what
    the failure message adds."""

    metric: str
    value: float
    threshold: float | None
    unit: str
    comparison: str
    scope: str
    labels: dict[str, Any]
    spread: Spread | None = None
    source: str | None = None
    context: str = ""


def _spread(values: Sequence[float]) -> Spread:
    s = summarize(values)
    return Spread(median=s.median, min=s.min, max=s.max, mad=s.mad, n=s.n, values=tuple(values))


def _check_source(profile: str, index: int, check: CollectiveCheck, key: str) -> str:
    text = f"profile {profile}: collectives.checks[{index}].{key}"
    return f"{text}, {check.source}" if check.source else text


def _who(point: Point, hosts: Sequence[str]) -> str:
    """The slowest rank and its host, with the per-rank times of the slowest few."""
    if point.slowest_rank < 0 or not point.per_rank_time_us:
        return "nccl-tests prints no per-rank times, so no rank can be named"
    r = point.slowest_rank
    host = hosts[r] if r < len(hosts) else "?"
    order = sorted(
        range(len(point.per_rank_time_us)),
        key=lambda i: (point.per_rank_lag_us[i] if point.per_rank_lag_us else 0.0, point.per_rank_time_us[i]),
        reverse=True,
    )
    shown = ", ".join(
        f"rank {i} on {hosts[i] if i < len(hosts) else '?'} {point.per_rank_time_us[i] / 1e3:.3g} ms"
        + (f" ({point.per_rank_lag_us[i] / 1e3:.3g} ms outside the calls)" if point.per_rank_lag_us else "")
        for i in order[:3]
    )
    more = f" and {len(order) - 3} more" if len(order) > 3 else ""
    return f"slowest rank {r} on {host} (time per op: {shown}{more})"


def gates(
    case: Case,
    data: CollectiveData,
    *,
    profile: str,
    nodes: int,
    dtype: str,
    origin: str,
    tool: str | None = None,
) -> list[Gate]:
    """What to record and gate for one case: busbw of every point (both placements), the time
    of every out-of-place point as ``latency``, and the wrong elements summed over the sweep.

    The profile's checks set the thresholds of the points at their sizes (out-of-place, as
    nccl-tests numbers are usually quoted); every other value is recorded as info. ``origin``
    says where the numbers come from (job directory, command line) for the failure message;
    ``tool`` labels values from somewhere other than our own sweep (``"nccl-tests"``).
    """
    name, scope = case.collective, case.scope
    points = data.points
    if not points:
        raise JobFailed(f"the sweep of {name} ({scope}) returned no points; {origin}")
    nranks = points[0].nranks
    elt = DTYPE_SIZES.get(dtype, 4)
    floor: dict[int, tuple[float, str]] = {}
    ceiling: dict[int, tuple[float, str]] = {}
    for index, check in case.checks:
        size = layout(name, int(check.size), elt, nranks).size_bytes if nranks else int(check.size)
        if check.min_busbw is not None and check.min_busbw > floor.get(size, (-1.0, ""))[0]:
            floor[size] = (check.min_busbw, _check_source(profile, index, check, "min_busbw"))
        if check.max_latency is not None and check.max_latency < ceiling.get(size, (float("inf"), ""))[0]:
            ceiling[size] = (check.max_latency, _check_source(profile, index, check, "max_latency"))
    missing = sorted((set(floor) | set(ceiling)) - {p.size_bytes for p in points if not p.in_place})
    if missing:
        raise JobFailed(
            f"{name} ({scope}): no measurement at the checked size(s) {', '.join(map(human_size, missing))}; {origin}"
        )
    ranks_per_node = nranks // nodes if nodes and nranks else nranks
    out: list[Gate] = []
    for p in points:
        placement = p.placement.replace("_", "-")
        labels: dict[str, Any] = {"size_bytes": p.size_bytes, "collective": name, "placement": p.placement}
        labels |= {"dtype": dtype, "nodes": nodes}
        if tool:
            labels["tool"] = tool
        where = (
            f"{name} of {human_size(p.size_bytes)} ({placement}, {dtype}) on {nodes} node(s) x "
            f"{ranks_per_node} ranks, scope {scope}: {_who(p, data.hosts)}. Numbers from {origin}"
        )
        busbw = [
            p.size_bytes / (t * 1e-6) * (p.busbw_gbs / p.algbw_gbs if p.algbw_gbs else 0.0)
            for t in p.repeat_time_us
        ]
        gated_busbw = floor.get(p.size_bytes) if not p.in_place else None
        out.append(
            Gate(
                metric=f"collectives.{name}.busbw",
                value=p.busbw_gbs * 1e9,
                threshold=gated_busbw[0] if gated_busbw else None,
                unit="B/s",
                comparison=">=",
                scope=scope,
                labels=labels,
                spread=_spread(busbw) if busbw and all(t > 0 for t in p.repeat_time_us) else None,
                source=gated_busbw[1] if gated_busbw else None,
                context=where,
            )
        )
        if not p.in_place:
            gated_time = ceiling.get(p.size_bytes)
            out.append(
                Gate(
                    metric=f"collectives.{name}.latency",
                    value=p.time_us * 1e-6,
                    threshold=gated_time[0] if gated_time else None,
                    unit="s",
                    comparison="<=",
                    scope=scope,
                    labels={k: v for k, v in labels.items() if k != "placement"},
                    spread=_spread([t * 1e-6 for t in p.repeat_time_us]) if p.repeat_time_us else None,
                    source=gated_time[1] if gated_time else None,
                    context=where,
                )
            )
    checked = [p for p in points if p.wrong is not None]
    if checked:
        total = sum(int(p.wrong or 0) for p in checked)
        bad = [p for p in checked if p.wrong]
        detail = "; ".join(
            f"{human_size(p.size_bytes)} {p.placement.replace('_', '-')}: {p.wrong}"
            + _wrong_ranks(data.wrong_by_rank.get((p.size_bytes, p.in_place)), data.hosts)
            for p in bad[:5]
        )
        labels = {"collective": name, "dtype": dtype, "nodes": nodes} | ({"tool": tool} if tool else {})
        out.append(
            Gate(
                metric=f"collectives.{name}.wrong",
                value=float(total),
                threshold=0.0,
                unit="elements",
                comparison="==",
                scope=scope,
                labels=labels,
                source="nccl-tests -c: every element of every result must be exact",
                context=(
                    f"{name} on {nodes} node(s), scope {scope}, returned wrong data: {detail}"
                    f"{' ...' if len(bad) > 5 else ''}. Numbers from {origin}"
                ),
            )
        )
    return out


def _wrong_ranks(per_rank: Sequence[int] | None, hosts: Sequence[str]) -> str:
    if not per_rank:
        return ""
    bad = [f"rank {r} on {hosts[r] if r < len(hosts) else '?'}: {w}" for r, w in enumerate(per_rank) if w]
    return f" ({', '.join(bad)})" if bad else ""
