"""Inventory: the machine under test is the machine the profile describes.

Asking for an 8 x H200 profile on a machine without GPUs is a failed acceptance with the
mismatch spelled out — never a pass, and never a silent skip of everything.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gpucluster.results.model import Check, ThresholdRef


def _key(hw: Any, key: str) -> ThresholdRef:
    return ThresholdRef(hw.name, ("cluster", key))


def test_device_kind(hw: Any, machine: Any, results: Any) -> None:
    expects_cuda = hw.cluster.device == "cuda"
    hint = (
        f"profile {hw.name} expects {hw.cluster.gpus_per_node} x {hw.cluster.gpu_model or 'GPU'} per node, "
        f"but {machine.why_missing('cuda')}."
        if expects_cuda
        else "the profile is CPU-only but this machine has CUDA devices; pick a GPU profile with --hw."
    )
    cuda = float(machine.cuda_available)
    results.check_all(
        [
            Check(
                "inventory.cuda_available",
                cuda,
                "bool",
                float(expects_cuda),
                "==",
                _key(hw, "device"),
                hint=hint,
            )
        ]
    )


def test_gpu_count(hw: Any, machine: Any, results: Any) -> None:
    if hw.cluster.device != "cuda":
        pytest.skip(f"profile {hw.name} is CPU-only (cluster.device=cpu): no GPUs to count")
    hint = (
        f"{machine.hostname} shows {machine.gpu_count} CUDA device(s): {list(machine.gpu_names) or 'none'}."
    )
    count = Check("inventory.gpus_per_node", machine.gpu_count, "GPUs", hw.cluster.gpus_per_node, "==",
                  _key(hw, "gpus_per_node"), labels={"host": machine.hostname}, hint=hint)  # fmt: skip
    results.check_all([count])


def test_gpu_model(hw: Any, machine: Any, results: Any) -> None:
    if hw.cluster.device != "cuda" or not hw.cluster.gpu_model:
        pytest.skip(f"profile {hw.name} names no GPU model (cluster.gpu_model)")
    wrong = [name for name in machine.gpu_names if hw.cluster.gpu_model.lower() not in name.lower()]
    matching = machine.gpu_count - len(wrong) if machine.gpu_names else 0
    hint = f"devices found: {list(machine.gpu_names) or 'none'}; expected every one to be a {hw.cluster.gpu_model}."
    labels = {"host": machine.hostname, "model": hw.cluster.gpu_model}
    model = Check("inventory.gpus_matching_model", matching, "GPUs", hw.cluster.gpus_per_node, "==",
                  _key(hw, "gpu_model"), labels=labels, hint=hint)  # fmt: skip
    results.check_all([model])


def test_node_count(hw: Any, gpucluster_session: Any, results: Any) -> None:
    have = gpucluster_session.available_nodes
    hint = (
        f"the cluster under test has {have} node(s): {gpucluster_session.hosts}; pass --hostfile listing "
        f"{hw.cluster.nodes} nodes (or run inside a Slurm allocation with --launcher slurm)."
    )
    results.check_all(
        [Check("inventory.nodes", have, "nodes", hw.cluster.nodes, ">=", _key(hw, "nodes"), hint=hint)]
    )


def test_backend_available(hw: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    backend = hw.cluster.backend
    available = dist.is_available() and (
        dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    )
    hint = f"this torch build ({torch.__version__}) has no {backend} backend."
    check = Check(
        f"inventory.backend_{backend}", float(available), "bool", 1.0, "==", _key(hw, "backend"), hint=hint
    )
    results.check_all([check])
