"""What a node says about its GPUs and its software, for the burn-in's rank side (``health.py``):
NVML readings of this rank's GPU (ECC, retired pages, remapped rows, throttle reasons, temperature,
power, PCIe link), the node's XID events from the kernel log, and its version fingerprint.

Each reading that cannot be taken here (no NVML, ECC off, no kernel log access) is left out with
its reason, so the parent skips exactly that check. Rank-side: standard library, torch and
(lazily) pynvml only.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext

__all__ = ["THROTTLE_REASONS", "nvml_readings", "parse_xid_lines", "throttle_names", "versions", "xid_events"]

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

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)")
"""``NVRM: Xid (PCI:0000:3b:00): 79, ...``; old drivers wrote ``(0000:01:00)`` without ``PCI:``."""


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` lines of a kernel
    log, each as ``{"pci": "0000:3b:00", "xid": 79, "line": ...}`` (the line kept for
    telling a new event from one already seen: dmesg lines carry their timestamp)."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            events.append(
                {"pci": match["pci"].lower(), "xid": int(match["xid"]), "line": line.strip()[-300:]}
            )
    return events


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


def xid_events(ctx: RankContext) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The node's XID events from the kernel log (needs permission to read it)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run dmesg on {ctx.host} to read XID events: {exc}"
    if done.returncode != 0:
        return None, f"dmesg failed on {ctx.host} (exit {done.returncode}): {done.stderr.strip()[:200]}"
    return parse_xid_lines(done.stdout), None


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
