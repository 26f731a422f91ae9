"""Small workloads used by the launcher's own tests and by smoke checks."""

from __future__ import annotations

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


def hang_on_rank(ctx: RankContext) -> dict[str, Any]:
    if ctx.rank == int(ctx.options.get("rank", 1)):
        while True:
            time.sleep(1)
    return {"rank": ctx.rank}


def skip_everywhere(ctx: RankContext) -> dict[str, Any]:
    """Every rank skips, as a GPU workload does on a node without CUDA."""
    raise WorkloadSkip(str(ctx.options.get("reason", "skipped on purpose")))
