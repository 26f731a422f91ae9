"""What the burn-in tests launch (``acceptance/test_burnin.py``), as `harness.Part` s.

- the health job on every node at once: each rank's CPU (and GPU) numbers, NVML readings,
  versions, and every node's intra-node all_reduce (the pairwise localization's first phase);
- a short all_reduce sweep whose per-rank time outside the calls finds late ranks;
- the same sweep with one rank made slow on purpose: the detector's self-test.

The ECC/XID counters and the fabric ports (``FABRIC``, one rank per node) are read with plain
launches: they bracket the run, first and last, and must not be shared or reordered. So is
``dcgmi diag`` (``DCGM``, one rank per node): it loads the GPUs for minutes and must not overlap
other work. The soak's job is ``plans/soak.py``'s. Every job's deadline is
``plans/burnin_deadlines.py``'s: its work plus the rendezvous allowance, shown by the dry run.
Pure: no pytest, no torch.
"""

from __future__ import annotations

from typing import Any

from pytest_gpucluster.harness import Part
from pytest_gpucluster.plans.burnin_deadlines import (
    counters_deadline,
    counters_estimate,
    dcgm_deadline,
    dcgm_estimate,
    fabric_deadline,
    fabric_estimate,
    health_deadline,
    health_estimate,
    pair_deadline,
    pair_estimate,
    straggler_sweep_deadline,
    straggler_sweep_estimate,
)
from pytest_gpucluster.plans.startup import expected_startup_s

__all__ = [
    "DCGM",
    "DCGM_LEVEL_ESTIMATE_S",
    "FABRIC",
    "INJECTED_DELAY_S",
    "STRAGGLER_SWEEP",
    "counters_part",
    "dcgm_options",
    "dcgm_part",
    "fabric_options",
    "fabric_part",
    "health_part",
    "pairwise_parts",
    "straggler_sweep_part",
]

HEALTH = "pytest_gpucluster.workloads.health:health"
COUNTERS = "pytest_gpucluster.workloads.health:counters"
XID_WATCH_MAX_S = 24 * 3600.0
"""The longest a node's session-spanning NVML XID listener lives if no last reading stops it."""


def xid_watch_dir(session_started_at: float) -> str:
    """The node-local folder of the session's XID listener (``workloads/xid_watch.py``): one per
    session, named by its start, so the first and last counters readings find the same one."""
    return f"/tmp/gpucluster-xid-watch-{int(session_started_at * 1000)}"


FABRIC = "pytest_gpucluster.workloads.fabric_probe:node_snapshot"
DCGM = "pytest_gpucluster.workloads.dcgm_diag:diag"
PAIR = "pytest_gpucluster.workloads.health:pair_allreduce"
SWEEP = "pytest_gpucluster.workloads.collectives:sweep"
STRAGGLER_SWEEP = {
    "collective": "all_reduce",
    "min_bytes": "64K",
    "max_bytes": "1M",
    "factor": 4,
    "warmup": 2,
    "iters": 5,
    "repeat": 3,
    "in_place": False,
}
INJECTED_DELAY_S = 0.02
"""The self-test's straggler sleeps this long before each timed call: far above any tolerance."""


def health_part(nodes: int, settings: Any, load_s: float = 5.0, *, backend: str = "nccl") -> Part:
    """The health job on ``nodes`` nodes, each GPU loaded for ``load_s`` (the tier's ``load``, else
    ``burnin.load_duration``), its deadline `burnin_deadlines.health_deadline` (``settings``: the
    session's, for ``--job-timeout`` and ``--rendezvous-timeout``); ``backend`` (the profile's)
    chooses the expected start-up and work of its estimate (`burnin_deadlines.health_estimate`)."""
    deadline = health_deadline(nodes, settings, load_s)
    return Part(
        "burnin-health", HEALTH, {"load_s": load_s}, nodes=nodes, timeout_s=deadline.seconds,
        deadline=deadline.text, estimate_s=health_estimate(load_s, backend, nodes),
        startup_s=expected_startup_s(nodes, backend),
    )  # fmt: skip


