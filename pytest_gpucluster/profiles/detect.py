"""What this machine has, and which profile fits it when ``--hw=auto``.

The probe is cheap on a machine without NVIDIA hardware: with no ``nvidia-smi`` on PATH and no
``/dev/nvidia*`` device it concludes "no CUDA device" without importing torch. Only where a GPU may
exist does it import torch (and, if installed, NVML) to read device names.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.devices import identify_gpu, load_devices, normalize_name, same_part

if TYPE_CHECKING:
    from pytest_gpucluster.profiles.loader import LoadedProfile

__all__ = ["MachineInfo", "choose_profile", "detect_machine", "shape_to_nodes"]


@dataclass(frozen=True, slots=True)
class MachineInfo:
    hostname: str
    cuda_available: bool
    gpu_names: tuple[str, ...] = ()
    cpu_count: int = 1
    capabilities: frozenset[str] = field(default_factory=frozenset)
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each missing capability is missing, in words (shown in skip reasons)."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    def why_missing(self, capability: str) -> str:
        return self.reasons.get(capability, f"{capability} not detected on {self.hostname}")


def _nvidia_present() -> bool:
    return shutil.which("nvidia-smi") is not None or any(Path("/dev").glob("nvidia[0-9]*"))


def _ib_devices() -> dict[str, str]:
    """InfiniBand/RoCE/EFA devices -> link layer ('InfiniBand' or 'Ethernet'), from sysfs."""
    devices: dict[str, str] = {}
    root = Path("/sys/class/infiniband")
    if not root.is_dir():
        return devices
    for dev in root.iterdir():
        layer = "unknown"
        for port in sorted((dev / "ports").glob("*")):
            try:
                layer = (port / "link_layer").read_text().strip()
                break
            except OSError:
                continue
        devices[dev.name] = layer
    return devices


def detect_machine() -> MachineInfo:
    hostname = socket.gethostname()
    caps: set[str] = set()
    reasons: dict[str, str] = {}
    gpu_names: tuple[str, ...] = ()
    cuda = False
    if _nvidia_present():
        try:
            import torch

            cuda = torch.cuda.is_available()
            if cuda:
                gpu_names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
                caps.add("cuda")
                if torch.distributed.is_available() and torch.distributed.is_nccl_available():
                    caps.add("nccl")
                else:
                    reasons["nccl"] = "this torch build has no NCCL backend"
            else:
                reasons["cuda"] = (
                    f"nvidia-smi is present on {hostname} but torch.cuda.is_available() is False"
                )
        except ImportError:
            reasons["cuda"] = "torch is not installed"
    else:
        reasons["cuda"] = f"no CUDA device on {hostname} (no nvidia-smi, no /dev/nvidia*)"
    reasons.setdefault("nccl", reasons.get("cuda", "NCCL needs CUDA"))
    if cuda:
        try:
            import pynvml

            pynvml.nvmlInit()
            caps.add("nvml")
            if _any_nvlink_active(pynvml, len(gpu_names)):
                caps.add("nvlink")
            else:
                reasons["nvlink"] = f"NVML reports no active NVLink on {hostname}"
        except Exception as exc:  # ImportError or an NVML error: both mean "no NVML here"
            reasons["nvml"] = f"NVML unavailable ({type(exc).__name__}: {exc}); pip install nvidia-ml-py"
    reasons.setdefault("nvml", reasons.get("cuda", "NVML needs an NVIDIA driver"))
    reasons.setdefault("nvlink", reasons.get("nvml", "NVLink needs NVML"))
    ib = _ib_devices()
    if any(layer == "InfiniBand" for layer in ib.values()):
        caps.add("ib")
    if any(layer == "Ethernet" for name, layer in ib.items() if not name.startswith("efa")):
        caps.add("roce")
    if any(name.startswith(("efa", "rdmap")) for name in ib):
        caps.add("efa")
    for cap in ("ib", "roce", "efa"):
        reasons.setdefault(cap, f"no {cap.upper()} device under /sys/class/infiniband on {hostname}")
    if os.environ.get("SLURM_JOB_ID") or shutil.which("srun"):
        caps.add("slurm")
    else:
        reasons["slurm"] = "not inside a Slurm allocation and no srun on PATH"
    if shutil.which("mpirun"):
        caps.add("mpi")
    else:
        reasons["mpi"] = "no mpirun on PATH (Debian: apt-get install openmpi-bin)"
    return MachineInfo(
        hostname=hostname,
        cuda_available=cuda,
        gpu_names=gpu_names,
        cpu_count=os.cpu_count() or 1,
        capabilities=frozenset(caps),
        reasons=reasons,
    )


def _any_nvlink_active(pynvml: object, count: int) -> bool:
    nvml = pynvml  # NVML's Python binding has no type stubs
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]
        for link in range(18):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link):  # type: ignore[attr-defined]
                    return True
            except Exception:  # links beyond the device's count raise
                break
    return False


def _part(name: str) -> str:
    device = identify_gpu(name)
    return f"{device.key} ({device.part})" if device else "a part devices.yaml does not list"


def choose_profile(machine: MachineInfo, gpu_models: Iterable[tuple[str, str | None]]) -> tuple[str, str]:
    """Pick a profile for ``--hw=auto``: (name, reason). ``gpu_models`` is (profile, gpu_model) pairs.

    A GPU that ``devices.yaml`` knows gets its part profile, the profile named by the part's key
    (``NVIDIA H200`` -> ``h200-sxm``): hardware only, no site's NCCL environment or network, which
    a site profile (``h200-spectrumx``) adds and is chosen by name. Names are matched whole
    (``profiles.devices``): an "NVIDIA GH200 480GB" is not an H200. A GPU the table does not know
    gets the one profile whose ``gpu_model`` names it exactly (a user's profile for a new part).
    """
    if not machine.cuda_available:
        return "cpu-local", f"auto: {machine.why_missing('cuda')}"
    device = machine.gpu_names[0] if machine.gpu_names else ""
    others = sorted({n for n in machine.gpu_names if normalize_name(n) != normalize_name(device)})
    if others:
        raise ProfileError(
            f"--hw=auto: this machine mixes GPU parts ({device!r} and {', '.join(map(repr, others))}); "
            "no profile describes a mixed node. Pass --hw=<name>."
        )
    pairs = sorted(((name, model) for name, model in gpu_models if model), key=lambda x: x[0])
    part = identify_gpu(device)
    if part is not None:
        if any(name == part.key for name, _ in pairs):
            return part.key, f"auto: GPU {device!r} is {part.key} ({part.part}): its part profile {part.key}"
        raise ProfileError(
            f"--hw=auto: GPU {device!r} is {part.key} ({part.part}), but no part profile {part.key}.yaml "
            f"was found (is --thresholds-dir hiding the shipped thresholds?). Pass --hw=<name>."
        )
    matches = [(name, model) for name, model in pairs if same_part(model, device)]
    if len(matches) == 1:
        name, model = matches[0]
        return name, f"auto: GPU {device!r} is {_part(device)}, the part {name} names (gpu_model {model!r})"
    if matches:
        names = ", ".join(name for name, _ in matches)
        raise ProfileError(
            f"--hw=auto: GPU {device!r} ({_part(device)}) matches several profiles ({names}); pass --hw=<name>."
        )
    parts = ", ".join(sorted(d.key for d in load_devices()))
    raise ProfileError(
        f"--hw=auto: GPU {device!r} is {_part(device)}; no part profile describes it (part profiles: "
        f"{parts}). Add its datasheet figures to devices.yaml and a part profile, or pass "
        f"--hw=path/to/profile.yaml (a profile for this GPU sets cluster.gpu_model: "
        f"{device.removeprefix('NVIDIA ')!r})."
    )


def shape_to_nodes(profile: LoadedProfile, gpu_counts: Sequence[int]) -> tuple[LoadedProfile, str]:
    """``--hw=auto``'s part profile shaped to the probed nodes: as many nodes as were probed and
    the most GPUs any of them lists per node (a node that lost a GPU stays short of that, and the
    preflight names it), ranks per node following. A 1-GPU node runs the single-GPU tests with the
    part's floors; collectives whose scope is then one rank skip as not applicable."""
    counts = [c for c in gpu_counts if c > 0]
    cluster = profile.model.cluster
    if not counts or cluster.device != "cuda":
        return profile, ""
    gpus, nodes = max(counts), len(gpu_counts)
    if (gpus, nodes) == (cluster.gpus_per_node, cluster.nodes) and cluster.ranks_per_node is None:
        return profile, ""
    shaped = cluster.model_copy(update={"gpus_per_node": gpus, "nodes": nodes, "ranks_per_node": None})
    model = profile.model.model_copy(update={"cluster": shaped})
    why = (
        f"shaped to the probed nodes: {nodes} node(s) x {gpus} GPU(s) "
        f"(the part profile says {cluster.nodes} x {cluster.gpus_per_node})"
    )
    return replace(profile, model=model), why
