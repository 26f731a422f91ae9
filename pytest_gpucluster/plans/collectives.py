"""What the collective acceptance tests launch: one ``collectives:sweep_many`` part per test.

The profile's ``-b -e -f`` grid for the case's collective (nccl-tests' semantics), plus a one-size
sweep for every checked size off that grid (a 32 GB check beyond a 16 GiB grid, a 3 MiB one between
points). Every case is its own `Part`; the harness runs the parts of one node count in one job, so
the sweeps of all collectives share a start-up. Pure: no torch, no pytest.

The sweep of a scope runs under that scope's ``collectives.scope_env`` (:func:`job_env`), so an
inter-node floor measured with Tree or NVLSTree is measured with it again (NCCL otherwise picks
Ring or Tree on 2 nodes by its own model). Those entries win over the session's NCCL variables,
the user's included, for that job only; the checks record ``NCCL_ALGO`` as the ``nccl_algo`` label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpucluster.checks.collectives import Case, scope_nodes
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.harness import Part
from pytest_gpucluster.maths.metrics import bus_factor
from pytest_gpucluster.maths.sweep import sweep_sizes
from pytest_gpucluster.plans.deadlines import (
    DEADLINE_MARGIN,
    Deadline,
    explicit_timeout,
    floor_rate,
    rendezvous_allowance,
)
from pytest_gpucluster.plans.startup import STARTUP_ALLOWANCE_S, expected_startup_s
from pytest_gpucluster.profiles.nccl_env import scope_env
from pytest_gpucluster.profiles.schema import ClusterSection, CollectivesSection, ProfileModel, SweepSettings
from pytest_gpucluster.results.model import Check

__all__ = [
    "WORKLOAD",
    "SweepRequest",
    "confirmation_part",
    "estimate_sweep_runtime",
    "expected_busbw",
    "expected_sweep_run",
    "job_env",
    "job_options",
    "job_timeout",
    "sweep_deadline",
    "sweep_part",
    "sweep_requests",
]

WORKLOAD = "pytest_gpucluster.workloads.collectives:sweep_many"
PER_SWEEP_S = 5.0
"""What each sweep of a job adds to its deadline and estimate (its set-up and per-size sync).

