"""Device peaks as data: read ``thresholds/devices.yaml``, and tell which part a name means.

Each entry holds one GPU *part* (model and form factor: an H100 SXM5 and an H100 PCIe are two
parts) with its dense bf16 peak, memory, memory bandwidth and links, and the datasheet they come
from. Names are matched exactly, never by substring: "GH200" contains "H200", "H100 PCIe"
contains "H100", and a substring match hands either the wrong part's peaks (and ``--hw=auto``
the wrong profile).

- :func:`identify_gpu` maps a name the driver reports (``nvidia-smi --query-gpu=name``,
  ``torch.cuda.get_device_name``: ``"NVIDIA H100 80GB HBM3"``) to its part, or None.
- :func:`resolve_gpu_model` maps a profile's ``cluster.gpu_model`` to a part: exactly (a device
  name or a devices.yaml key), or, for older profiles that name only a family (``"H100"``), to the
  family's strongest part, flagged as inexact so the physics checks can warn.

Imports ``schema`` (for the quantity types) and ``paths`` only; never the loader or physics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.paths import shipped_thresholds_dir
from pytest_gpucluster.profiles.schema import Bandwidth, FlopRate, Section, Size
from pytest_gpucluster.profiles.schema_numerics import NumericsDtype

__all__ = [
    "Device",
    "DeviceMatch",
    "devices_file",
    "find_device",
    "identify_gpu",
    "load_devices",
    "normalize_name",
    "resolve_gpu_model",
    "same_part",
]


class _DeviceEntry(Section):
    key: str
    part: str
    names: tuple[str, ...]
    peak_flops: FlopRate
    memory: Size
    memory_bandwidth: Bandwidth
    nvlink_links: int = 0
    nvlink_bandwidth: Bandwidth | None = None
    pcie_bandwidth: Bandwidth
    nvls: bool = False
    dense_flops: dict[NumericsDtype, FlopRate] = Field(default_factory=dict)
    source: str


class _DevicesFile(Section):
    devices: tuple[_DeviceEntry, ...]


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU part's peaks in canonical units (FLOP/s, bytes, bytes/s per direction)."""

    key: str
    part: str
    """What people call the part: ``H100 SXM5``, ``H100 PCIe``."""
    names: tuple[str, ...]
    """The exact names of this part: as the driver reports them (without ``NVIDIA ``), then
    spellings a profile may use. Compared after :func:`normalize_name`."""
    peak_flops: float
    """Dense bf16/fp16 tensor-core peak."""
    memory: float
    memory_bandwidth: float
    nvlink_links: int
    nvlink_bandwidth: float | None
    """Per direction per GPU; None where the GPU has no NVLink."""
    pcie_bandwidth: float
    """Per direction, the GPU's host link."""
    nvls: bool
    """Sits on an NVSwitch with NVLink SHARP: NCCL can reduce an all_reduce in the switch."""
    source: str
    dense_flops: tuple[tuple[str, float], ...] = ()
    """Dense peak per numerics dtype (``fp32`` on the CUDA cores, ``tf32``, ``bf16``, ``fp16``,
    ``fp8`` on the tensor cores), as ``(dtype, FLOP/s)`` pairs; empty where the table gives none."""

    def dense_peak(self, dtype: str) -> float | None:
        """The dense peak of ``dtype`` (``bf16`` falls back to ``peak_flops``); None if unknown."""
        found = dict(self.dense_flops).get(dtype)
        if found is None and dtype == "bf16":
            return self.peak_flops
        return found

    @property
    def name(self) -> str:
        return self.part

    @property
    def family(self) -> str:
        """``h100`` for ``h100-sxm``, ``h100-pcie`` and ``h100-nvl``."""
        return self.key.split("-")[0]


@dataclass(frozen=True, slots=True)
class DeviceMatch:
    """How a profile's ``gpu_model`` resolved to a part."""

    device: Device
    exact: bool
    """False when ``gpu_model`` names only a family and ``device`` is its strongest part."""
    candidates: tuple[Device, ...]
    """Every part of the family (for an inexact match), else just ``device``."""


def devices_file() -> Path:
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
    devices = tuple(
        Device(**{**e.model_dump(), "dense_flops": tuple(sorted(e.dense_flops.items()))})
        for e in parsed.devices
    )
    _refuse_shared_names(devices, path)
    return devices


def _refuse_shared_names(devices: tuple[Device, ...], path: Path) -> None:
    owner: dict[str, str] = {}
    for device in devices:
        for name in (device.key, *device.names):
            norm = normalize_name(name)
            if owner.setdefault(norm, device.key) != device.key:
                raise ProfileError(
                    f"invalid device table {path}: the name {name!r} belongs to both {owner[norm]} and "
                    f"{device.key}; each name must identify one part"
                )


_VENDOR = re.compile(r"^nvidia\s+")


def normalize_name(name: str) -> str:
    """Case, a leading ``NVIDIA`` and ``-``/``_``/space differences do not tell parts apart:
    ``"NVIDIA A800-SXM4-80GB"`` and ``"a800 sxm4 80gb"`` are the same name."""
    text = _VENDOR.sub("", name.strip().lower())
    return " ".join(re.sub(r"[-_]", " ", text).split())


def identify_gpu(device_name: str, devices: tuple[Device, ...] | None = None) -> Device | None:
    """The part a driver-reported name is, by exact name; None for a part the table does not know."""
    wanted = normalize_name(device_name)
    if not wanted:
        return None
    table = load_devices() if devices is None else devices
    for device in table:
        if wanted in {normalize_name(n) for n in device.names}:
            return device
    return None


def resolve_gpu_model(gpu_model: str | None, devices: tuple[Device, ...] | None = None) -> DeviceMatch | None:
    """The part a profile's ``gpu_model`` names: its key or one of its names, exactly; else, when
    it names a family (``"H100"``), the family's first part in the table (the strongest, SXM)
    marked inexact; else None."""
    if not gpu_model or not gpu_model.strip():
        return None
    table = load_devices() if devices is None else devices
    wanted = normalize_name(gpu_model)
    for device in table:
        if wanted == normalize_name(device.key) or wanted in {normalize_name(n) for n in device.names}:
            return DeviceMatch(device, True, (device,))
    family = tuple(d for d in table if d.family == wanted.replace(" ", ""))
    if family:
        return DeviceMatch(family[0], False, family)
    return None


def find_device(gpu_model: str | None, devices: tuple[Device, ...] | None = None) -> Device | None:
    """The part whose peaks the physics checks use for ``gpu_model`` (see :func:`resolve_gpu_model`)."""
    match = resolve_gpu_model(gpu_model, devices)
    return match.device if match else None


def same_part(gpu_model: str, device_name: str, devices: tuple[Device, ...] | None = None) -> bool:
    """Whether a GPU the driver reports is the part a profile names: both resolve to the same
    devices.yaml entry, or (a part the table does not know) the names are equal. A family-only
    ``gpu_model`` matches no GPU: it does not say which part."""
    match = resolve_gpu_model(gpu_model, devices)
    found = identify_gpu(device_name, devices)
    if match is not None and found is not None:
        return match.exact and match.device.key == found.key
    if match is None and found is None:
        return normalize_name(gpu_model) == normalize_name(device_name)
    return False
