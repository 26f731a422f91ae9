"""What a node says about its GPUs and its software, for the burn-in's rank side (``health.py``):
NVML readings of this rank's GPU (ECC mode and counts, retired pages, remapped rows, throttle
reasons, temperature, power, PCIe link), the reader the load sampler calls during the health job's
load and NVML's cumulative violation and energy counters around it, the node's XID events
(``_xid.py``), and its version fingerprint.

Each reading that cannot be taken here (no NVML, a counter the part lacks) is left out with its
reason, so the parent knows exactly what is missing. The node's XID events are never silently
absent: ``xid_events`` says where they were read, or why nothing could be. Rank-side: standard
library, torch and (lazily) pynvml only.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext
from pytest_gpucluster.workloads._xid import kernel_xids, parse_xid_lines

__all__ = [
    "PERF_POLICIES",
    "THROTTLE_REASONS",
    "FieldReader",
    "nvml_cumulative",
    "nvml_readings",
    "nvml_sample_reader",
    "open_nvml",
    "parse_xid_lines",
    "throttle_names",
    "versions",
    "xid_events",
]

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML's ``nvmlClocksThrottleReason*`` (``nvmlClocksEventReason*``) bits, from nvml.h."""

PERF_POLICIES: dict[int, str] = {
    0: "power",
    1: "thermal",
    2: "sync_boost",
    3: "board_limit",
    4: "low_utilization",
    5: "reliability",
}
"""``nvmlPerfPolicyType_t`` (nvml.h), read with ``nvmlDeviceGetViolationStatus``: the cumulative
nanoseconds a clock was held below its target for that reason. Stable enum values, unlike the
``NVML_FI_DEV_CLOCKS_EVENT_REASON_*`` field ids, which NVML headers have renumbered."""


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def _nvml_handle(pynvml: Any, torch: Any, ctx: RankContext) -> tuple[Any, str]:
    """This rank's GPU in NVML (whose indices ignore CUDA_VISIBLE_DEVICES): by PCI bus id."""
    props = torch.cuda.get_device_properties(torch.device(ctx.device))
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if None not in (domain, bus, device):
        bus_id = f"{domain:08X}:{bus:02X}:{device:02X}.0"
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id), bus_id
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    index = torch.device(ctx.device).index or 0
    if entries and entries[index].isdigit():
        index = int(entries[index])
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
    return handle, bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read(readings: dict[str, Any], skipped: dict[str, str], name: str, call: Callable[[], Any]) -> None:
    try:
        readings[name] = call()
    except Exception as exc:  # NVMLError_NotSupported on parts without the counter
        skipped[name] = f"NVML cannot read {name} here: {type(exc).__name__}: {exc}"


