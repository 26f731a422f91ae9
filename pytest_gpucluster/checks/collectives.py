"""Verdicts of the collective acceptance tests (``acceptance/test_collectives.py``).

Pure: no torch, no pytest, no launching (what to sweep is ``plans/collectives.py``). This module
says

- which tests there are (:func:`cases`): every collective on ``intra-node`` (a busbw curve for the
  report, checked or not), plus each (collective, scope) the profile's ``collectives.checks`` name;
- how many nodes a scope means (:func:`scope_nodes`): intra-node 1, inter-node 2, full all;
- what the ranks measured (:func:`collect`, from ``collective_data``), and the checks of one case (:func:`collective_checks`):
  busbw per size and placement, the time of each out-of-place point as ``latency``, and the wrong
  elements, the median over ``repeat`` spans gated, the spread recorded, and a hint that names the
  size, scope, node count and the slowest rank with its host;
- two summaries of each out-of-place curve for the regression gate (``--baseline``), which judges
  them though no threshold is set (``Check.baseline_gate``): ``busbw_peak``, the highest busbw of
  the sweep, and ``busbw_at_max_size``, busbw at the largest size. The other points of an info
  curve are compared with the baseline and shown, never failed on: one noisy 64 KiB point of seven
  collectives must not fail a run, a drop of the whole curve shows in its summaries.

**Latency means what nccl-tests' means.** ``max_latency`` is gated on nccl-tests' own output
(``tool="nccl-tests"``) and on the CPU sweep (gloo, ``perf_counter`` around a loop of blocking
calls: the time of one collective as a rank sees it). The torch sweep on CUDA times ``iters``
``dist.*`` calls between two CUDA events; at small sizes the span is bound by Python's per-call
dispatch (tens of microseconds), not by the GPU, and reads up to ~2x nccl-tests' figure. There the
time is recorded as information, its hint naming the profile key nccl-tests gates.

Parsed nccl-tests runs become the same points (``collective_data.points_from_runs``), so the
binaries' output is judged by the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpucluster.checks.collective_data import CollectiveData, collect, points_from_runs
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.maths.metrics import COLLECTIVES
from pytest_gpucluster.maths.sweep import DTYPE_SIZES, Point, layout
from pytest_gpucluster.profiles.nccl_env import allowed_algorithms
from pytest_gpucluster.profiles.schema import CollectiveCheck, CollectivesSection
from pytest_gpucluster.results.model import Check, Spread, ThresholdRef

__all__ = [
    "SCOPES",
    "UNGATED_LATENCY_TIMERS",
    "Case",
    "CollectiveData",
    "cases",
    "collect",
    "collective_checks",
    "human_size",
    "points_from_runs",
    "scope_nodes",
]

SCOPES = ("intra-node", "inter-node", "full")
UNGATED_LATENCY_TIMERS = ("cuda_events",)
"""Timers of our own sweep whose time per call is not gated against ``max_latency``: the CUDA-event
span of the torch sweep (module doc). The CPU path's ``perf_counter`` is."""


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


def scope_nodes(
    scope: str, available_nodes: int, ranks_per_node: int | None = None
) -> tuple[int, str | None]:
    """(nodes, None), or (0, why it cannot run) — intra-node 1, inter-node 2, full all of them.
    With ``ranks_per_node``, a scope of a single rank is not applicable either: one rank measures
    nothing (an --hw=auto profile shaped to a 1-GPU node keeps its part's intra-node checks)."""
    nodes, reason = _scope_nodes(scope, available_nodes)
    if reason is None and ranks_per_node is not None and nodes * ranks_per_node < 2:
        return 0, (
            f"not applicable: the {scope} scope has 1 rank here ({nodes} node x {ranks_per_node} rank per node): "
            "a collective on one rank measures nothing (an all_reduce moves no bus traffic; a broadcast or "
            "reduce is a no-op timed at launch cost)"
        )
    return nodes, reason


def _scope_nodes(scope: str, available_nodes: int) -> tuple[int, str | None]:
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


# ----------------------------------------------------------------------------------- the verdicts


def _ref(profile: str, index: int, key: str) -> ThresholdRef:
    return ThresholdRef(profile, ("collectives", "checks", index, key))


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


Limit = tuple[float, ThresholdRef, str]
"""A threshold, its profile key, and the profile entry's own note on where it comes from."""


def _algo_note(check: CollectiveCheck, case: Case, env: Mapping[str, str] | None, nodes: int) -> str:
    """What the floor assumes of NCCL's algorithm, and whether the job's environment allowed it."""
    if check.algo is None:
        return ""
    note = f"the floor assumes NCCL algorithm {check.algo}"
    if env is not None and check.algo not in allowed_algorithms(dict(env), case.collective, nodes):
        shown = env.get("NCCL_ALGO") or "unset"
        note += (
            f", which this job's environment does not allow (NCCL_ALGO={shown}, NCCL_NVLS_ENABLE="
            f"{env.get('NCCL_NVLS_ENABLE', 'unset')}): set collectives.scope_env.{case.scope}.NCCL_ALGO"
        )
    return note


