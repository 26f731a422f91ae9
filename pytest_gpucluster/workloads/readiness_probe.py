"""The node's readiness, rank side: what a node must have before GPU work is worth measuring,
read without any GPU work and, where the data is world-readable, without root.

`read_readiness` returns plain JSON for the parent to parse (`cluster.readiness`); a reading that
could not be taken carries its reason (``"why"``), never an empty value that reads as healthy:

- ``smi_q``: the text of ``nvidia-smi -q`` (fabric state, persistence, row remaps, retired pages
  per GPU; no root needed);
- ``fabric_manager``: ``systemctl is-active nvidia-fabricmanager`` and the tail of
  ``/var/log/fabricmanager.log`` (root-only on most installs: the why says so);
- ``kernel_log``: the SXid lines of the kernel log (``journalctl -k``/``dmesg``: root or the adm
  group where ``kernel.dmesg_restrict=1``);
- ``modules``: ``<sysfs>/module/nvidia_peermem`` present, ``<proc>/driver/nvidia/version`` (the
  open kernel module, which with a 5.12+ kernel gives NCCL dma-buf instead of peermem);
- ``memlock``: ``<proc>/self/limits`` (this process's limit is what a launched rank inherits);
- ``iommu``: the default domain type of each ``<sysfs>/kernel/iommu_groups/*/type`` and
  ``<proc>/cmdline``;
- ``pci``: NVIDIA GPUs, NVSwitches and RDMA NICs under ``<sysfs>/bus/pci/devices``: link speed and
  width (current and max) and the AER counters (``aer_dev_*``);
- ``lspci``: ``lspci -vvv`` (ACS control lines; extended capabilities need root);
- ``dstate``: processes in uninterruptible sleep (``D``) on two reads 0.2 s apart.

The seams: ``sysfs_root`` (``/sys``) and ``proc_root`` (``/proc``) point at a recorded tree, and
the programs are found on PATH. Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._xid import kernel_log

__all__ = ["FM_LOG", "read_readiness"]

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
FM_LOG = "/var/log/fabricmanager.log"
"""Fabric Manager's default ``LOG_FILE_NAME`` (``GPUCLUSTER_FM_LOG`` on the controller points elsewhere)."""
TAIL_LINES = 400
NVIDIA = "0x10de"
_RDMA_VENDORS = ("0x15b3",)  # Mellanox/NVIDIA networking
_CLASSES = {"0x0302": "gpu", "0x0300": "gpu", "0x0680": "nvswitch", "0x0207": "nic", "0x0200": "nic"}


def _run(argv: Sequence[str], run: Runner, timeout: float = 60.0) -> dict[str, Any]:
    path = shutil.which(argv[0])
    if path is None:
        return {"why": f"'{argv[0]}' is not on PATH"}
    try:
        done = run([path, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"why": f"'{' '.join(argv)}' could not be run: {exc}"}
    return {"returncode": done.returncode, "text": done.stdout, "stderr": (done.stderr or "")[-1000:]}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _tail(path: str, lines: int = TAIL_LINES) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - (1 << 20)))
            text = handle.read().decode("utf-8", errors="replace")
    except PermissionError:
        return {"why": f"{path}: permission denied (root, or read access to the file, is needed)"}
    except OSError as exc:
        return {"why": f"{path}: {exc.strerror or type(exc).__name__}"}
    return {"text": "\n".join(text.splitlines()[-lines:]), "source": path}


def _fabric_manager(run: Runner, log: str) -> dict[str, Any]:
    service = _run(["systemctl", "is-active", "nvidia-fabricmanager"], run, timeout=20)
    if "returncode" in service:
        service = {"state": (service["text"] or "").strip().splitlines()[-1:] or ["unknown"]} | service
        service["state"] = service["state"][0]
    return {"service": service, "log": _tail(log)}


def _sxid_lines() -> dict[str, Any]:
    found = kernel_log()
    if found["text"] is None:
        return {"why": found["why"]}
    lines = [line for line in found["text"].splitlines() if "SXid" in line]
    return {"source": found["source"], "lines": lines[-200:]}