def straggler_sweep_part(nodes: int, settings: Any, backend: str, inject_rank: int | None = None) -> Part:
    """The straggler sweep; with ``inject_rank``, that rank sleeps :data:`INJECTED_DELAY_S` before
    every timed call (the self-test). Its deadline: `burnin_deadlines.straggler_sweep_deadline`."""
    name, options = "burnin-straggler-sweep", dict(STRAGGLER_SWEEP)
    if inject_rank is not None:
        name = "burnin-injected-straggler"
        options.update(inject_delay_s=INJECTED_DELAY_S, inject_rank=inject_rank)
    deadline = straggler_sweep_deadline(options, backend, nodes, settings)
    return Part(
        name, SWEEP, options, nodes=nodes, timeout_s=deadline.seconds, deadline=deadline.text,
        estimate_s=straggler_sweep_estimate(options, backend, nodes), startup_s=expected_startup_s(nodes, backend),
    )  # fmt: skip


def fabric_options() -> dict[str, object]:
    """Every port and interface of the node, with the root qdisc's drops (``tc -s -j``)."""
    return {"qdisc": True}


def dcgm_options(level: int, timeout_s: float) -> dict[str, object]:
    """``dcgmi diag -r <level> -j``, given ``timeout_s`` on the node (the job gets a minute more)."""
    return {"level": level, "timeout_s": timeout_s}


# ---------------------------------------------------------------------------------------------
# The jobs burn-in tests launch themselves, as the plan counts them (session.plan.launches)
# ---------------------------------------------------------------------------------------------

DCGM_LEVEL_ESTIMATE_S = {1: 30.0, 2: 120.0, 3: 1800.0, 4: 7200.0}
"""What ``dcgmi diag -r <level>`` takes on a healthy node, at the long end of NVIDIA's figures for
each run level (dcgmi diag reference: level 1 seconds, 2 about 2 minutes, 3 about 15-30 minutes, 4
1-2 hours); the deadline is the level's timeout (``burnin.dcgm``), far beyond."""


def counters_part(nodes: int, settings: Any, *, backend: str = "nccl") -> Part:
    """The ECC/XID counters' reading on every node (test_counters_before and _after each run one)."""
    deadline = counters_deadline(nodes, settings)
    return Part(
        "burnin-counters", COUNTERS, nodes=nodes, timeout_s=deadline.seconds, deadline=deadline.text,
        estimate_s=counters_estimate(backend, nodes), startup_s=expected_startup_s(nodes, backend),
        shareable=False,
    )  # fmt: skip


def fabric_part(nodes: int, settings: Any, *, backend: str = "nccl") -> Part:
    """The fabric ports' reading, one rank per node (test_fabric_before and _after each run one)."""
    deadline = fabric_deadline(nodes, settings)
    return Part(
        "burnin-fabric", FABRIC, fabric_options(), nodes=nodes, nproc_per_node=1, timeout_s=deadline.seconds,
        deadline=deadline.text, estimate_s=fabric_estimate(backend, nodes),
        startup_s=expected_startup_s(nodes, backend), shareable=False,
    )  # fmt: skip


def dcgm_part(level: int, diag_timeout_s: float, nodes: int, settings: Any, *, backend: str = "nccl") -> Part:
    """``dcgmi diag -r <level>`` on every node: estimated from the level (:data:`DCGM_LEVEL_ESTIMATE_S`)."""
    deadline = dcgm_deadline(diag_timeout_s, nodes, settings)
    return Part(
        "burnin-dcgm", DCGM, dcgm_options(level, diag_timeout_s), nodes=nodes, nproc_per_node=1,
        timeout_s=deadline.seconds, deadline=deadline.text,
        estimate_s=dcgm_estimate(DCGM_LEVEL_ESTIMATE_S[level], backend, nodes),
        startup_s=expected_startup_s(nodes, backend), shareable=False,
    )  # fmt: skip


def pairwise_parts(nodes: int, size_bytes: int, iters: int, backend: str, settings: Any) -> list[Part]:
    """The pairwise localization's pair jobs: about n/2 + 2 of them (disjoint pairs, then each node
    of a failing pair against a good one), one after another."""
    if nodes < 2:
        return []
    deadline = pair_deadline(size_bytes, iters, backend, settings)
    count, estimate = nodes // 2 + 2, pair_estimate(size_bytes, iters, backend)
    part = Part(
        "burnin-pair", PAIR, {"plan_count": count}, nodes=2, timeout_s=deadline.seconds,
        deadline=deadline.text, estimate_s=estimate, startup_s=expected_startup_s(2, backend), shareable=False,
    )  # fmt: skip
    return [part]
