"""What ``gpucluster health-check --nvml-only`` reads on a node: NVML and sysfs, nothing else.

No job, no torch, no CUDA context, no subprocess: NVML's per-GPU state (the count, each GPU's
PCI address, whether it answers, uncorrectable ECC errors since the last reset, row-remap pending
or failed) and sysfs (the NVIDIA GPUs on the PCI bus, the InfiniBand ports' states). On a cold
node this is a second or two, well inside the 60 s Slurm gives ``HealthCheckProgram``.

A GPU that PCI lists and NVML does not (or that NVML lists and cannot read: ``GpuIsLost``) is the
"lost GPU" the other checks must never drop silently. Why something could not be read is kept,
never taken for "nothing wrong".

Device reader: standard library, and pynvml lazily (``nvidia-ml-py``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GpuReading", "NodeReadings", "read_node"]

_NVIDIA = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")
"""PCI classes of a GPU (VGA 0x0300xx, 3D controller 0x0302xx); NVSwitches are 0x0680xx."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    pci: str = ""
    name: str = ""
    lost: str = ""
    """Why NVML could not read this GPU (``GpuIsLost``, ...); empty when it answered."""
    ecc_uncorrected_volatile: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeReadings:
    nvml: str
    """``read`` or why NVML could not be read (package missing, driver not loaded...)."""
    nvml_missing_package: bool
    gpus: tuple[GpuReading, ...]
    pci_gpus: tuple[str, ...]
    """NVIDIA GPUs on the PCI bus (sysfs), whatever NVML says."""
    ib_ports: dict[str, str]
    """``mlx5_0/1`` -> its ``state`` (``4: ACTIVE``), from sysfs."""
    seconds: float = 0.0


def _sysfs_root() -> Path:
    return Path(os.environ.get("GPUCLUSTER_SYSFS_ROOT", "/sys").replace("{host}", os.uname().nodename))


def pci_gpus(root: Path | None = None) -> tuple[str, ...]:
    """The PCI addresses of NVIDIA GPUs sysfs lists (``/sys/bus/pci/devices/*/vendor, class``)."""
    base = (root or _sysfs_root()) / "bus" / "pci" / "devices"
    found = []
    for dev in sorted(base.glob("*")) if base.is_dir() else ():
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == _NVIDIA and klass.startswith(_GPU_CLASSES):
            found.append(dev.name.lower())
    return tuple(found)


def ib_ports(root: Path | None = None) -> dict[str, str]:
    """``device/port -> state`` of every InfiniBand/RoCE port sysfs lists."""
    base = (root or _sysfs_root()) / "class" / "infiniband"
    out: dict[str, str] = {}
    for port in sorted(base.glob("*/ports/*")) if base.is_dir() else ():
        try:
            out[f"{port.parent.parent.name}/{port.name}"] = (port / "state").read_text().strip()
        except OSError as exc:
            out[f"{port.parent.parent.name}/{port.name}"] = f"unreadable ({exc.strerror})"
    return out


def _gpu(pynvml: Any, index: int) -> GpuReading:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pci = pynvml.nvmlDeviceGetPciInfo(handle).busId
        pci = pci.decode() if isinstance(pci, bytes) else str(pci)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as exc:  # GpuIsLost, Unknown: the GPU does not answer
        return GpuReading(index, lost=f"{type(exc).__name__}: {exc}")
    skipped: dict[str, str] = {}
    ecc = remap_pending = remap_failure = None
    try:
        ecc = int(pynvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0))  # uncorrected, volatile
    except Exception as exc:
        skipped["ecc"] = f"{type(exc).__name__}: {exc}"
    try:
        _, _, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        remap_pending, remap_failure = bool(pending), bool(failure)
    except Exception as exc:
        skipped["remapped_rows"] = f"{type(exc).__name__}: {exc}"
    return GpuReading(index, pci.lower(), name, "", ecc, remap_pending, remap_failure, skipped)


def read_node() -> NodeReadings:
    """NVML's GPUs (where NVML can be read) and sysfs's PCI GPUs and IB ports."""
    import time

    start = time.monotonic()
    gpus: list[GpuReading] = []
    missing_package = False
    try:
        import pynvml
    except ImportError:
        nvml, missing_package = (
            "not read: the pynvml package is not installed (pip install nvidia-ml-py)",
            True,
        )
    else:
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            nvml = f"not read: nvmlInit failed: {type(exc).__name__}: {exc}"
        else:
            try:
                count = int(pynvml.nvmlDeviceGetCount())
                gpus = [_gpu(pynvml, i) for i in range(count)]
                nvml = "read"
            except Exception as exc:
                nvml = f"not read: nvmlDeviceGetCount failed: {type(exc).__name__}: {exc}"
            finally:
                with contextlib.suppress(Exception):
                    pynvml.nvmlShutdown()
    return NodeReadings(
        nvml, missing_package, tuple(gpus), pci_gpus(), ib_ports(), round(time.monotonic() - start, 3)
    )