def _pci(sysfs: Path) -> dict[str, Any]:
    root = sysfs / "bus" / "pci" / "devices"
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        return {"why": f"{root}: {exc.strerror or type(exc).__name__}"}
    devices = []
    for entry in entries:
        vendor, klass = _read(entry / "vendor"), _read(entry / "class") or ""
        kind = _CLASSES.get(klass[:6])
        if kind is None or (kind in ("gpu", "nvswitch") and vendor != NVIDIA):
            continue
        if kind == "nic" and vendor not in _RDMA_VENDORS:
            continue
        device: dict[str, Any] = {"bdf": entry.name, "kind": kind}
        for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"):
            device[name] = _read(entry / name)
        for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
            device[name] = _read(entry / name)
        devices.append(device)
    return {"devices": devices}


def _iommu(sysfs: Path, proc: Path) -> dict[str, Any]:
    root = sysfs / "kernel" / "iommu_groups"
    types: dict[str, int] = {}
    try:
        groups = list(root.iterdir())
    except OSError:
        groups = []
    for group in groups:
        kind = _read(group / "type")
        if kind:
            types[kind] = types.get(kind, 0) + 1
    return {
        "group_types": types,
        "groups": len(groups),
        "present": root.is_dir(),
        "cmdline": _read(proc / "cmdline"),
    }


_STAT = re.compile(r"^\d+ \((?P<comm>.*)\) (?P<state>\S)")


def _dstate_once(proc: Path) -> dict[str, str]:
    out = {}
    try:
        pids = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        match = _STAT.match(_read(pid / "stat") or "")
        if match and match["state"] == "D":
            out[pid.name] = match["comm"]
    return out


def _dstate(proc: Path, pause_s: float = 0.2) -> dict[str, Any]:
    try:
        table = any(p.name.isdigit() for p in proc.iterdir())
    except OSError as exc:
        return {"why": f"{proc}: {exc.strerror or type(exc).__name__}"}
    if not table:
        return {"why": f"{proc}: no process table"}
    first = _dstate_once(proc)
    if first:
        time.sleep(pause_s)
    second = _dstate_once(proc)
    return {"stuck": {pid: comm for pid, comm in second.items() if pid in first}}


def _guarded(name: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One reading; an unexpected error becomes its ``why`` (the probe of a node never dies of it)."""
    try:
        return read()
    except Exception as exc:  # a reading that breaks is reported, never silently healthy
        return {"why": f"reading {name} failed: {type(exc).__name__}: {exc}"}


def read_readiness(
    *,
    sysfs_root: str = "/sys",
    proc_root: str = "/proc",
    smi: str = "nvidia-smi",
    fm_log: str = FM_LOG,
    run: Runner = subprocess.run,
) -> dict[str, Any]:
    """Everything the readiness checks read on this node (see the module docstring)."""
    sysfs, proc = Path(sysfs_root), Path(proc_root)

    def modules() -> dict[str, Any]:
        if not (sysfs / "module").is_dir():  # no sysfs to read: unknown, never "not loaded"
            return {"why": f"{sysfs / 'module'} is not readable"}
        return {
            "nvidia_peermem": (sysfs / "module" / "nvidia_peermem").is_dir(),
            "nvidia": (sysfs / "module" / "nvidia").is_dir(),
            "driver_version": _read(proc / "driver" / "nvidia" / "version"),
            "kernel": os.uname().release
            if proc_root == "/proc"
            else _read(proc / "sys" / "kernel" / "osrelease"),
        }

    return {
        "smi_q": _guarded("nvidia-smi -q", lambda: _run([smi, "-q"], run)),
        "fabric_manager": _guarded("fabric manager", lambda: _fabric_manager(run, fm_log)),
        "kernel_log": _guarded("the kernel log", _sxid_lines),
        "modules": _guarded("modules", modules),
        "memlock": _guarded("limits", lambda: {"limits": _read(proc / "self" / "limits")}),
        "iommu": _guarded("iommu", lambda: _iommu(sysfs, proc)),
        "pci": _guarded("pci", lambda: _pci(sysfs)),
        "lspci": _guarded("lspci", lambda: _run(["lspci", "-vvv"], run)),
        "dstate": _guarded("process states", lambda: _dstate(proc)),
    }
