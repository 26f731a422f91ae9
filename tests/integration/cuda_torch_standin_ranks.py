"""A launched rank's torch, on a machine with no CUDA build of torch, seeing the GPUs the stand-in
NVML describes (``standin_nvml/pynvml.py``): ``standin_site/sitecustomize.py`` installs it in every
Python started with ``GPUCLUSTER_STANDIN_CUDA_RANKS=1``.

Only what a rank asks before it reaches NVML is answered: CUDA is available with as many devices
as the node's description lists (``CUDA_VISIBLE_DEVICES`` picks among them), ``set_device`` takes
one, and a device's properties carry the GPU's name, memory, UUID and PCI address from the same
description, so the rank finds its GPU in NVML by PCI bus id as on a real node. An NCCL process
group is made with gloo (there is no NCCL here). No kernel runs on a "GPU": a workload that
computes on one is out of this stand-in's reach; the NVML readings (the ECC/XID counters job) are
what it serves. torch is patched when it is first imported, so a Python that never imports it
(the XID listener) pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import SimpleNamespace
from typing import Any

_current = [0]


def _described() -> list[dict[str, Any]]:
    import pynvml  # the stand-in: first on PYTHONPATH

    found = pynvml.node()
    every = list(found["gpus"]) if found else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return every
    picked = [p.strip() for p in visible.split(",") if p.strip() and p.strip() != "-1"]
    return [every[int(p)] for p in picked if p.isdigit() and int(p) < len(every)]


def _index(device: Any) -> int:
    if device is None:
        return _current[0]
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None and isinstance(device, str):
        index = int(device.partition(":")[2] or 0)
    return _current[0] if index is None else int(index)


def _properties(device: Any = None) -> Any:
    gpu = _described()[_index(device)]
    domain, bus, rest = gpu["bus_id"].split(":")
    return SimpleNamespace(
        name=gpu["name"], total_memory=int(gpu["memory_bytes"]), uuid=gpu["uuid"].removeprefix("GPU-"),
        major=9, minor=0, multi_processor_count=132,
        pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16), pci_device_id=int(rest.split(".")[0], 16),
    )  # fmt: skip


def patch(torch: Any) -> None:
    """torch.cuda and torch.distributed.init_process_group as on a node with the described GPUs."""
    cuda = torch.cuda
    cuda.is_available = lambda: bool(_described())
    cuda.device_count = lambda: len(_described())
    cuda.set_device = lambda device: _current.__setitem__(0, _index(device))
    cuda.current_device = lambda: _current[0]
    cuda.get_device_properties = _properties
    cuda.get_device_name = lambda device=None: _properties(device).name
    cuda.synchronize = lambda device=None: None
    dist = torch.distributed
    init = dist.init_process_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend == "nccl":
            backend = "gloo"
            kwargs.pop("device_id", None)
        return init(backend, *args, **kwargs)

    dist.init_process_group = init_process_group


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch as usual, and patches it once its module has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "torch" in sys.modules:
        patch(sys.modules["torch"])
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())
