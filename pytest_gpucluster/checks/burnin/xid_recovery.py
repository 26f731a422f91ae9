"""Xid 154 decoded: the GPU recovery action its line names, as a catalog bucket the suite acts on.

NVIDIA's XID catalog gives Xid 154 (``GPU_RECOVERY_ACTION_CHANGED``) the bucket ``XID_154``: "Follow
XID 154 reported guidance". The driver's line names the action, its code first::

    NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)

The code is NVML's ``nvmlDeviceGpuRecoveryAction_t`` (what ``nvmlDeviceGetGpuRecoveryAction`` and
``nvidia-smi -q``'s "GPU Recovery Action" read). Its values and what each asks, from NVIDIA:

- *Error Recovery and Response Flags* (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
  error-recovery-and-response-flags.html): ``NONE`` "No recovery action is needed. The GPU can be
  immediately used again by starting a new GPU process"; ``GPU_RESET`` "Terminate all GPU processes,
  reset the GPU using nvidia-smi -r"; ``NODE_REBOOT`` "Reboot the operating system"; ``DRAIN_P2P``
  "Terminate all GPU processes that conduct peer-to-peer traffic and disable UVM persistence mode.
  Once all peer-to-peer traffic are drained, query ... again, which will return one of the other
  actions"; ``DRAIN_AND_RESET``.
- NVML's enum as cuda-python's bindings document it (``cuda.bindings.nvml.DeviceGpuRecoveryAction``,
  https://nvidia.github.io/cuda-python/): 0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P,
  4 DRAIN_AND_RESET ("Drain P2P and Reset Gpu"), 5 RECOVER_IMEX_DOMAIN, 6 BUS_RESET ("Reset the GPU's
  PCIe bus"), 7 SYSTEM_REBOOT.

The action is read from the hexadecimal code, not from the words beside it: drivers word the same
code differently (R570-R580 "Node Reboot Required", R610 "OS Reboot"; "GPU Reset Required" and
"PF FLR", a PCIe function-level reset, for 0x1). The rung each code maps to is :data:`RECOVERY_ACTIONS`;
a code not there, or a line that names none, keeps the catalog's ``XID_154`` bucket, "drain node"
(an unknown action is never taken for a harmless one).

An Xid 154 heard through NVML's events has no line. The listener then reads the GPU's recovery
action from NVML as the event arrives (`workloads/_xid.recovery_action`) and stores the code in the
event (``recovery_action``); :func:`recovery_of` judges that code by the same table. Where the read
failed (``recovery_action_error``) or the event holds neither, it stays ``XID_154``, "drain node",
and says why.

Pure: no I/O. Real lines in tests/data/kernel_logs/xid_154_recovery_actions.log (SOURCES.md there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from pytest_gpucluster.checks.burnin.xid_catalog import CatalogBucket

__all__ = ["RECOVERY_ACTIONS", "RecoveryAction", "RecoveryChange", "decode_154", "from_nvml", "recovery_of"]


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """One value of NVML's ``nvmlDeviceGpuRecoveryAction_t``."""

    code: int
    nvml: str
    """NVML's name (``NVML_GPU_RECOVERY_ACTION_...``)."""
    bucket: CatalogBucket
    """The catalog bucket whose rung and advice fit what NVIDIA asks for this action."""
    asks: str
    """What NVIDIA asks the operator to do, in short."""