A sweep's deadline counts `plans.startup.STARTUP_ALLOWANCE_S` of start-up (the rendezvous
allowance adds what the session's ``--rendezvous-timeout`` grants beyond it); the plan's estimate
the expected start-up (`plans.startup.expected_startup_s`)."""
EXPECTED_PER_SWEEP_S = 1.0
"""What each sweep adds to the plan's estimate: a barrier and the result exchange. Measured on
cpu-local (2 gloo ranks, load average 4-5): the quick tier's all_reduce part, two one-size sweeps,
took 2.05 s in all, about what its 16 MiB calls alone take at its floor."""


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


def sweep_requests(case: Case, settings: SweepSettings, *, checked_only: bool = False) -> list[SweepRequest]:
    """The profile's grid for the case's collective, plus one one-size sweep per checked size
    that the grid does not visit (a 32 GB check beyond a 16 GiB grid, a 3 MiB one between points).
    ``checked_only`` (the quick tier, `plans.tiers`): one one-size sweep per checked size and no
    grid; a case with no check sweeps the grid's largest size, so its bandwidth is still recorded."""
    factor = _factor(settings)
    lo, hi = int(settings.min_bytes), int(settings.max_bytes)
    checked = sorted({int(check.size) for _, check in case.checks})
    if checked_only:
        return [SweepRequest(case.collective, size, size, factor) for size in checked or [hi]]
    grid = set(sweep_sizes(lo, hi, factor))
    requests = [SweepRequest(case.collective, lo, hi, factor)]
    for size in sorted(set(checked) - grid):
        requests.append(SweepRequest(case.collective, size, size, factor))
    return requests


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
    1.2 GB/s), 2 GB/s for NCCL — plus 5 s per sweep and 120 s for start-up. A fabric fallen back
    to sockets still finishes inside it, so its low bandwidth is reported, not a timeout."""
    return _floor_work(requests, settings, repeat, backend)[0]


def _calls(settings: SweepSettings, repeat: int) -> int:
    """Collective calls per size: both placements x (``repeat`` x ``iters`` timed + sync + check),
    plus the warm-up of each placement."""
    return 2 * (repeat * settings.iters + 2) + 2 * settings.warmup


def _floor_work(
    requests: Sequence[SweepRequest], settings: SweepSettings, repeat: int, backend: str
) -> tuple[float, str]:
    """`job_timeout` and its arithmetic, as the dry run shows it."""
    floor = floor_rate(backend)
    calls = _calls(settings, repeat)
    moved = sum(sum(sweep_sizes(r.min_bytes, r.max_bytes, r.factor)) * calls for r in requests)
    total = STARTUP_ALLOWANCE_S + PER_SWEEP_S * len(requests) + moved / floor
    text = (
        f"derived from the work: {moved / 1e9:.4g} GB moved ({calls} calls per size) at a "
        f"{floor / 1e9:g} GB/s floor + {PER_SWEEP_S:g} s x {len(requests)} sweep(s) + "
        f"{STARTUP_ALLOWANCE_S:g} s start-up"
    )
    return total, text


def expected_busbw(case: Case, cluster: ClusterSection) -> tuple[float, str] | None:
    """The bus bandwidth a healthy run of ``case`` reaches at least: the lowest ``min_busbw`` floor
    of its checks, else the link its scope crosses (NVLink per GPU inside a node, the node's NICs
    across nodes); None when the profile names neither."""
    floors = [float(check.min_busbw) for _, check in case.checks if check.min_busbw]
    if floors:
        return min(floors), "its lowest min_busbw floor"
    if case.scope == "intra-node" and cluster.nvlink_bandwidth:
        return float(cluster.nvlink_bandwidth), "cluster.nvlink_bandwidth"
    if case.scope != "intra-node" and cluster.nics_per_node and cluster.nic_line_rate:
        return float(cluster.nics_per_node * cluster.nic_line_rate), "cluster.nics_per_node x nic_line_rate"
    return None


def estimate_sweep_runtime(
    case: Case,
    requests: Sequence[SweepRequest],
    section: CollectivesSection,
    cluster: ClusterSection,
    nranks: int,
) -> tuple[float, str] | str:
    """How long a healthy run of the case's sweeps takes, as its deadline counts it: the work
    (`expected_sweep_run`'s) plus the start-up allowance `job_timeout` counts; or why it cannot be
    said."""
    work = _sweep_work(case, requests, section, cluster, nranks)
    if isinstance(work, str):
        return work
    seconds, text = work
    return seconds + STARTUP_ALLOWANCE_S, f"{text} + {STARTUP_ALLOWANCE_S:g} s start-up"


def expected_sweep_run(
    case: Case,
    requests: Sequence[SweepRequest],
    section: CollectivesSection,
    cluster: ClusterSection,
    *,
    nodes: int,
    ranks_per_node: int,
    backend: str,
) -> float | None:
    """What the plan counts for the case's sweeps: the work at the expected bandwidth plus the
    expected start-up of a job on ``nodes`` nodes (`plans.startup.expected_startup_s`). A case with
    neither a floor of its own nor a link figure is counted at the lowest ``min_busbw`` floor of
    another collective on its scope (bus bandwidth is normalised across collectives, nccl-tests'
    definition: on one link they reach alike); None when its scope has none either."""
    nranks = nodes * ranks_per_node
    work = _sweep_work(case, requests, section, cluster, nranks, EXPECTED_PER_SWEEP_S)
    if isinstance(work, str):
        floor = _scope_floor(case, section)
        if floor is None:
            return None
        work = _sweep_work(case, requests, section, cluster, nranks, EXPECTED_PER_SWEEP_S, floor)
    return work[0] + expected_startup_s(nodes, backend) if not isinstance(work, str) else None


def _scope_floor(case: Case, section: CollectivesSection) -> tuple[float, str] | None:
    """The lowest ``min_busbw`` floor of any collective on the case's scope, and its profile key."""
    floors = [
        (float(c.min_busbw), i) for i, c in enumerate(section.checks) if c.scope == case.scope and c.min_busbw
    ]
    if not floors:
        return None
    value, index = min(floors)
    return value, f"collectives.checks[{index}], {section.checks[index].collective} on the same scope"


def _sweep_work(
    case: Case,
    requests: Sequence[SweepRequest],
    section: CollectivesSection,
    cluster: ClusterSection,
    nranks: int,
    per_sweep_s: float = PER_SWEEP_S,
    busbw_given: tuple[float, str] | None = None,
) -> tuple[float, str] | str:
    """Every call of every size at the expected bus bandwidth (``busbw_given``, else
    `expected_busbw`; time = size x bus factor / busbw, nccl-tests' definition turned round),
    ``repeat`` times, plus ``per_sweep_s`` per sweep (the deadline's :data:`PER_SWEEP_S`, or the
    plan's :data:`EXPECTED_PER_SWEEP_S`); or why not."""
    expected = busbw_given or expected_busbw(case, cluster)
    if expected is None:
        return f"no expected bandwidth for {case.id} (no min_busbw floor, no link figure in cluster:)"
    busbw, where = expected
    calls = _calls(section.sweep, section.repeat)
    factor = bus_factor(case.collective, max(nranks, 1)) or 1.0
    sized = sum(sum(sweep_sizes(r.min_bytes, r.max_bytes, r.factor)) for r in requests)
    seconds = per_sweep_s * len(requests) + sized * calls * factor / busbw
    text = (
        f"{sized / 1e9:.4g} GB of sizes x {calls} calls x bus factor {factor:.3g} at {busbw / 1e9:.4g} GB/s "
        f"({where}) + {per_sweep_s:g} s x {len(requests)} sweep(s)"
    )
    return seconds, text


def sweep_deadline(
    case: Case,
    requests: Sequence[SweepRequest],
    section: CollectivesSection,
    backend: str,
    *,
    nranks: int,
    nodes: int = 1,
    cluster: ClusterSection | None = None,
    settings: Any = None,
) -> Deadline:
    """The deadline of one case's sweeps on ``nodes`` nodes: an explicit ``--job-timeout``
    (``settings``), else the work at the floor rate (`job_timeout`), never below
    :data:`DEADLINE_MARGIN` x the run estimated at the expected bandwidth (`estimate_sweep_runtime`),
    plus the rendezvous allowance (`plans.deadlines.rendezvous_allowance`: what ``settings``'
    ``--rendezvous-timeout`` grants ``nodes`` nodes to start beyond the sweep's own 120 s; none
    without ``settings``)."""
    estimate = estimate_sweep_runtime(case, requests, section, cluster, nranks) if cluster else None
    estimated = estimate[0] if isinstance(estimate, tuple) else None
    override = explicit_timeout(settings) if settings is not None else None
    if override is not None:
        return Deadline(override.seconds, override.why, estimated, _estimate_text(estimate))
    floor_s, why = _floor_work(requests, section.sweep, section.repeat, backend)
    if estimated is not None and floor_s < estimated * DEADLINE_MARGIN:
        floor_s = estimated * DEADLINE_MARGIN
        why = f"{DEADLINE_MARGIN:g} x the estimated run, above the floor-rate deadline"
    if settings is not None:
        allowance, allowance_why = rendezvous_allowance(
            nodes, settings, covered_s=STARTUP_ALLOWANCE_S, covered_by="the sweep's"
        )
        floor_s, why = floor_s + allowance, f"{why} + {allowance_why}"
    return Deadline(floor_s, why, estimated, _estimate_text(estimate))


def _estimate_text(estimate: tuple[float, str] | str | None) -> str:
    if estimate is None:
        return ""
    return estimate[1] if isinstance(estimate, tuple) else f"run time not estimated: {estimate}"


def job_env(profile: ProfileModel, scope: str) -> dict[str, str]:
    """What the sweep job of ``scope`` sets over the session's NCCL environment: the scope's
    ``collectives.scope_env`` entries (``profiles.nccl_env.scope_env`` less what ``nccl_env``,
    already in every job, sets the same)."""
    base = profile.nccl_env
    return {k: v for k, v in scope_env(profile, scope).items() if base.get(k) != v}


def sweep_part(
    case: Case,
    section: CollectivesSection,
    available_nodes: int,
    backend: str,
    env: Mapping[str, str] | None = None,
    *,
    cluster: ClusterSection | None = None,
    ranks_per_node: int | None = None,
    settings: Any = None,
    checked_only: bool = False,
) -> Part | None:
    """The sweeps of one case on the nodes its scope means, under ``env`` (:func:`job_env`); None
    when the scope cannot run here (the test skips with ``scope_nodes``' reason). Its deadline:
    `sweep_deadline` (``cluster`` gives the expected bandwidth, ``settings`` an explicit
    ``--job-timeout``; ``checked_only``: the quick tier's sweep, `sweep_requests`)."""
    nodes, reason = scope_nodes(case.scope, available_nodes, ranks_per_node)
    if reason is not None:
        return None
    requests = sweep_requests(case, section.sweep, checked_only=checked_only)
    deadline = sweep_deadline(
        case, requests, section, backend,
        nranks=nodes * (ranks_per_node or 1), nodes=nodes, cluster=cluster, settings=settings,
    )  # fmt: skip
    estimate = (
        expected_sweep_run(
            case, requests, section, cluster, nodes=nodes, ranks_per_node=ranks_per_node or 1, backend=backend
        )
        if cluster is not None
        else None
    )
    return Part(
        name=f"collectives-{case.id}",
        workload=WORKLOAD,
        options=job_options(requests, section.sweep, section.repeat),
        nodes=nodes,
        env=dict(env or {}),
        timeout_s=deadline.seconds,
        deadline=deadline.text,
        estimate_s=estimate,
        startup_s=expected_startup_s(nodes, backend),
    )


def confirmation_part(
    first: Part, case: Case, section: CollectivesSection, suspects: Sequence[Check]
) -> tuple[Part, bool]:
    """What the regression gate re-measures for ``suspects`` of ``case`` (a new part, run alone):
    only their sizes, one one-size sweep each, unless a suspect summarizes the curve (peak busbw,
    busbw at the largest size), which needs the whole grid again (about twice the largest size's
    time, sizes growing by a factor). Returns the part, and whether it is the whole grid.
    The part is ``first`` (the case's sweep part, with its environment and its deadline: some of
    its sizes take no longer than all of them) with other sweeps."""
    sizes = {int(s.labels["size_bytes"]) for s in suspects if "size_bytes" in s.labels}
    whole = any(s.baseline_gate for s in suspects) or not sizes
    if whole:
        requests = sweep_requests(case, section.sweep)
    else:
        factor = _factor(section.sweep)
        requests = [SweepRequest(case.collective, size, size, factor) for size in sorted(sizes)]
    part = replace(
        first,
        name=f"{first.name}-confirm",
        options=job_options(requests, section.sweep, section.repeat),
    )
    return part, whole
