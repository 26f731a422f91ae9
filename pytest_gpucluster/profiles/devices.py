"""Device peaks as data: read ``thresholds/devices.yaml`` and find the device a profile names.

Each entry holds a GPU's dense bf16 peak, memory, memory bandwidth and links, with the
datasheet it comes from. :func:`find_device` maps a profile's ``cluster.gpu_model`` (a
substring of the device name, such as ``"H100"``) to an entry; the physics checks use it
where the profile's own ``cluster:`` section gives no figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.schema import Bandwidth, FlopRate, Section, Size

__all__ = ["Device", "devices_file", "find_device", "load_devices"]


class _DeviceEntry(Section):
    key: str
    names: tuple[str, ...]
    peak_flops: FlopRate
    memory: Size
    memory_bandwidth: Bandwidth
    nvlink_links: int = 0
    nvlink_bandwidth: Bandwidth | None = None
    pcie_bandwidth: Bandwidth
    nvls: bool = False
    source: str


class _DevicesFile(Section):
    devices: tuple[_DeviceEntry, ...]


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU's peaks in canonical units (FLOP/s, bytes, bytes/s per direction)."""

    key: str
    names: tuple[str, ...]
    """Names matched against a profile's ``gpu_model``, most specific first."""
    peak_flops: float
    """Dense bf16/fp16 tensor-core peak."""
    memory: float
    memory_bandwidth: float
    nvlink_links: int
    nvlink_bandwidth: float | None
    """Per direction per GPU; None where the GPU has no NVLink."""
    pcie_bandwidth: float
    """Per direction, the GPU's x16 host link."""
    nvls: bool
    """Sits on an NVSwitch with NVLink SHARP: NCCL can reduce an all_reduce in the switch."""
    source: str

    @property
    def name(self) -> str:
        return self.names[0]


def devices_file() -> Path:
    from pytest_gpucluster.profiles.loader import shipped_thresholds_dir

    return shipped_thresholds_dir() / "devices.yaml"


def load_devices(path: Path | None = None) -> tuple[Device, ...]:
    """Every device of ``devices.yaml`` (the shipped one by default); ProfileError names the key."""
    path = devices_file() if path is None else path
    return _load(str(path))


@lru_cache(maxsize=8)
def _load(path_text: str) -> tuple[Device, ...]:
    path = Path(path_text)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read the device table {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: invalid YAML: {exc}") from None
    try:
        parsed = _DevicesFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"key '{'.'.join(str(p) for p in e['loc'])}': {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ProfileError(f"invalid device table {path}: {problems}") from None
    return tuple(
        Device(
            key=e.key,
            names=e.names,
            peak_flops=e.peak_flops,
            memory=e.memory,
            memory_bandwidth=e.memory_bandwidth,
            nvlink_links=e.nvlink_links,
            nvlink_bandwidth=e.nvlink_bandwidth,
            pcie_bandwidth=e.pcie_bandwidth,
            nvls=e.nvls,
            source=e.source,
        )
        for e in parsed.devices
    )


def find_device(gpu_model: str | None, devices: tuple[Device, ...] | None = None) -> Device | None:
    """The device a profile's ``gpu_model`` names, or None when it names none we know.

    ``gpu_model`` matches a device when it is its key, or a substring of one of its names
    (``"H100"`` of ``"H100 SXM"``), or contains one (``"NVIDIA H100 80GB HBM3"``). Entries are
    tried in file order; each family's first is its strongest part (SXM), so an ambiguous name
    gets the largest peaks and a check built on them refuses only what no variant can do.
    """
    if not gpu_model or not gpu_model.strip():
        return None
    table = load_devices() if devices is None else devices
    wanted = gpu_model.strip().lower()
    for device in table:
        if wanted == device.key:
            return device
    for device in table:
        for name in device.names:
            low = name.lower()
            if wanted in low or low in wanted:
                return device
    return None