RECOVERY_ACTIONS: Final[dict[int, RecoveryAction]] = {
    a.code: a
    for a in (
        RecoveryAction(0, "NVML_GPU_RECOVERY_ACTION_NONE", "IGNORE",
                       "no recovery action is needed; the GPU can be used by a new process"),
        RecoveryAction(1, "NVML_GPU_RECOVERY_ACTION_GPU_RESET", "RESET_GPU",
                       "terminate the GPU's processes and reset the GPU (nvidia-smi -r)"),
        RecoveryAction(2, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", "RESTART_BM",
                       "reboot the node: the fault may have left the OS inconsistent"),
        RecoveryAction(3, "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", "XID_154",
                       "stop every process doing peer-to-peer traffic, disable UVM persistence mode, then read "
                       "the recovery action again (nvidia-smi -q): it names the next step"),
        RecoveryAction(4, "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", "RESET_GPU",
                       "drain the GPU's work (peer-to-peer included) and reset the GPU"),
        RecoveryAction(5, "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN", "XID_154",
                       "recover the node's IMEX domain (the NVLink memory-export daemons of the domain)"),
        RecoveryAction(6, "NVML_GPU_RECOVERY_ACTION_BUS_RESET", "RESET_GPU",
                       "reset the GPU's PCIe bus"),
        RecoveryAction(7, "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", "RESTART_BM",
                       "reboot the system"),
    )
}  # fmt: skip
"""NVML's recovery actions by code, each with the bucket the suite acts on (module docstring).
``NONE`` is a warning (the GPU recovered: a later line changing the action *to* 0x0); ``GPU_RESET``,
``DRAIN_AND_RESET`` and ``BUS_RESET`` reset the GPU; ``NODE_REBOOT`` and ``SYSTEM_REBOOT`` drain
and reboot the node; ``DRAIN_P2P`` (a step before another action) and ``RECOVER_IMEX_DOMAIN`` keep
the catalog's ``XID_154``: drain the node and do what the action names."""

_CHANGE = re.compile(
    r"recovery action changed\s+(?:from\s+0x(?P<old>[0-9a-f]+)(?:\s*\((?P<old_name>[^)]*)\))?\s+)?"
    r"to\s+0x(?P<new>[0-9a-f]+)(?:\s*\((?P<new_name>[^)]*)\))?",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class RecoveryChange:
    """What an Xid 154 line says: the action it changed to (and from, where the line says)."""

    new: int
    new_name: str
    old: int | None = None
    old_name: str = ""
    read_from: str = "the driver's line"
    """Where the code came from: the driver's log line, or NVML read when its event arrived."""

    @property
    def action(self) -> RecoveryAction | None:
        """NVML's action for the new code; None for a code this table does not hold."""
        return RECOVERY_ACTIONS.get(self.new)

    def __str__(self) -> str:
        said = f"recovery action now 0x{self.new:x} ({self.new_name or '?'})"
        if self.read_from != "the driver's line":
            said += f" as {self.read_from}"
        if self.old is not None:
            said += f", was 0x{self.old:x} ({self.old_name or '?'})"
        known = self.action
        if known is None:
            return f"{said}: a code NVML's table does not hold"
        return f"{said} = {known.nvml}: {known.asks}"


def decode_154(line: str) -> RecoveryChange | None:
    """The change an Xid 154 line names; None where the line names no code (the catalog's
    ``XID_154`` bucket then stands)."""
    match = _CHANGE.search(line or "")
    if match is None:
        return None
    old = match["old"]
    return RecoveryChange(
        new=int(match["new"], 16),
        new_name=(match["new_name"] or "").strip(),
        old=int(old, 16) if old is not None else None,
        old_name=(match["old_name"] or "").strip(),
    )


NVML_READ = "NVML read it when the event arrived"
""":attr:`RecoveryChange.read_from` for a code the XID listener read from NVML (no line)."""


def from_nvml(code: int) -> RecoveryChange:
    """The change an NVML event's Xid 154 stands for, given the recovery action NVML read then
    (the old action is not known: NVML answers the current one only)."""
    known = RECOVERY_ACTIONS.get(code)
    name = known.nvml.removeprefix("NVML_GPU_RECOVERY_ACTION_") if known else ""
    return RecoveryChange(new=code, new_name=name, read_from=NVML_READ)


def recovery_of(
    line: str | None, nvml_code: object = None, nvml_error: str | None = None
) -> tuple[RecoveryChange | None, str]:
    """What an Xid 154 event says about the recovery action: its line's code, else the code NVML
    read (``nvml_code``), as ``(change, "")``; or ``(None, why)`` where neither names one (``why``
    empty for a line that names none and no NVML read at all: a kernel log line cut short)."""
    change = decode_154(line or "")
    if change is not None:
        return change, ""
    if isinstance(nvml_code, int) and not isinstance(nvml_code, bool) and nvml_code >= 0:
        return from_nvml(nvml_code), ""
    if nvml_code is not None:
        return None, f"the recovery action NVML read is not a code: {nvml_code!r}"
    if nvml_error:
        return None, f"NVML's event has no line and the recovery action could not be read: {nvml_error}"
    if not line:
        return None, "NVML's event has no line and no recovery action was read with it"
    return None, ""