def _limits(
    case: Case, nranks: int, dtype: str, profile: str, env: Mapping[str, str] | None = None, nodes: int = 1
) -> tuple[dict[int, Limit], dict[int, Limit]]:
    """The floors and ceilings the case's profile checks set, by the size nccl-tests reports for
    them (all_gather of 1000 B is a 992 B buffer on 2 ranks); the strictest where two overlap."""
    elt = DTYPE_SIZES.get(dtype, 4)
    floor: dict[int, Limit] = {}
    ceiling: dict[int, Limit] = {}
    for index, check in case.checks:
        size = layout(case.collective, int(check.size), elt, nranks).size_bytes if nranks else int(check.size)
        note = "; ".join(n for n in (check.source or "", _algo_note(check, case, env, nodes)) if n)
        if check.min_busbw is not None and check.min_busbw > floor.get(size, (-1.0,))[0]:
            floor[size] = (check.min_busbw, _ref(profile, index, "min_busbw"), note)
        if check.max_latency is not None and check.max_latency < ceiling.get(size, (float("inf"),))[0]:
            ceiling[size] = (check.max_latency, _ref(profile, index, "max_latency"), note)
    return floor, ceiling


def _hint(where: str, limit: Limit | None) -> str:
    return f"{where}. Threshold: {limit[2]}" if limit and limit[2] else where


def _busbw_spread(p: Point) -> Spread | None:
    """busbw of each repeat of one point (its time per repeat, with the point's bus factor)."""
    if not p.repeat_time_us or not all(t > 0 for t in p.repeat_time_us) or not p.algbw_gbs:
        return None
    return Spread.of(p.repeat_busbw())


def _ungated_latency(ceiling: Limit | None) -> str:
    if ceiling is None:
        return ""
    return (
        f"Not gated here: {ceiling[1].key} is gated on nccl-tests' output only (test_nccl_tests). This time is "
        "torch's, CUDA events around a Python loop of collective calls, whose per-call dispatch inflates small "
        "sizes up to ~2x against nccl-tests. "
    )


def _point_checks(
    p: Point,
    labels: dict[str, Any],
    scope: str,
    where: str,
    floor: Limit | None,
    ceiling: Limit | None,
    latency_gated: bool = True,
) -> list[Check]:
    """busbw of one point (both placements); the time of one call at out-of-place points, against
    ``ceiling`` where ``latency_gated`` (module doc: what latency means)."""
    out = [
        Check(
            f"collectives.{p.collective}.busbw",
            p.busbw_gbs * 1e9,
            "B/s",
            floor[0] if floor else None,
            ">=",
            floor[1] if floor else None,
            scope,
            labels,
            _busbw_spread(p),
            _hint(where, floor),
        )
    ]
    if not p.in_place:
        gated = ceiling if latency_gated else None
        out.append(
            Check(
                f"collectives.{p.collective}.latency",
                p.time_us * 1e-6,
                "s",
                gated[0] if gated else None,
                "<=",
                gated[1] if gated else None,
                scope,
                {k: v for k, v in labels.items() if k != "placement"},
                Spread.of(t * 1e-6 for t in p.repeat_time_us) if p.repeat_time_us else None,
                ("" if latency_gated else _ungated_latency(ceiling)) + _hint(where, ceiling),
            )
        )
    return out


def _summary_checks(
    name: str, points: Sequence[Point], scope: str, common: Mapping[str, Any], where: str
) -> list[Check]:
    """The curve's peak busbw and its busbw at the largest size (out-of-place), for the gate."""
    curve = [p for p in points if not p.in_place]
    if not curve:
        return []
    peak = max(curve, key=lambda p: p.busbw_gbs)
    last = max(curve, key=lambda p: p.size_bytes)
    return [
        Check(
            f"collectives.{name}.busbw_peak", peak.busbw_gbs * 1e9, "B/s", scope=scope, labels=dict(common),
            spread=_busbw_spread(peak), baseline_gate=True,
            hint=f"The highest out-of-place busbw of the sweep, at {human_size(peak.size_bytes)}. {where}",
        ),
        Check(
            f"collectives.{name}.busbw_at_max_size", last.busbw_gbs * 1e9, "B/s", scope=scope,
            labels={"size_bytes": last.size_bytes, **common}, spread=_busbw_spread(last), baseline_gate=True,
            hint=f"Out-of-place busbw at the sweep's largest size, {human_size(last.size_bytes)}. {where}",
        ),
    ]  # fmt: skip


