"""Rank side of the NCCL check: start NCCL with its INFO log on, run a few collectives, name the log.

``probe(ctx)`` runs on every rank (workload ``pytest_gpucluster.workloads.nccl_probe:probe``, launched
with ``init_process_group=False``): it points ``NCCL_DEBUG_FILE`` at ``nccl-rank-<i>.log`` in the job
directory *before* NCCL reads its environment, joins the process group on the nccl backend, runs an
all_reduce big enough to need the network between nodes plus an all_gather and a barrier, and
returns where its log is. The parent parses those logs (``parsers/nccl_log.py``); nothing is parsed
here.

Like the rest of ``workloads/``, this depends on the standard library and torch only. It raises
:class:`WorkloadSkip` where there is no CUDA device or no NCCL in this torch build.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import os
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip, rank_log_path

__all__ = ["DEBUG_ENV", "log_name", "probe"]

DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}
"""What NCCL needs to say which network, plugin, provider and transports it chose."""

_ELEMENTS = 1 << 22  # 16 MiB of float32: large enough that NCCL connects its network channels


def log_name(rank: int) -> str:
    return f"nccl-rank-{rank}.log"


def _why_not(ctx: RankContext) -> str | None:
    if ctx.backend != "nccl":
        return f"the job's backend is {ctx.backend}, not nccl (cluster.backend in the profile)"
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA device on {ctx.host} (torch {torch.__version__})"
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        return f"this torch build ({torch.__version__}) has no NCCL backend"
    return None


def _flush_c_stdio() -> None:
    """NCCL prints with C stdio; the worker leaves with os._exit, which flushes nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def probe(ctx: RankContext) -> dict[str, Any]:
    """Initialise NCCL with its debug log in the job directory; return the log's path and NCCL's version."""
    reason = _why_not(ctx)
    if reason is not None:
        raise WorkloadSkip(f"NCCL probe: {reason}")
    # Set here, not only by the parent: a user's NCCL_DEBUG=WARN or NCCL_DEBUG_FILE=/tmp/%h.%p would
    # leave the parent with nothing to read. NCCL reads them once, at its first call, which is below.
    os.environ.update(DEBUG_ENV)
    os.environ["NCCL_DEBUG_FILE"] = str(Path(ctx.job_dir) / log_name(ctx.rank))

    import torch
    import torch.distributed as dist

    device = torch.device(ctx.device)
    timeout = _dt.timedelta(seconds=float(ctx.options.get("timeout_s", 300)))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl", timeout=timeout, device_id=device)
    tensor = torch.full((_ELEMENTS,), float(ctx.rank + 1), device=device)
    dist.all_reduce(tensor)
    gathered = torch.empty(ctx.world_size * 1024, device=device)
    dist.all_gather_into_tensor(gathered, tensor[:1024])
    dist.barrier()
    torch.cuda.synchronize(device)
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    total = float(tensor[0].item())
    if total != expected:
        raise RuntimeError(
            f"NCCL probe: all_reduce of rank+1 over {ctx.world_size} ranks gave {total:g} on rank {ctx.rank} "
            f"({ctx.host}), expected {expected:g}: NCCL returned wrong data"
        )
    version = torch.cuda.nccl.version()
    _flush_c_stdio()
    # A process group started before this workload (init_process_group=True) logged to stdout, which
    # the worker keeps in rank-<i>.log.
    where = Path(os.environ["NCCL_DEBUG_FILE"])
    return {
        "host": ctx.host,
        "nccl_log": str(where if where.exists() else rank_log_path(Path(ctx.job_dir), ctx.rank)),
        "nccl_version": ".".join(str(p) for p in version) if isinstance(version, tuple) else str(version),
    }
