"""A node's readiness as the per-node probe read it (`workloads.readiness_probe`), parsed.

`node_readiness` turns the probe's raw readings (program outputs, sysfs and procfs values) into a
`NodeReadiness`: fabric state, persistence and memory health per GPU (`parsers.nvidia_smi_fabric`),
Fabric Manager's service and log and the SXid lines (`parsers.fabric_manager`), ACS on the GPU <->
NIC path (`parsers.lspci_acs`), the memlock limit (`parsers.proc_limits`), the IOMMU mode, stuck
processes and the PCIe links of the GPUs and NICs. Each reading that could not be taken keeps its
reason in ``why`` (``{"acs": "lspci -vvv shows no capabilities without root ..."}``), so a
threshold on it fails NOT MEASURED with that reason instead of passing. Pure; JSON round-trippable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_manager import SxidEvent, parse_fm_log, parse_sxid_lines
from pytest_gpucluster.parsers.lspci_acs import acs_on_gpu_nic_path, parse_lspci
from pytest_gpucluster.parsers.nvidia_smi_fabric import GpuReadiness, parse_gpu_readiness
from pytest_gpucluster.parsers.proc_limits import memlock_limit

__all__ = ["NodeReadiness", "PciLink", "node_readiness"]

_AER_TOTAL = re.compile(r"^TOTAL_ERR_(?:COR|FATAL|NONFATAL)\s+(\d+)\s*$", re.MULTILINE)
_AER_LINE = re.compile(r"^\S+\s+(\d+)\s*$", re.MULTILINE)
_WIDTH = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class PciLink:
    """A GPU, NVSwitch or RDMA NIC on the PCIe bus, as sysfs shows it at rest."""

    bdf: str
    kind: str
    """``gpu``, ``nvswitch`` or ``nic``."""
    current_speed: str | None = None
    max_speed: str | None = None
    current_width: int | None = None
    max_width: int | None = None
    aer_fatal: int | None = None
    aer_nonfatal: int | None = None
    aer_correctable: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class NodeReadiness:
    """What a node has before any GPU work (module docstring); ``why`` names each reading that
    could not be taken and why, keyed as the checks are (``gpus``, ``fabric_manager``, ``sxid``,
    ``peermem``, ``memlock``, ``acs``, ``iommu``, ``stuck``, ``pci``)."""

    gpus: tuple[GpuReadiness, ...] = ()
    nvswitches: int | None = None
    fm_service: str | None = None
    """``active``, ``inactive``, ``failed``... as ``systemctl is-active`` says."""
    fm_log_configured: bool | None = None
    fm_log_errors: tuple[str, ...] = ()
    sxids: tuple[SxidEvent, ...] = ()
    sxid_source: str | None = None
    peermem: bool | None = None
    open_module: bool | None = None
    kernel: str | None = None
    memlock: int | None = None
    """The soft limit in bytes, -1 for unlimited."""
    acs_redirecting: tuple[str, ...] = ()
    iommu: str | None = None
    """``off``, ``passthrough`` or ``translated``."""
    stuck: tuple[str, ...] = ()
    """``<pid> (<command>)`` of processes in D state on both reads."""
    pci: tuple[PciLink, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict)

    @property
    def dmabuf(self) -> bool | None:
        """NCCL's dma-buf GPUDirect path: the open kernel module on a Linux 5.12+ kernel."""
        if self.open_module is None or self.kernel is None:
            return None
        numbers = [int(n) for n in re.findall(r"\d+", self.kernel)[:2]] + [0, 0]
        return bool(self.open_module) and tuple(numbers[:2]) >= (5, 12)

    def to_json(self) -> dict[str, Any]:
        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        data["gpus"] = [g.to_json() for g in self.gpus]
        data["sxids"] = [s.to_json() for s in self.sxids]
        data["pci"] = [p.to_json() for p in self.pci]
        data["fm_log_errors"] = list(self.fm_log_errors)
        data["acs_redirecting"] = list(self.acs_redirecting)
        data["stuck"] = list(self.stuck)
        data["why"] = dict(self.why)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeReadiness:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["gpus"] = tuple(GpuReadiness.from_json(g) for g in data.get("gpus") or ())
        values["sxids"] = tuple(SxidEvent.from_json(s) for s in data.get("sxids") or ())
        values["pci"] = tuple(PciLink(**p) for p in data.get("pci") or ())
        for name in ("fm_log_errors", "acs_redirecting", "stuck"):
            values[name] = tuple(data.get(name) or ())
        values["why"] = dict(data.get("why") or {})
        return cls(**values)


def _command_text(reading: Mapping[str, Any], what: str) -> tuple[str | None, str | None]:
    """A program's stdout, or why there is none."""
    if reading.get("why"):
        return None, str(reading["why"])
    if reading.get("returncode") not in (0, None):
        said = " ".join(str(reading.get("stderr") or reading.get("text") or "").split())[-240:]
        return None, f"{what} exited with code {reading.get('returncode')}: {said or 'no message'}"
    return str(reading.get("text") or ""), None


def _gpus(raw: Mapping[str, Any], why: dict[str, str]) -> tuple[GpuReadiness, ...]:
    text, problem = _command_text(raw.get("smi_q") or {"why": "not read"}, "nvidia-smi -q")
    if text is None:
        why["gpus"] = problem or "nvidia-smi -q gave nothing"
        return ()
    try:
        return tuple(parse_gpu_readiness(text))
    except ParseError as exc:
        why["gpus"] = str(exc)
        return ()


