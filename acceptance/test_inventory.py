"""Inventory: the machine under test is the machine the profile describes.

Asking for an 8 x H200 profile on a machine without GPUs is a failed acceptance with the
mismatch spelled out — never a pass, and never a silent skip of everything.
"""

from __future__ import annotations

import pytest


def test_device_kind(hw, machine, results):
    expects_cuda = hw.cluster.device == "cuda"
    results.check(
        "inventory.cuda_available",
        float(machine.cuda_available),
        float(expects_cuda),
        unit="bool",
        comparison="==",
        source=f"profile {hw.name}: cluster.device={hw.cluster.device}",
        context=(
            f"profile {hw.name} expects {hw.cluster.gpus_per_node} x {hw.cluster.gpu_model or 'GPU'} per node, "
            f"but {machine.why_missing('cuda')}."
            if expects_cuda
            else "the profile is CPU-only but this machine has CUDA devices; pick a GPU profile with --hw."
        ),
    )


def test_gpu_count(hw, machine, results):
    if hw.cluster.device != "cuda":
        pytest.skip(f"profile {hw.name} is CPU-only (cluster.device=cpu): no GPUs to count")
    results.check(
        "inventory.gpus_per_node",
        machine.gpu_count,
        hw.cluster.gpus_per_node,
        unit="GPUs",
        comparison="==",
        labels={"host": machine.hostname},
        source=f"profile {hw.name}: cluster.gpus_per_node",
        context=f"{machine.hostname} shows {machine.gpu_count} CUDA device(s): {list(machine.gpu_names) or 'none'}.",
    )


def test_gpu_model(hw, machine, results):
    if hw.cluster.device != "cuda" or not hw.cluster.gpu_model:
        pytest.skip(f"profile {hw.name} names no GPU model (cluster.gpu_model)")
    wanted = hw.cluster.gpu_model.lower()
    wrong = [name for name in machine.gpu_names if wanted not in name.lower()]
    matching = machine.gpu_count - len(wrong) if machine.gpu_names else 0
    results.check(
        "inventory.gpus_matching_model",
        matching,
        hw.cluster.gpus_per_node,
        unit="GPUs",
        comparison="==",
        labels={"host": machine.hostname, "model": hw.cluster.gpu_model},
        source=f"profile {hw.name}: cluster.gpu_model",
        context=f"devices found: {list(machine.gpu_names) or 'none'}; expected every one to be a {hw.cluster.gpu_model}.",
    )


def test_node_count(hw, gpucluster_session, results):
    have = gpucluster_session.available_nodes
    results.check(
        "inventory.nodes",
        have,
        hw.cluster.nodes,
        unit="nodes",
        comparison=">=",
        source=f"profile {hw.name}: cluster.nodes",
        context=(
            f"the cluster under test has {have} node(s): {gpucluster_session.hosts}; pass --hostfile listing "
            f"{hw.cluster.nodes} nodes (or run inside a Slurm allocation with --launcher slurm)."
        ),
    )


def test_backend_available(hw, results):
    import torch.distributed as dist

    backend = hw.cluster.backend
    available = dist.is_available() and (
        dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    )
    results.check(
        f"inventory.backend_{backend}",
        float(available),
        1.0,
        unit="bool",
        comparison="==",
        source=f"profile {hw.name}: cluster.backend",
        context=f"this torch build ({torch_version()}) has no {backend} backend.",
    )


def torch_version() -> str:
    import torch

    return torch.__version__
