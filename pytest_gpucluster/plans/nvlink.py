"""What the NVLink acceptance tests launch (``acceptance/test_nvlink.py``), as `harness.Part` s.

- the inventory: one rank per node, no process group, reading GPUs, links and ``topo -m``;
- the traffic job: an intra-node all_reduce with the NVLink byte counters read around it;
- the speedup: on a cuda profile the all_reduce sweep twice, as configured and with NVLink
  turned off (:data:`NVLINK_OFF`), each with NCCL's INFO log in its rank logs so that the
  parent can check which transports each side really used (``checks/nvlink_transport.py``);
  on a cpu profile DeepSpeed's shared-memory all_reduce against gloo's, in one job (the CPU
  analogue, so the gate runs in CI);
- the isolation sweeps: NVLink alone inside a node, the network alone across nodes.

Pure: no pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pytest_gpucluster.checks.comparison import size_text
from pytest_gpucluster.harness import Part
from pytest_gpucluster.maths.sweep import sweep_sizes
from pytest_gpucluster.plans.burnin_deadlines import work_deadline
from pytest_gpucluster.profiles.nccl_env import allowed_algorithms
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = [
    "NCCL_LOG",
    "NETWORK_ONLY",
    "NVLINK_OFF",
    "NVLINK_ONLY",
    "inventory_part",
    "isolated_part",
    "nvlink_deadline",
    "shm_vs_gloo_part",
    "speedup_parts",
    "speedup_sizes",
    "sweep_span",
    "traffic_part",
]

INVENTORY = "pytest_gpucluster.workloads.nvlink_probe:inventory"
TRAFFIC = "pytest_gpucluster.workloads.nvlink_probe:traffic"
SWEEP = "pytest_gpucluster.workloads.collectives:sweep"
SHM_VS_GLOO = "pytest_gpucluster.workloads.shm_allreduce:compare"
GPU_TIMEOUT_S = 300.0
"""The fixed timeout the NVLink jobs had: none gets less now (`nvlink_deadline`)."""
SHM_TIMEOUT_S = 300.0  # a cold DeepSpeed shm op build alone takes ~30 s on 2 cores
NVLINK_WORK_S = 120.0
"""Deliberately slow: NVML's link and counter reads, and all_reduce loops of a few sizes (the
speedup's sweeps, 10 calls of 256 MiB for the counters) on one node."""
TRAFFIC_OPTIONS = {"size_bytes": 256 << 20, "iters": 10}
NCCL_LOG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV", "NCCL_DEBUG_FILE": ""}
"""NCCL's INFO log on stdout, which the worker keeps in ``rank-<i>.log``: INIT prints every
channel's transport (``via P2P/CUMEM``, ``via SHM/direct/direct``) and the NVLS set-up, ENV each
setting NCCL read (``NCCL_P2P_DISABLE set by environment to 1``). An empty ``NCCL_DEBUG_FILE``
overrides a user's file pattern: NCCL then writes to stdout (``src/debug.cc``)."""
NVLINK_OFF = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_MNNVL_ENABLE": "0",
    "NCCL_SHM_DISABLE": "0",
}
"""The slow side of the speedup: no GPU-to-GPU traffic over NVLink, through host memory instead.

- ``NCCL_P2P_DISABLE=1`` takes the P2P transport away (NVLink or PCIe); it wins over any
  ``NCCL_P2P_LEVEL`` (``ncclGetLevel`` reads the disable variable first);
- ``NCCL_NVLS_ENABLE=0``: NVLink SHARP does not use the P2P transport, so P2P_DISABLE alone
  leaves it on and the "slow" all_reduce still runs over NVLink (a ratio near 1, a false FAIL);
- ``NCCL_MNNVL_ENABLE=0``: no multi-node NVLink (GB200 NVL72 trays) either;
- ``NCCL_SHM_DISABLE=0``: a profile or user setting of 1 would push the slow side onto the
  network (NET), which measures the NICs, not the absence of NVLink.

``NCCL_CUMEM_ENABLE`` is left alone: it changes how NCCL allocates buffers, not which path
data takes (SHM buffers stay in host memory either way)."""
NVLINK_ONLY = {"NCCL_SHM_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"}
NETWORK_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
"""Every byte over the network: NVLSTree would still reduce inside each node over NVLink."""


def nodes_for(profile: ProfileModel, available_nodes: int) -> int:
    """The profile's node count, as far as the session has nodes."""
    return max(1, min(profile.cluster.nodes, available_nodes))


def nvlink_deadline(nodes: int, settings: Any, minimum_s: float = GPU_TIMEOUT_S) -> dict[str, Any]:
    """``timeout_s`` and ``deadline`` of an NVLink job on ``nodes`` nodes: its work plus the rendezvous
    allowance, as the sweeps and burn-in jobs (`plans.burnin_deadlines.work_deadline`); ``--job-timeout``
    wins. Without ``settings`` (a caller with no session) the fixed :data:`GPU_TIMEOUT_S`."""
    if settings is None:
        return {"timeout_s": minimum_s}
    deadline = work_deadline(
        NVLINK_WORK_S, "NVML reads and short all_reduce loops", minimum_s, nodes, settings
    )
    return {"timeout_s": deadline.seconds, "deadline": deadline.text}


