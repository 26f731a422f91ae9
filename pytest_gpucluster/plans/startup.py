"""Start-up, two ideas kept apart: what a job is *expected* to spend before its work begins (the
plan's estimate adds it, so the dry run's total and ``--gpucluster-budget`` say what a run really
takes), and what its deadline *allows* for it (generous, so that a slow container start or a cold
shared filesystem is not killed as a hang).

Expected start-up (:func:`expected_startup_s`), from the launch of the job to its first part's work:
the launcher (torchrun's agent, srun, mpirun), Python and ``import torch`` on every rank, the
rendezvous, the process group (gloo, or NCCL's communicator and the CUDA context), and the exit.

- gloo on this machine (:data:`LOCAL_STARTUP_S`): unloaded, ``import torch`` takes 1.3-1.5 s and a
  2-rank ``torchrun --standalone`` gloo init + barrier + destroy 2.7-2.9 s (FEASIBILITY.md section
  6); on the 2-core VM shared with three other sessions (load average 4-5),
  ``benchmarks/launch_overhead.py``'s no-op job through ``cluster.run`` (2 ranks: import torch,
  join the gloo group, leave) took 8.8-11.9 s (4 rounds); in real acceptance runs a job's time
  beyond its parts' own (results.json ``actual_s`` less each part's rank-0 ``seconds``) was
  2.5-3.3 s for one-rank jobs and 8.3-10.6 s for two-rank shared jobs (2026-11-27). 5 s is between.
- NCCL on GPU nodes (:data:`GPU_STARTUP_S` for one node, :data:`GPU_STARTUP_PER_DOUBLING_S` more
  per doubling of the nodes): 8 ranks importing torch (5-10 s from a shared filesystem, more than
  this VM's local disk), one CUDA context each (1-3 s), NCCL's communicator (``Init timings`` in the
  recorded NCCL INFO logs, tests/data/nccl_logs: 0.2-0.9 s on 2 GPUs of one node, 1.0-1.2 s on 16
  ranks over 2 nodes, of which 0.7-0.8 s bootstrap), the rendezvous across nodes (the c10d store
  meets in one round trip per node; NCCL's bootstrap ring grows with the ranks), and the exit.
  Not yet timed on a GPU node by this suite: a calibrated run (`plans.calibration`) replaces the
  figure with the fleet's own.

Start-up allowance, what a deadline grants before the rendezvous allowance
(`plans.deadlines.rendezvous_allowance`) adds what ``--rendezvous-timeout`` grants beyond it;
unchanged figures, so no deadline moved when the estimates did:

- :data:`STARTUP_ALLOWANCE_S` (120 s): burn-in, fabric, NVLink, the NCCL probe, the node probe,
  the collective sweeps and numerics;
- :data:`LONG_STARTUP_ALLOWANCE_S` (180 s, `profiles.estimates`): SFT (a 70B ZeRO-3 model built
  under ``zero.Init`` takes minutes) and the soak;
- :data:`DCGM_STARTUP_ALLOWANCE_S` (60 s): ``dcgmi diag``'s job, which imports no torch.

Pure: no pytest, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pytest_gpucluster.profiles.estimates import STARTUP_ALLOWANCE_S as LONG_STARTUP_ALLOWANCE_S

__all__ = [
    "DCGM_STARTUP_ALLOWANCE_S",
    "GPU_STARTUP_PER_DOUBLING_S",
    "GPU_STARTUP_S",
    "LOCAL_STARTUP_S",
    "LONG_STARTUP_ALLOWANCE_S",
    "STARTUP_ALLOWANCE_S",
    "TRAINING_SETUP_S",
    "expected_startup_s",
    "launch_estimate",
    "sft_startup_s",
]

STARTUP_ALLOWANCE_S = 120.0
"""What the deadline of a burn-in, fabric, NVLink, probe, sweep or numerics job grants its start-up
(before the rendezvous allowance): far beyond the expected seconds, so a slow start is not a hang."""
DCGM_STARTUP_ALLOWANCE_S = 60.0
"""The minute the DCGM job always had beyond the diag's own time."""

LOCAL_STARTUP_S = 5.0
"""Expected start-up of a gloo job on local ranks (cpu-local): 3 s unloaded, 9-12 s on a loaded
2-core VM (see the module docstring)."""
GPU_STARTUP_S = 30.0
"""Expected start-up of an NCCL job on one GPU node (see the module docstring)."""
GPU_STARTUP_PER_DOUBLING_S = 5.0
"""What each doubling of the nodes adds to an NCCL job's expected start-up: the rendezvous and
NCCL's bootstrap grow with the ranks (64 nodes: 30 + 6 x 5 = 60 s)."""
TRAINING_SETUP_S = {"gloo": 10.0, "nccl": 60.0}
"""Expected set-up of an SFT job beyond a plain job's start-up: DeepSpeed and transformers imports
(1.5-1.75 s and 3.5-3.75 s, FEASIBILITY.md section 6), the model built and the engine initialised
(cpu-local's tiny ZeRO-2 case on one rank ran 16 s in all); on GPUs a 7B model's weights and
optimizer states set up in tens of seconds (not yet timed by this suite)."""


def expected_startup_s(nodes: int, backend: str) -> float:
    """What a job on ``nodes`` nodes is expected to spend before its work: :data:`LOCAL_STARTUP_S`
    for gloo (the CPU path), :data:`GPU_STARTUP_S` plus :data:`GPU_STARTUP_PER_DOUBLING_S` per
    doubling of the nodes for NCCL."""
    if backend == "gloo":
        return LOCAL_STARTUP_S
    doublings = math.ceil(math.log2(max(int(nodes), 1)))
    return GPU_STARTUP_S + GPU_STARTUP_PER_DOUBLING_S * doublings


def sft_startup_s(nodes: int, backend: str) -> float:
    """A training job's expected start-up: a plain job's and :data:`TRAINING_SETUP_S`."""
    return expected_startup_s(nodes, backend) + TRAINING_SETUP_S["gloo" if backend == "gloo" else "nccl"]


def launch_estimate(estimates: Iterable[tuple[float | None, float]]) -> float | None:
    """The estimate of one launch holding parts of ``(estimate_s, startup_s)``: their work (each
    estimate less its start-up) plus one start-up, the largest; parts not estimated add nothing
    (the plan names them); None when no part is estimated."""
    known = [(estimate, startup) for estimate, startup in estimates if estimate is not None]
    if not known:
        return None
    return sum(estimate - startup for estimate, startup in known) + max(startup for _, startup in known)
