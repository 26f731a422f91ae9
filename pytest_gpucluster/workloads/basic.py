"""Small workloads used by the launcher's own tests and by smoke checks."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip


def noop(ctx: RankContext) -> dict[str, Any]:
    return {"rank": ctx.rank}


def all_reduce_sum(ctx: RankContext) -> dict[str, Any]:
    """Each rank contributes rank+1; every rank must see the sum 1+2+...+world_size."""
    import torch
    import torch.distributed as dist

    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(tensor)
    ctx.progress(f"all_reduce_sum: {ctx.world_size} ranks, sum {float(tensor[0].item()):g}")
    return {
        "sum": float(tensor[0].item()),
        "expected": ctx.world_size * (ctx.world_size + 1) / 2,
        "host": ctx.host,
    }


def fail_on_rank(ctx: RankContext) -> dict[str, Any]:
    if ctx.rank == int(ctx.options.get("rank", 1)):
        raise RuntimeError(f"injected failure on rank {ctx.rank}")
    return {"rank": ctx.rank}


HANGS_NOW = "hangs now"


def hang_on_rank(ctx: RankContext) -> dict[str, Any]:
    """Rank ``rank`` hangs in this function; it says so first (``HANGS_NOW``, in its log), so a
    test can wait for the hang itself rather than for a rank merely running."""
    if ctx.rank == int(ctx.options.get("rank", 1)):
        ctx.progress(f"hang_on_rank: rank {ctx.rank} {HANGS_NOW}")
        while True:
            time.sleep(1)
    return {"rank": ctx.rank}


def skip_everywhere(ctx: RankContext) -> dict[str, Any]:
    """Every rank skips, as a GPU workload does on a node without CUDA."""
    raise WorkloadSkip(str(ctx.options.get("reason", "skipped on purpose")))


def hold_memory(ctx: RankContext) -> dict[str, Any]:
    """Touch ``mib`` MiB, let it go, and report this process's peak resident set (for the bundle's
    per-part peak reset)."""
    from pytest_gpucluster.workloads._rank_stats import peak_rss_bytes

    block = bytearray(int(ctx.options.get("mib", 0)) << 20)
    block[::4096] = b"\x01" * len(block[::4096])
    del block
    return {"rank": ctx.rank, "peak_rss_bytes": peak_rss_bytes()}


def hang_leaving_a_helper(ctx: RankContext) -> dict[str, Any]:
    """Rank ``rank`` starts a helper in a session of its own, as a careless workload's server
    would, then hangs. The helper carries the job id but no parent-death signal: it outlives
    the rank unless the job is reaped by job id."""
    if ctx.rank == int(ctx.options.get("rank", 1)):
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        ctx.progress(f"hang_leaving_a_helper: rank {ctx.rank} {HANGS_NOW}")
        while True:
            time.sleep(1)
    return {"rank": ctx.rank}
