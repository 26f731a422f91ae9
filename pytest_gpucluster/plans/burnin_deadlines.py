"""How long each burn-in and fabric job may run: its work plus the rendezvous allowance.

These jobs had fixed numbers (600 s, the fabric probe 120 s). A 64-node site whose containers
take minutes to start had its healthy probes killed before their ranks had met, and the straggler
sweep's 600 s had no relation to its sizes. A job on ``nodes`` nodes now gets, in order:

1. ``--job-timeout`` set explicitly (`plans.deadlines.explicit_timeout`): the user's word;
2. its work plus the start-up allowance (`plans.startup.STARTUP_ALLOWANCE_S`), at least the fixed figure it had (so no job is shorter on one
   node than before), plus the rendezvous allowance (`plans.deadlines.rendezvous_allowance`: what
   ``--rendezvous-timeout`` grants ``nodes`` nodes to start beyond those 120 s).

The work: the straggler sweep and the pair test from the bytes they move at the sweeps' floor rate
(`plans.deadlines.floor_rate`), the health, counters and fabric probes a fixed, deliberately slow
estimate; ``dcgmi diag`` its own time (the profile's ``burnin.dcgm``) plus a minute, as before.
Each is a `plans.deadlines.Deadline` whose ``why`` ``--gpucluster-dry-run`` prints.

The plan's estimates (``*_estimate``) are another matter: the work a healthy run is expected to do
(``*_EXPECTED_WORK_S``, not the deliberately slow figures above) plus the expected start-up of the
job (`plans.startup.expected_startup_s`), so that the dry run's total says what a run takes.
Pure: no pytest, no torch; imports only ``plans.deadlines``, ``plans.startup`` and ``maths.sweep``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_gpucluster.maths.sweep import parse_size, sweep_sizes
from pytest_gpucluster.plans.deadlines import Deadline, explicit_timeout, floor_rate, rendezvous_allowance
from pytest_gpucluster.plans.startup import DCGM_STARTUP_ALLOWANCE_S, STARTUP_ALLOWANCE_S, expected_startup_s
from pytest_gpucluster.profiles.findings import seconds

__all__ = [
    "COUNTERS_EXPECTED_WORK_S",
    "COUNTERS_WORK_S",
    "FABRIC_EXPECTED_WORK_S",
    "FABRIC_MINIMUM_S",
    "FABRIC_WORK_S",
    "HEALTH_EXPECTED_WORK_S",
    "HEALTH_WORK_S",
    "JOB_MINIMUM_S",
    "counters_deadline",
    "counters_estimate",
    "dcgm_deadline",
    "dcgm_estimate",
    "fabric_deadline",
    "fabric_estimate",
    "health_deadline",
    "health_estimate",
    "pair_deadline",
    "pair_estimate",
    "straggler_sweep_deadline",
    "straggler_sweep_estimate",
    "work_deadline",
]

JOB_MINIMUM_S = 600.0
"""The fixed timeout the health, counters, straggler and pair jobs had: none gets less on one node."""
FABRIC_MINIMUM_S = 120.0
"""The fixed timeout the fabric probe had."""
HEALTH_WORK_S = 240.0
"""Deliberately generous: each rank's CPU and GPU matmul, memory and host-to-device bandwidth with
NVML sampled under that load, and the intra-node all_reduce are short timed loops; the 600 s minimum
holds on one node anyway, so this figure only shows in the dry run's why."""
COUNTERS_WORK_S = 60.0
"""Reading the NVML ECC/retired-page/remapped-row counters and the kernel log's XID lines."""
FABRIC_WORK_S = 30.0
"""One rank per node reading sysfs ports and interfaces and ``tc -s -j qdisc``: seconds."""