def _count(text: str | None) -> int | None:
    """An ``aer_dev_*`` file: ``TOTAL_ERR_*`` where the kernel prints one, else the sum of its lines."""
    if text is None:
        return None
    total = _AER_TOTAL.search(text)
    if total:
        return int(total.group(1))
    values = _AER_LINE.findall(text)
    return sum(int(v) for v in values) if values else None


def _width(text: str | None) -> int | None:
    match = _WIDTH.search(text or "")
    return int(match.group(1)) if match else None


def _pci(raw: Mapping[str, Any], why: dict[str, str]) -> tuple[PciLink, ...]:
    reading = raw.get("pci") or {"why": "not read"}
    if reading.get("why"):
        why["pci"] = str(reading["why"])
        return ()
    return tuple(
        PciLink(
            bdf=str(d["bdf"]),
            kind=str(d["kind"]),
            current_speed=d.get("current_link_speed"),
            max_speed=d.get("max_link_speed"),
            current_width=_width(d.get("current_link_width")),
            max_width=_width(d.get("max_link_width")),
            aer_fatal=_count(d.get("aer_dev_fatal")),
            aer_nonfatal=_count(d.get("aer_dev_nonfatal")),
            aer_correctable=_count(d.get("aer_dev_correctable")),
        )
        for d in reading.get("devices") or ()
    )


def _fabric_manager(raw: Mapping[str, Any], why: dict[str, str]) -> dict[str, Any]:
    fm = raw.get("fabric_manager") or {}
    out: dict[str, Any] = {}
    service = fm.get("service") or {"why": "not read"}
    if service.get("why"):
        why["fabric_manager"] = f"systemctl: {service['why']}"
    elif "state" in service and (service.get("text") or "").strip():
        out["fm_service"] = str(service["state"])
    else:
        said = " ".join(str(service.get("stderr") or "").split())[-200:]
        why["fabric_manager"] = (
            f"systemctl is-active nvidia-fabricmanager said nothing ({said or 'no message'})"
        )
    log = fm.get("log") or {}
    if log.get("text") is not None:
        parsed = parse_fm_log(str(log["text"]))
        out["fm_log_configured"] = parsed.configured
        out["fm_log_errors"] = parsed.errors
        out["fm_sxids"] = parsed.sxids
    elif log.get("why"):
        why["fabric_manager_log"] = str(log["why"])
    return out


def _acs(raw: Mapping[str, Any], why: dict[str, str]) -> tuple[str, ...]:
    text, problem = _command_text(raw.get("lspci") or {"why": "not read"}, "lspci -vvv")
    if text is None:
        why["acs"] = problem or "lspci -vvv gave nothing"
        return ()
    devices = parse_lspci(text)
    ends = [d for d in devices if d.is_gpu or d.is_rdma_nic]
    bridges = [d for d in devices if d.is_bridge and any(e.below(d) for e in ends)]
    if (
        bridges
        and all(b.caps_denied or b.acs_ctl is None for b in bridges)
        and any(b.caps_denied for b in bridges)
    ):
        why["acs"] = (
            "lspci -vvv shows no extended capabilities without root ('Capabilities: <access denied>'); run the probe as root to read ACS"
        )
        return ()
    return tuple(b.bdf for b in acs_on_gpu_nic_path(devices))


def _iommu(raw: Mapping[str, Any]) -> str | None:
    reading = raw.get("iommu") or {}
    if not reading or reading.get("why") or reading.get("present") is False:
        return None
    types = {str(k).lower() for k in (reading.get("group_types") or {})}
    if any(t.startswith("dma") for t in types):
        return "translated"
    if "identity" in types:
        return "passthrough"
    return "off" if not reading.get("groups") else "passthrough"


def node_readiness(raw: Mapping[str, Any]) -> NodeReadiness:
    """The probe's ``readiness`` record (`workloads.readiness_probe.read_readiness`) parsed."""
    why: dict[str, str] = {}
    gpus = _gpus(raw, why)
    pci = _pci(raw, why)
    fm = _fabric_manager(raw, why)
    kernel_log = raw.get("kernel_log") or {"why": "not read"}
    sxids = list(fm.pop("fm_sxids", ()))
    if kernel_log.get("why"):
        why["sxid"] = f"the kernel log could not be read: {kernel_log['why']}"
    else:
        sxids += parse_sxid_lines("\n".join(kernel_log.get("lines") or ()))
    modules = raw.get("modules") or {}
    if modules.get("why"):
        why["peermem"] = str(modules["why"])
    version = modules.get("driver_version")
    memlock: int | None = None
    limits = (raw.get("memlock") or {}).get("limits")
    try:
        memlock = memlock_limit(limits)[0] if limits else None
    except ParseError as exc:
        why["memlock"] = str(exc)
    if limits is None:
        why["memlock"] = "<proc>/self/limits could not be read"
    dstate = raw.get("dstate") or {"why": "not read"}
    if dstate.get("why"):
        why["stuck"] = str(dstate["why"])
    switches = [p for p in pci if p.kind == "nvswitch"]
    return NodeReadiness(
        gpus=gpus,
        nvswitches=len(switches) if "pci" not in why else None,
        sxids=tuple(sxids),
        sxid_source=kernel_log.get("source"),
        peermem=modules.get("nvidia_peermem") if "nvidia_peermem" in modules else None,
        open_module=("open kernel module" in version.lower()) if version else None,
        kernel=modules.get("kernel"),
        memlock=memlock,
        acs_redirecting=_acs(raw, why),
        iommu=_iommu(raw),
        stuck=tuple(f"{pid} ({comm})" for pid, comm in sorted((dstate.get("stuck") or {}).items())),
        pci=pci,
        why=why,
        **fm,
    )