def _nvml_counters(pynvml: Any, handle: Any, skipped: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ecc = pynvml.nvmlDeviceGetTotalEccErrors
    # nvml.h: memory error type 0 corrected, 1 uncorrected; counter 0 volatile, 1 aggregate.
    _read(out, skipped, "ecc_corrected_volatile", lambda: int(ecc(handle, 0, 0)))
    _read(out, skipped, "ecc_uncorrected_volatile", lambda: int(ecc(handle, 1, 0)))
    _read(out, skipped, "ecc_uncorrected_aggregate", lambda: int(ecc(handle, 1, 1)))
    # Cause 0: multiple single-bit errors, 1: a double-bit error (pre-Ampere page retirement).
    _read(
        out,
        skipped,
        "retired_pages",
        lambda: sum(len(pynvml.nvmlDeviceGetRetiredPages(handle, cause)) for cause in (0, 1)),
    )

    def remapped() -> dict[str, int]:
        corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        return {
            "correctable": int(corr),
            "uncorrectable": int(unc),
            "pending": int(pending),
            "failure": int(failure),
        }

    _read(out, skipped, "remapped_rows", remapped)

    def ecc_mode() -> dict[str, bool]:
        current, pending = pynvml.nvmlDeviceGetEccMode(handle)  # NVML_FEATURE_ENABLED is 1
        return {"current": int(current) == 1, "pending": int(pending) == 1}

    _read(out, skipped, "ecc_mode", ecc_mode)
    return out


def nvml_readings(torch: Any, ctx: RankContext, full: bool) -> tuple[dict[str, Any], dict[str, str]]:
    skipped: dict[str, str] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        handle, bus_id = _nvml_handle(pynvml, torch, ctx)
    except Exception as exc:
        return {}, {"nvml": f"NVML is not usable on {ctx.host}: {type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"pci_bus_id": bus_id.lower(), "gpu": f"GPU {ctx.local_rank} ({bus_id.lower()})"}
    out.update(_nvml_counters(pynvml, handle, skipped))
    if full:
        _read(out, skipped, "temperature_c", lambda: float(pynvml.nvmlDeviceGetTemperature(handle, 0)))
        _read(out, skipped, "power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        _read(out, skipped, "power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
        _read(out, skipped, "pcie_gen", lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
        _read(out, skipped, "pcie_width", lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
        _read(out, skipped, "pcie_max_gen", lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
        _read(out, skipped, "pcie_max_width", lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)))
        # Renamed "clocks event reasons" in newer NVML; the old name remains in older bindings.
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        _read(out, skipped, "throttle_reasons", lambda: throttle_names(int(reasons(handle))))
        _read(out, skipped, "vbios", lambda: _text(pynvml.nvmlDeviceGetVbiosVersion(handle)))
    return out, skipped


def open_nvml(torch: Any, ctx: RankContext) -> tuple[Any, Any] | str:
    """``(pynvml, handle)`` of this rank's GPU, or why NVML cannot be used here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle, _ = _nvml_handle(pynvml, torch, ctx)
    except Exception as exc:
        return f"NVML is not usable on {ctx.host}: {type(exc).__name__}: {exc}"
    return pynvml, handle


class FieldReader:
    """Reads named fields on every call; a field that fails once is dropped and its reason kept,
    so one unsupported counter (NotSupported on a part) costs only itself."""

    def __init__(self, fields: Mapping[str, Callable[[], Any]]) -> None:
        self._fields = dict(fields)
        self.errors: dict[str, str] = {}

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, read in list(self._fields.items()):
            try:
                out[name] = read()
            except Exception as exc:
                self.errors[name] = f"NVML cannot read {name} here: {type(exc).__name__}: {exc}"
                del self._fields[name]
        return out


def nvml_sample_reader(pynvml: Any, handle: Any) -> FieldReader:
    """One sample of what changes under load: temperature, power, SM and memory clocks, the PCIe
    link's generation and width, and the clock (throttle) reasons active right now."""
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return FieldReader(
        {
            "temperature_c": lambda: float(
                pynvml.nvmlDeviceGetTemperature(handle, 0)
            ),  # NVML_TEMPERATURE_GPU
            "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, 1)),  # NVML_CLOCK_SM
            "mem_clock_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, 2)),  # NVML_CLOCK_MEM
            "pcie_gen": lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            "pcie_width": lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            "throttle_reasons": lambda: throttle_names(int(reasons(handle))),
        }
    )


def nvml_cumulative(pynvml: Any, handle: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """NVML's cumulative counters: violation time per perf policy (ns) and total energy (mJ);
    what cannot be read is left out with its reason."""
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    violations: dict[str, int] = {}
    for policy, name in PERF_POLICIES.items():
        try:
            violations[name] = int(pynvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime)
        except Exception as exc:
            skipped[f"violation_{name}"] = (
                f"NVML cannot read {name} violation time: {type(exc).__name__}: {exc}"
            )
    if violations:
        out["violation_ns"] = violations
    _read(out, skipped, "energy_mj", lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
    return out, skipped


def xid_events(ctx: RankContext) -> tuple[list[dict[str, Any]] | None, str | None, str | None]:
    """The node's XID events from the first kernel log this rank can read: ``(events, source,
    None)``, or ``(None, None, why)`` saying for each log why it could not be read (``_xid.py``)."""
    found = kernel_xids()
    if found["events"] is None:
        return None, None, f"XID events not readable on {ctx.host}: {found['why']}"
    return found["events"], found["source"], None


# ------------------------------------------------------------------------------ versions


def _net_plugin() -> tuple[str | None, str | None]:
    """The NCCL net plugin NCCL would load (``NCCL_NET_PLUGIN``, else ``libnccl-net.so`` on the
    library path): its name, and the version its resolved file name carries (``.so.1.11.0``).
    Best effort: NCCL's own log (``--nccl-log``) says for certain what it loaded."""
    wanted = os.environ.get("NCCL_NET_PLUGIN")
    names = [f"libnccl-net-{wanted}.so", f"libnccl-net{wanted}.so", wanted] if wanted else ["libnccl-net.so"]
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        for name in names:
            path = Path(folder) / name
            if path.exists():
                real = Path(os.path.realpath(path)).name
                stem, _, suffix = real.partition(".so")
                version = suffix.lstrip(".") or None
                return stem.removeprefix("lib"), version
    return wanted or None, None


def _ib_firmware() -> str | None:
    root = Path("/sys/class/infiniband")
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return None
    parts = []
    for dev in devices:
        try:
            parts.append(f"{dev.name}={(dev / 'fw_ver').read_text().strip()}")
        except OSError:
            continue
    return ",".join(parts) or None


def versions() -> dict[str, str | None]:
    """This node's software and firmware versions (None where the thing is absent)."""
    import torch
    import torch.distributed as dist

    plugin, plugin_version = _net_plugin()
    out: dict[str, str | None] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cuda": torch.version.cuda,
        "nccl": None,
        "driver": None,
        "cuda_driver": None,
        "net_plugin": plugin,
        "net_plugin_version": plugin_version,
        "ib_firmware": _ib_firmware(),
    }
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    try:
        import pynvml

        pynvml.nvmlInit()
        out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        code = int(pynvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver"] = f"{code // 1000}.{code % 1000 // 10}"
    except Exception:
        pass  # no NVIDIA driver here: driver and cuda_driver stay None
    return out