HEALTH_EXPECTED_WORK_S = {"gloo": 3.0, "nccl": 15.0}
"""What the health job's measurements are expected to take beyond the GPU load: on the CPU path
1.5 s measured (the quick tier's shared job, 2 ranks at load average 5: its first part ended 1.5 s
after it began); on GPUs the CPU numbers, each GPU's matmul, memory and host-to-device timings and
the intra-node all_reduce are short timed loops too (not yet timed by this suite)."""
COUNTERS_EXPECTED_WORK_S = 5.0
"""Reading NVML's counters and the kernel log: a second or two per node, rounded up."""
FABRIC_EXPECTED_WORK_S = 1.0
"""Reading sysfs and one ``tc`` per interface: the whole cpu-local fabric job, start-up included,
took 3.5-4.8 s under load."""


def health_estimate(load_s: float = 5.0, backend: str = "nccl", nodes: int = 1) -> float:
    """The health job's expected run on ``nodes`` nodes: its measurements
    (:data:`HEALTH_EXPECTED_WORK_S`), each GPU's load (``load_s``; none on the CPU path, which has no
    GPU to load) and the job's expected start-up; what the dry run adds up."""
    load = 0.0 if backend == "gloo" else load_s
    return HEALTH_EXPECTED_WORK_S[_kind(backend)] + load + expected_startup_s(nodes, backend)


def counters_estimate(backend: str = "nccl", nodes: int = 1) -> float:
    """The ECC/XID counters' reading, expected: :data:`COUNTERS_EXPECTED_WORK_S` plus the start-up."""
    return COUNTERS_EXPECTED_WORK_S + expected_startup_s(nodes, backend)


def fabric_estimate(backend: str = "nccl", nodes: int = 1) -> float:
    """The fabric ports' reading, expected: :data:`FABRIC_EXPECTED_WORK_S` plus the start-up."""
    return FABRIC_EXPECTED_WORK_S + expected_startup_s(nodes, backend)


def dcgm_estimate(diag_s: float, backend: str = "nccl", nodes: int = 1) -> float:
    """``dcgmi diag``'s expected run: ``diag_s`` (its level's, `plans.burnin.DCGM_LEVEL_ESTIMATE_S`)
    plus the start-up; on the CPU path no diag runs (no GPU, no ``dcgmi``: the test skips after the
    job finds none), so the start-up alone."""
    return (0.0 if backend == "gloo" else diag_s) + expected_startup_s(nodes, backend)


def _kind(backend: str) -> str:
    return "gloo" if backend == "gloo" else "nccl"


def health_deadline(nodes: int, settings: Any, load_s: float = 5.0) -> Deadline:
    """The health job on every node at once (``workloads.health:health``), its GPU load
    ``load_s`` (``burnin.load_duration``) on top of the measurements' estimate."""
    how = "the health measurements' estimate" + (f" + the {seconds(load_s)} GPU load" if load_s > 5.0 else "")
    return work_deadline(HEALTH_WORK_S + max(load_s - 5.0, 0.0), how, JOB_MINIMUM_S, nodes, settings)


def counters_deadline(nodes: int, settings: Any) -> Deadline:
    """The ECC/XID counters' reading on every node (``workloads.health:counters``)."""
    return work_deadline(COUNTERS_WORK_S, "reading the ECC/XID counters", JOB_MINIMUM_S, nodes, settings)


def fabric_deadline(nodes: int, settings: Any) -> Deadline:
    """The fabric ports' reading, one rank per node (``workloads.fabric_probe:node_snapshot``)."""
    return work_deadline(FABRIC_WORK_S, "reading the ports and qdiscs", FABRIC_MINIMUM_S, nodes, settings)


def straggler_sweep_estimate(options: Mapping[str, Any], backend: str, nodes: int = 1) -> float:
    """The straggler sweep's work at the floor rate (a bound: the floor is slow, but the sweep's
    bytes are few) plus the expected start-up."""
    return _sweep_work(options, backend)[0] + expected_startup_s(nodes, backend)


