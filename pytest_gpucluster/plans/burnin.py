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
from pytest_gpucluster.plans.burnin_deadlines import health_deadline, straggler_sweep_deadline

__all__ = [
    "DCGM",
    "FABRIC",
    "INJECTED_DELAY_S",
    "STRAGGLER_SWEEP",
    "dcgm_options",
    "fabric_options",
    "health_part",
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


def health_part(nodes: int, settings: Any, load_s: float = 5.0) -> Part:
    """The health job on ``nodes`` nodes, each GPU loaded for ``load_s`` (``burnin.load_duration``),
    its deadline `burnin_deadlines.health_deadline` (``settings``: the session's, for
    ``--job-timeout`` and ``--rendezvous-timeout``)."""
    deadline = health_deadline(nodes, settings, load_s)
    return Part(
        "burnin-health",
        HEALTH,
        {"load_s": load_s},
        nodes=nodes,
        timeout_s=deadline.seconds,
        deadline=deadline.text,
    )


def straggler_sweep_part(nodes: int, settings: Any, backend: str, inject_rank: int | None = None) -> Part:
    """The straggler sweep; with ``inject_rank``, that rank sleeps :data:`INJECTED_DELAY_S` before
    every timed call (the self-test). Its deadline: `burnin_deadlines.straggler_sweep_deadline`."""
    name, options = "burnin-straggler-sweep", dict(STRAGGLER_SWEEP)
    if inject_rank is not None:
        name = "burnin-injected-straggler"
        options.update(inject_delay_s=INJECTED_DELAY_S, inject_rank=inject_rank)
    deadline = straggler_sweep_deadline(options, backend, nodes, settings)
    return Part(name, SWEEP, options, nodes=nodes, timeout_s=deadline.seconds, deadline=deadline.text)


def fabric_options() -> dict[str, object]:
    """Every port and interface of the node, with the root qdisc's drops (``tc -s -j``)."""
    return {"qdisc": True}


def dcgm_options(level: int, timeout_s: float) -> dict[str, object]:
    """``dcgmi diag -r <level> -j``, given ``timeout_s`` on the node (the job gets a minute more)."""
    return {"level": level, "timeout_s": timeout_s}
