"""Rank-side workloads for test_slurm_nodes.py (standard library, torch and the package's rank side
only: the ranks import this module by name through PYTHONPATH)."""

from __future__ import annotations

import os
from typing import Any

from pytest_gpucluster.workloads import xid_watch
from pytest_gpucluster.workloads._runtime import RankContext


def all_reduce_master(ctx: RankContext) -> dict[str, Any]:
    """An all_reduce over the job (its process group met at MASTER_ADDR), and that address."""
    import torch
    import torch.distributed as dist

    tensor = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(tensor)
    return {
        "host": ctx.host,
        "sum": float(tensor[0].item()),
        "master": os.environ.get("MASTER_ADDR"),
        "step_nodelist": os.environ.get("SLURM_STEP_NODELIST"),
    }


def held(ctx: RankContext) -> dict[str, Any]:
    """The first reading's check under Slurm: is the controller's listener step listening here?"""
    ok, why = xid_watch.held(ctx.options["dir"])
    return {"host": ctx.host, "listening": ok, "why": why}


def start_detached(ctx: RankContext) -> dict[str, Any]:
    """What the first reading did before: start the listener detached inside this job's step."""
    ok, why = xid_watch.start(ctx.options["dir"], 300.0)
    pid = (xid_watch.node_folder(ctx.options["dir"]) / "pid").read_text().strip() if ok else ""
    return {"host": ctx.host, "started": ok, "why": why, "pid": int(pid or 0)}


def collect(ctx: RankContext) -> dict[str, Any]:
    """The last reading: every XID the listener saw on this node, and the listener stopped."""
    events, why = xid_watch.collect(ctx.options["dir"])
    return {"host": ctx.host, "events": events, "why": why}
