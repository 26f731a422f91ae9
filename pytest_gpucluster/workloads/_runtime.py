"""What a workload sees on its rank: the `RankContext`, and the job-directory file contract.

This module runs on the far side of a process boundary (inside a rank started by torchrun,
srun, mpirun or the DeepSpeed launcher). It depends on the standard library and, lazily,
torch — never on pytest, profiles, launchers or anything else in this package — so that a
rank starts fast and a broken plugin module cannot break a rank.

The contract with the parent (the launcher side), all inside the job directory:

- ``job.json``           written by the parent: ``{"workload": "pkg.mod:func", "options": {...},
                         "backend": "gloo"|"nccl", "timeout_s": float, "hard_deadline_s": float,
                         "env": {...}}``; past ``hard_deadline_s`` a rank dumps its stack and exits
- ``rank-<i>.json``      written by rank i, atomically: first with ``"status": "running"``, then
                         ``"ok"`` (with ``"value"``), ``"error"`` (with ``"error"``) or ``"skipped"``
- ``rank-<i>.log``       rank i's stdout and stderr, and its stack dump if it hung
- ``progress.log``       rank 0's progress lines, which the parent streams to the terminal
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB_FILE = "job.json"
PROGRESS_FILE = "progress.log"
JOB_ID_ENV = "GPUCLUSTER_JOB_ID"
"""Set in the environment of every process of a job, so the parent can find (and kill) them all."""
SESSION_ENV = "GPUCLUSTER_SESSION"
"""Set beside the job id: ``host:pid:start`` of the pytest session that launched the job, so a
later session can tell a leftover of a dead session from a job of a live one."""
MASTER_FROM_ENV = "GPUCLUSTER_MASTER_ADDR_FROM"
"""Set by the Slurm launcher in tasks mode to ``SLURM_STEP_NODELIST``: each rank takes ``MASTER_ADDR``
from the first node of its step, where Slurm put task 0 (`slurm_step_first_node`), not from the
controller's host list, whose order srun does not keep (it sorts ``--nodelist``)."""


def rank_result_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"rank-{rank}.json"


def rank_log_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"rank-{rank}.log"


def flush_c_stdio() -> None:
    """Flush C stdio buffers: NCCL prints its log with ``fprintf(stdout)``, block-buffered into
    the rank log, and the worker leaves with ``os._exit``, which flushes nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


class WorkloadSkip(Exception):
    """Raised by a workload that cannot run on this rank (e.g. no NVML); the job is skipped."""


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON so that a reader never sees a half-written file (rename is atomic)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, default=jsonable, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def jsonable(obj: Any) -> Any:
    """Turn tensors, numpy scalars, paths and dataclasses into plain JSON values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"a workload returned a {type(obj).__name__}, which is not JSON-serializable")


def slurm_step_first_node(nodelist: str) -> str:
    """The first host of a Slurm nodelist, as Slurm writes ``SLURM_STEP_NODELIST``: the first term
    (commas outside brackets separate terms) with each bracket group at its first number.

    With srun's block distribution task 0 runs on this node. (The full expansion lives in
    ``cluster.nodelist``; a rank imports nothing from the package.)

    >>> slurm_step_first_node("gpu-[07-09,12]-ib,login1")
    'gpu-07-ib'
    >>> slurm_step_first_node("rack[2-3]_blade[4,1]")
    'rack2_blade4'
    """
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    term = nodelist[:end].strip()
    first = re.sub(r"\[\s*([0-9]+)[^\]]*\]", r"\1", term)
    if not first or "[" in first or "]" in first:
        raise ValueError(f"SLURM_STEP_NODELIST={nodelist!r} does not start with a host name Slurm writes")
    return first


@dataclass(frozen=True)
class RankIdentity:
    """Where this process sits in the job, read from whichever launcher started it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str

    @staticmethod
    def from_environ(environ: dict[str, str] | None = None) -> RankIdentity:
        """The identity the launcher gave this process; always a `RankIdentity` (a `RankContext`
        also needs what only the worker knows)."""
        env = dict(os.environ if environ is None else environ)
        host = socket.gethostname()
        if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, DeepSpeed launcher
            local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("LOCAL_SIZE", "1")))
            rank = int(env["RANK"])
            return RankIdentity(
                rank=rank,
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                local_world_size=local_world,
                node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", rank // max(local_world, 1)))),
                host=host,
            )
        if "OMPI_COMM_WORLD_RANK" in env:  # Open MPI
            local_world = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
            rank = int(env["OMPI_COMM_WORLD_RANK"])
            return RankIdentity(
                rank=rank,
                world_size=int(env["OMPI_COMM_WORLD_SIZE"]),
                local_rank=int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")),
                local_world_size=local_world,
                # OMPI_COMM_WORLD_NODE_RANK counts processes on the node, not nodes: derive it.
                node_rank=rank // max(local_world, 1),
                host=host,
            )
        if "SLURM_PROCID" in env:  # srun, one task per rank
            ntasks = int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")))
            nnodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
            local_world = max(ntasks // max(nnodes, 1), 1)
            return RankIdentity(
                rank=int(env["SLURM_PROCID"]),
                world_size=ntasks,
                local_rank=int(env.get("SLURM_LOCALID", "0")),
                local_world_size=local_world,
                node_rank=int(env.get("SLURM_NODEID", "0")),
                host=host,
            )
        return RankIdentity(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, host=host)

    def export(self) -> None:
        """Publish the torch.distributed variables, whichever launcher gave us the identity (and,
        under Slurm's tasks mode, ``MASTER_ADDR``: the first node of the step, `MASTER_FROM_ENV`)."""
        if os.environ.get(MASTER_FROM_ENV) == "SLURM_STEP_NODELIST" and os.environ.get("SLURM_STEP_NODELIST"):
            os.environ["MASTER_ADDR"] = slurm_step_first_node(os.environ["SLURM_STEP_NODELIST"])
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(self.world_size)
        os.environ["LOCAL_RANK"] = str(self.local_rank)
        os.environ["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        # DeepSpeed's CPU shared-memory op segfaults under torchrun unless LOCAL_SIZE is set.
        os.environ.setdefault("LOCAL_SIZE", str(self.local_world_size))


@dataclass(frozen=True)
class RankContext(RankIdentity):
    """Everything a workload function ``(ctx) -> dict`` needs to know about its rank: where it
    sits in the job (the `RankIdentity` fields, first and in their order), then what the worker
    adds."""

    device: str
    """``"cpu"`` or ``"cuda:<i>"``, ``i = local_rank % visible devices`` (one per rank where the site
    binds one GPU per task); ``rank-<r>.json`` records the GPU's UUID under ``"gpu"``."""
    backend: str
    """The process group's backend: ``"gloo"`` or ``"nccl"``."""
    job_dir: Path
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def nnodes(self) -> int:
        return max(self.world_size // max(self.local_world_size, 1), 1)

    def progress(self, message: str) -> None:
        """Rank 0's progress line (step, s/it, ETA...), streamed to the terminal by the parent."""
        print(message, flush=True)
        if self.rank != 0:
            return
        stamp = time.strftime("%H:%M:%S")
        with open(self.job_dir / PROGRESS_FILE, "a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {message}\n")

    def synchronize(self) -> None:
        """Wait for queued device work, so a host timer measures the work itself."""
        if self.is_cuda:
            import torch

            torch.cuda.synchronize()

    def barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