def _sweep_work(options: Mapping[str, Any], backend: str) -> tuple[float, str]:
    sizes = sweep_sizes(
        parse_size(options["min_bytes"]), parse_size(options["max_bytes"]), int(options.get("factor", 2))
    )
    placements = 2 if options.get("in_place", True) else 1
    timed = placements * int(options.get("repeat", 1)) * int(options["iters"])
    calls = timed + 2 * placements + 2 * int(options.get("warmup", 0))  # + sync and check, warm-up
    rate = floor_rate(backend)
    delay = float(options.get("inject_delay_s", 0.0)) * timed * len(sizes)
    work = sum(sizes) * calls / rate + delay
    how = f"{sum(sizes) * calls / 1e9:.4g} GB moved ({calls} calls per size) at a {rate / 1e9:g} GB/s floor"
    if delay:
        how += f" + {delay:g} s of injected delay"
    return work, how


def straggler_sweep_deadline(options: Mapping[str, Any], backend: str, nodes: int, settings: Any) -> Deadline:
    """The straggler sweep (``workloads.collectives:sweep`` with ``options``, as
    ``plans.burnin.STRAGGLER_SWEEP``): every call of every size at the floor rate, and the sleep
    of an injected straggler (``inject_delay_s``) before each timed call."""
    work, how = _sweep_work(options, backend)
    return work_deadline(work, how, JOB_MINIMUM_S, nodes, settings)


def pair_estimate(size_bytes: int, iters: int, backend: str, warmup: int = 2) -> float:
    """One pair job's estimate: its bytes at the floor rate (a bound) plus the expected start-up of
    a 2-node job."""
    return int(size_bytes) * (int(iters) + int(warmup)) / floor_rate(backend) + expected_startup_s(2, backend)


def pair_deadline(size_bytes: int, iters: int, backend: str, settings: Any, warmup: int = 2) -> Deadline:
    """One pairwise localization job (``workloads.health:pair_allreduce``) on its 2 nodes."""
    rate = floor_rate(backend)
    moved = int(size_bytes) * (int(iters) + int(warmup))
    how = f"{moved / 1e9:.4g} GB moved ({iters} + {warmup} all_reduce calls) at a {rate / 1e9:g} GB/s floor"
    return work_deadline(moved / rate, how, JOB_MINIMUM_S, 2, settings)


def dcgm_deadline(diag_timeout_s: float, nodes: int, settings: Any) -> Deadline:
    """``dcgmi diag``: its own time on the node (``burnin.dcgm``'s timeout, or its level's default)
    plus `plans.startup.DCGM_STARTUP_ALLOWANCE_S`, plus the allowance beyond that minute. An explicit
    ``--job-timeout`` below the diag's own time is kept but flagged."""
    override = explicit_timeout(settings)
    diag = f"the diag's own {seconds(diag_timeout_s)} (burnin.dcgm)"
    if override is not None:
        return Deadline(override.seconds, override.why, diag_timeout_s, diag)
    allowance, allowance_why = rendezvous_allowance(
        nodes, settings, covered_s=DCGM_STARTUP_ALLOWANCE_S, covered_by="the job's"
    )
    total = diag_timeout_s + DCGM_STARTUP_ALLOWANCE_S + allowance
    why = f"derived: {diag} + {DCGM_STARTUP_ALLOWANCE_S:g} s start-up + {allowance_why}"
    return Deadline(total, why, diag_timeout_s, "")


def work_deadline(work_s: float, how: str, minimum_s: float, nodes: int, settings: Any) -> Deadline:
    """``--job-timeout`` when set, else ``max(work_s + STARTUP_ALLOWANCE_S, minimum_s)`` plus the rendezvous
    allowance for ``nodes`` nodes: a job of a fixed amount of work (burn-in, fabric, NVLink, the NCCL
    probe)."""
    override = explicit_timeout(settings)
    if override is not None:
        return override
    base = work_s + STARTUP_ALLOWANCE_S
    allowance, allowance_why = rendezvous_allowance(
        nodes, settings, covered_s=STARTUP_ALLOWANCE_S, covered_by="the job's"
    )
    work = f"the work {seconds(work_s)} ({how}) + {STARTUP_ALLOWANCE_S:g} s start-up"
    if base < minimum_s:
        work += f", at least the {seconds(minimum_s)} it had as a fixed timeout"
    return Deadline(max(base, minimum_s) + allowance, f"derived: {work} + {allowance_why}")