def _wrong_check(
    case: Case, data: CollectiveData, labels: dict[str, Any], nodes: int, origin: str
) -> Check | None:
    """Wrong elements summed over the sweep: every element of every result must be exact."""
    checked = [p for p in data.points if p.wrong is not None]
    if not checked:
        return None
    bad = [p for p in checked if p.wrong]
    detail = "; ".join(
        f"{human_size(p.size_bytes)} {p.placement.replace('_', '-')}: {p.wrong}"
        + _wrong_ranks(data.wrong_by_rank.get((p.size_bytes, p.in_place)), data.hosts)
        for p in bad[:5]
    )
    return Check(
        f"collectives.{case.collective}.wrong",
        float(sum(int(p.wrong or 0) for p in checked)),
        "elements",
        0.0,
        "==",
        None,
        case.scope,
        labels,
        hint=(
            f"{case.collective} on {nodes} node(s), scope {case.scope}, returned wrong data: {detail}"
            f"{' ...' if len(bad) > 5 else ''}. nccl-tests -c: every element of every result must be exact. "
            f"Numbers from {origin}"
        ),
    )


def collective_checks(
    case: Case,
    data: CollectiveData,
    *,
    profile: str,
    nodes: int,
    dtype: str,
    origin: str,
    tool: str | None = None,
    partial: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[Check]:
    """What to record and judge for one case: busbw of every point (both placements), the time
    of every out-of-place point as ``latency``, the wrong elements summed over the sweep, and the
    curve's two summaries for the regression gate.

    The profile's checks set the thresholds of the points at their sizes (out-of-place, as
    nccl-tests numbers are usually quoted); every other value is recorded as information.
    ``max_latency`` is gated on nccl-tests' output and on the CPU sweep only (module doc).
    ``origin`` says where the numbers come from (job directory, command line) for the hints;
    ``tool`` labels values from somewhere other than our own sweep (``"nccl-tests"``). ``env``
    is the NCCL environment the job ran with: its ``NCCL_ALGO`` becomes the ``nccl_algo`` label
    (a forced algorithm is a different series for the baseline), and a floor whose ``algo`` it
    does not allow says so.
    ``partial``: ``data`` holds some sizes only (the gate's re-measurement of a few points): the
    profile's checks at other sizes are left out, and so are the curve's summaries.
    """
    name, scope, points = case.collective, case.scope, data.points
    if not points:
        raise JobFailed(f"the sweep of {name} ({scope}) returned no points; {origin}")
    nranks = points[0].nranks
    if partial:
        case = _only_measured(case, points, nranks, dtype)
    floor, ceiling = _limits(case, nranks, dtype, profile, env, nodes)
    latency_gated = tool is not None or data.timer not in UNGATED_LATENCY_TIMERS
    missing = sorted((set(floor) | set(ceiling)) - {p.size_bytes for p in points if not p.in_place})
    if missing:
        raise JobFailed(
            f"{name} ({scope}): no measurement at the checked size(s) {', '.join(map(human_size, missing))}; {origin}"
        )
    ranks_per_node = nranks // nodes if nodes and nranks else nranks
    common: dict[str, Any] = {"collective": name, "dtype": dtype, "nodes": nodes} | (
        {"tool": tool} if tool else {}
    )
    if env and env.get("NCCL_ALGO"):
        common["nccl_algo"] = env["NCCL_ALGO"]
    out: list[Check] = []
    for p in points:
        labels = {"size_bytes": p.size_bytes, "collective": name, "placement": p.placement} | common
        where = (
            f"{name} of {human_size(p.size_bytes)} ({p.placement.replace('_', '-')}, {dtype}) on {nodes} node(s) "
            f"x {ranks_per_node} ranks, scope {scope}: {_who(p, data.hosts)}. Numbers from {origin}"
        )
        gated = not p.in_place
        out += _point_checks(
            p,
            labels,
            scope,
            where,
            floor.get(p.size_bytes) if gated else None,
            ceiling.get(p.size_bytes),
            latency_gated,
        )
    if not partial:
        where = f"{name} ({dtype}) on {nodes} node(s) x {ranks_per_node} ranks, scope {scope}. Numbers from {origin}"
        out += _summary_checks(name, points, scope, common, where)
    wrong = _wrong_check(case, data, common, nodes, origin)
    return out + ([wrong] if wrong is not None else [])


def _only_measured(case: Case, points: Sequence[Point], nranks: int, dtype: str) -> Case:
    """``case`` with only the profile checks whose size ``points`` hold."""
    elt = DTYPE_SIZES.get(dtype, 4)
    sizes = {p.size_bytes for p in points if not p.in_place}
    kept = tuple(
        (i, c)
        for i, c in case.checks
        if layout(case.collective, int(c.size), elt, nranks).size_bytes in sizes
    )
    return replace(case, checks=kept)


def _wrong_ranks(per_rank: Sequence[int] | None, hosts: Sequence[str]) -> str:
    if not per_rank:
        return ""
    bad = [f"rank {r} on {hosts[r] if r < len(hosts) else '?'}: {w}" for r, w in enumerate(per_rank) if w]
    return f" ({', '.join(bad)})" if bad else ""
