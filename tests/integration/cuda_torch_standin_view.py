"""The node probe's view of a CUDA torch, for recorded nodes (no CUDA build of torch here): torch
can use the GPUs the recorded ``nvidia-smi`` lists, as many as ``CUDA_VISIBLE_DEVICES`` lets it see
(``torch.cuda.device_count()`` in the rank's environment), with its NCCL backend
(``GPUCLUSTER_STANDIN_NCCL``, default 2.28.9, the NCCL of the real H200 run)."""

from __future__ import annotations

import os
from typing import Any


def cuda_torch_view() -> dict[str, Any]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [p for p in (visible or "").split(",") if p.strip() and p.strip() != "-1"]
    return {
        "cuda_available": True,
        "torch_cuda": "13.0",
        "device_count": len(listed) if visible is not None else None,
        "nccl": os.environ.get("GPUCLUSTER_STANDIN_NCCL", "2.28.9"),
        "nccl_available": True,
    }


def install() -> None:
    from pytest_gpucluster.workloads import node_probe

    node_probe._torch_view = cuda_torch_view