def inventory_part(profile: ProfileModel, available_nodes: int, settings: Any = None) -> Part:
    """Every node's GPUs, links and topology matrix: one rank per node, no process group."""
    nodes = nodes_for(profile, available_nodes)
    return Part(
        name="nvlink-inventory", workload=INVENTORY, nodes=nodes, nproc_per_node=1,
        init_process_group=False, **nvlink_deadline(nodes, settings),
    )  # fmt: skip


def traffic_part(profile: ProfileModel, available_nodes: int, settings: Any = None) -> Part:
    nodes = nodes_for(profile, available_nodes)
    return Part(
        name="nvlink-traffic", workload=TRAFFIC, options=TRAFFIC_OPTIONS, nodes=nodes,
        **nvlink_deadline(nodes, settings),
    )  # fmt: skip


def speedup_sizes(profile: ProfileModel) -> list[int]:
    assert profile.nvlink is not None
    return sorted({int(s) for s in profile.nvlink.speedup_sizes})


def slow_side_env(profile: ProfileModel) -> dict[str, str]:
    """:data:`NVLINK_OFF`, plus ``NCCL_ALGO=Ring`` where the profile's own ``NCCL_ALGO`` leaves
    all_reduce no algorithm once NVLS is off (``NCCL_ALGO=NVLS``: NCCL would fail to run)."""
    env = dict(NVLINK_OFF)
    if not allowed_algorithms({**profile.nccl_env, **env}, "all_reduce", nodes=1):
        env["NCCL_ALGO"] = "Ring"
    return env


def speedup_parts(profile: ProfileModel, settings: Any = None) -> tuple[Part, Part]:
    """(fast, slow) on a GPU node: the all_reduce sweep as configured, and with NVLink off
    (:func:`slow_side_env`); both log NCCL's transports (:data:`NCCL_LOG`)."""
    span, _ = sweep_span(speedup_sizes(profile))
    options = {"collective": "all_reduce", **span, "in_place": False, "repeat": profile.collectives.repeat}
    options |= {"warmup": 5, "iters": 20}
    deadline = nvlink_deadline(1, settings)
    fast = Part("nvlink-speedup-nccl-p2p", SWEEP, options, nodes=1, env=NCCL_LOG, **deadline)
    slow = Part(
        "nvlink-speedup-nvlink-off", SWEEP, options, nodes=1, env={**NCCL_LOG, **slow_side_env(profile)},
        **deadline,
    )  # fmt: skip
    return fast, slow


SHM_REPEATS = 15


def shm_vs_gloo_part(profile: ProfileModel, settings: Any = None) -> Part:
    """The CPU analogue: DeepSpeed's shm all_reduce and gloo's, interleaved repeat by repeat."""
    span, _ = sweep_span(speedup_sizes(profile))
    options = {
        **span,
        "warmup": 3,
        "iters": 10,
        # The shm op spins while it waits for its peer: one preempted span reads 5x off on 2 vCPUs.
        # Cheap spans (10 calls of 1-4 MiB), so many of them: each side's best of 15 is one that ran
        # with nothing in its way (checks/comparison.shm_vs_gloo), on a busy machine too.
        "repeat": max(profile.collectives.repeat, SHM_REPEATS),
        "dtype": "float32",
    }
    return Part(
        "nvlink-speedup-shm", SHM_VS_GLOO, options, nodes=1, **nvlink_deadline(1, settings, SHM_TIMEOUT_S)
    )


def isolated_part(
    profile: ProfileModel, env: Mapping[str, str], nodes: int, name: str, settings: Any = None
) -> Part:
    """One all_reduce size (the largest speedup size), out of place, in an environment that leaves
    one fabric only."""
    size = speedup_sizes(profile)[-1]
    options = {
        "collective": "all_reduce", "min_bytes": size, "max_bytes": size, "in_place": False,
        "repeat": profile.collectives.repeat,
    }  # fmt: skip
    return Part(name, SWEEP, options, nodes=nodes, env=env, **nvlink_deadline(nodes, settings))


def sweep_span(sizes: Iterable[int]) -> tuple[dict[str, int], list[int]]:
    """Sweep options (``min_bytes``, ``max_bytes``, ``factor``) that visit every size in ``sizes``,
    and the sizes that sweep will visit.

    Sizes in a geometric series (16 MiB; 1 MiB and 16 MiB; 1, 4 and 16 MiB) are visited alone;
    others are reached with factor 2 when each is a power-of-two multiple of the smallest.
    """
    wanted = sorted({int(s) for s in sizes})
    if not wanted or wanted[0] <= 0:
        raise ValueError(f"need at least one positive message size, got {wanted}")
    low, high = wanted[0], wanted[-1]
    factor = 2
    if len(wanted) > 1 and wanted[1] % low == 0:
        factor = wanted[1] // low
    visited = sweep_sizes(low, high, factor)
    if not set(wanted) <= set(visited):
        factor = 2
        visited = sweep_sizes(low, high, factor)
    missing = sorted(set(wanted) - set(visited))
    if missing:
        raise ValueError(
            f"message sizes {', '.join(size_text(s) for s in missing)} are not a power-of-two multiple of the "
            f"smallest, {size_text(low)}; a sweep from {size_text(low)} doubling each step cannot reach them"
        )
    return {"min_bytes": low, "max_bytes": high, "factor": factor}, visited
