"""What the burn-in tests launch (``acceptance/test_burnin.py``), as `harness.Part` s.

- the health job on every node at once: each rank's CPU (and GPU) numbers, NVML readings,
  versions, and every node's intra-node all_reduce (the pairwise localization's first phase);
- a short all_reduce sweep whose per-rank time outside the calls finds late ranks;
- the same sweep with one rank made slow on purpose: the detector's self-test.

The ECC/XID counters are read with plain launches: they bracket the run, first and last, and
must not be shared or reordered. Pure: no pytest, no torch.
"""

from __future__ import annotations

from pytest_gpucluster.harness import Part

__all__ = ["INJECTED_DELAY_S", "STRAGGLER_SWEEP", "health_part", "straggler_sweep_part"]

HEALTH = "pytest_gpucluster.workloads.health:health"
COUNTERS = "pytest_gpucluster.workloads.health:counters"
SWEEP = "pytest_gpucluster.workloads.collectives:sweep"
JOB_TIMEOUT_S = 600.0
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


def health_part(nodes: int) -> Part:
    return Part("burnin-health", HEALTH, nodes=nodes, timeout_s=JOB_TIMEOUT_S)


def straggler_sweep_part(nodes: int, inject_rank: int | None = None) -> Part:
    """The straggler sweep; with ``inject_rank``, that rank sleeps :data:`INJECTED_DELAY_S` before
    every timed call (the self-test)."""
    if inject_rank is None:
        return Part("burnin-straggler-sweep", SWEEP, STRAGGLER_SWEEP, nodes=nodes, timeout_s=JOB_TIMEOUT_S)
    options = {**STRAGGLER_SWEEP, "inject_delay_s": INJECTED_DELAY_S, "inject_rank": inject_rank}
    return Part("burnin-injected-straggler", SWEEP, options, nodes=nodes, timeout_s=JOB_TIMEOUT_S)
