"""A node's XID events (the NVIDIA driver's error reports), from wherever this rank may read them.

XIDs are written to the kernel log, which ordinary users often cannot read: ``kernel.dmesg_restrict=1``
(the default of Debian, Ubuntu and Fedora kernels) makes ``dmesg`` fail with "read kernel buffer
failed: Operation not permitted"; ``journalctl`` shows the kernel's messages only to root and the
``adm``/``systemd-journal`` groups (otherwise it prints a hint, or "No journal files were opened due
to insufficient permissions"); ``/var/log/kern.log`` is ``root:adm``. :func:`kernel_xids` tries
``journalctl -k``, ``dmesg``, ``/var/log/kern.log`` and ``/var/log/messages`` in that order and takes
the first one that is readable *and* holds kernel messages (a journal without the kernel's log, as
in many containers, proves nothing). When none is, it says why for each: the parent records that
as a check that does not pass, never as "no XID".

:class:`NvmlXidListener` listens to NVML's XID events on one GPU (``nvmlEventTypeXidCriticalError``)
for the span of the health job's load: no log access needed, but it only sees events that happen
while it listens.

An NVML event carries the XID's number, not the driver's line, so an Xid 154 heard there does not say
which recovery action the GPU now needs. :func:`nvml_event` reads it from NVML at once
(:func:`recovery_action`) and stores its code beside the XID (``recovery_action``), or why it could
not (``recovery_action_error``); `checks/burnin/xid_recovery.py` judges the code as it judges the
line's.

Rank-side: standard library only; pynvml is handed in by the caller.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "LOG_FILES",
    "RECOVERY_ACTION_FIELD",
    "NvmlXidListener",
    "kernel_log",
    "kernel_xids",
    "nvml_event",
    "parse_xid_lines",
    "read_tail",
    "recovery_action",
    "run_command",
]

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)")
"""``NVRM: Xid (PCI:0000:3b:00): 79, ...``; old drivers wrote ``(0000:01:00)`` without ``PCI:``."""
LOG_FILES = ("/var/log/kern.log", "/var/log/messages")
TAIL_BYTES = 64 << 20
"""A syslog file can be gigabytes; its last 64 MiB hold this boot's recent kernel messages."""
_JOURNAL_DENIED = (
    "insufficient permissions",
    "not seeing messages from other users and the system",
    "not seeing messages from the system",
    "no journal files were found",
)

RECOVERY_ACTION_FIELD = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (nvml.h; nvidia-ml-py names it too): the GPU's current
``nvmlDeviceGpuRecoveryAction_t`` as a field value, what ``nvidia-smi -q``'s "GPU Recovery Action"
reads. Drivers before the field answer it ``NVML_ERROR_NOT_SUPPORTED`` in the value's own status."""
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""``nvmlValueType_t`` to the member of ``nvmlValue_t`` holding the number."""

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
TailReader = Callable[[str], str]


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` lines of a kernel
    log, each as ``{"pci": "0000:3b:00", "xid": 79, "line": ...}`` (the line kept for
    telling a new event from one already seen: log lines carry their timestamp)."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            events.append(
                {"pci": match["pci"].lower(), "xid": int(match["xid"]), "line": line.strip()[-300:]}
            )
    return events


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def read_tail(path: str) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - TAIL_BYTES))
        return handle.read().decode("utf-8", errors="replace")


def _has_kernel_lines(text: str) -> bool:
    return any(line.strip() and not line.startswith("-- ") for line in text.splitlines())


def _command(name: str, argv: Sequence[str], run: Runner) -> tuple[str | None, str]:
    """(output, "") when readable, else (None, why)."""
    try:
        done = run(argv)
    except FileNotFoundError:
        return None, f"{name}: not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{name}: {type(exc).__name__}: {exc}"
    said = " ".join(f"{done.stderr or ''} {done.stdout or ''}".split())
    if done.returncode != 0:
        return None, f"{name}: exit {done.returncode}: {said[:200] or 'no message'}"
    denied = (
        next((d for d in _JOURNAL_DENIED if d in said.lower()), None)
        if name.startswith("journalctl")
        else None
    )
    if denied:
        return None, f"{name}: {' '.join((done.stderr or '').split())[:240] or denied}"
    if not _has_kernel_lines(done.stdout or ""):
        return None, f"{name}: no kernel message at all (a log without the kernel's ring buffer)"
    return done.stdout, ""


def kernel_log(run: Runner = run_command, tail: TailReader = read_tail) -> dict[str, Any]:
    """``{"text": ..., "source": "journalctl -k"}`` from the first readable kernel log, or
    ``{"text": None, "why": "journalctl -k: ...; dmesg: ...; /var/log/kern.log: ..."}``."""
    reasons: list[str] = []
    for name, argv in (
        ("journalctl -k", ["journalctl", "-k", "--no-pager", "-o", "short-iso"]),
        ("dmesg", ["dmesg"]),
    ):
        text, why = _command(name, argv, run)
        if text is not None:
            return {"text": text, "source": name}
        reasons.append(why)
    for path in LOG_FILES:
        try:
            text = tail(path)
        except OSError as exc:
            reasons.append(f"{path}: {exc.strerror or type(exc).__name__}")
            continue
        if _has_kernel_lines(text):
            return {"text": text, "source": path}
        reasons.append(f"{path}: empty")
    return {"text": None, "why": "; ".join(reasons)}


def kernel_xids(run: Runner = run_command, tail: TailReader = read_tail) -> dict[str, Any]:
    """``{"events": [...], "source": "journalctl -k"}`` from the first readable kernel log, or
    ``{"events": None, "why": "journalctl -k: ...; dmesg: ...; /var/log/kern.log: ..."}``."""
    found = kernel_log(run, tail)
    if found["text"] is None:
        return {"events": None, "why": found["why"]}
    return {"events": parse_xid_lines(found["text"]), "source": found["source"]}


def _binding_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def recovery_action(pynvml: Any, handle: Any) -> tuple[int | None, str]:
    """The GPU's current recovery action code (``nvmlDeviceGpuRecoveryAction_t``), or ``(None, why)``.

    ``pynvml.nvmlDeviceGetGpuRecoveryAction`` where the installed nvidia-ml-py has it (13.615.71,
    the newest at the time of writing, does not), else the field value :data:`RECOVERY_ACTION_FIELD`
    through ``nvmlDeviceGetFieldValues``. The reasons name each way tried and what it answered."""
    reasons: list[str] = []
    getter = getattr(pynvml, "nvmlDeviceGetGpuRecoveryAction", None)
    if getter is None:
        reasons.append(f"nvidia-ml-py {_binding_version()} has no nvmlDeviceGetGpuRecoveryAction")
    else:
        try:
            return int(getter(handle)), ""
        except Exception as exc:
            reasons.append(f"nvmlDeviceGetGpuRecoveryAction: {type(exc).__name__}: {exc}")
    field = int(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD))
    name = f"nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION={field})"
    try:
        (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field])
    except Exception as exc:
        reasons.append(f"{name}: {type(exc).__name__}: {exc}")
        return None, "; ".join(reasons)
    status = int(value.nvmlReturn)
    if status != 0:
        try:
            said = f"{type(pynvml.NVMLError(status)).__name__}: {pynvml.NVMLError(status)}"
        except Exception:  # an error class that cannot name this status
            said = f"NVML error {status}"
        reasons.append(f"{name}: {said}")
        return None, "; ".join(reasons)
    number = getattr(value.value, _VALUE_ATTR.get(int(value.valueType), "uiVal"))
    if isinstance(number, float) and not number.is_integer():
        reasons.append(f"{name}: not a whole number ({number!r})")
        return None, "; ".join(reasons)
    return int(number), ""


def nvml_event(pynvml: Any, data: Any) -> dict[str, Any]:
    """One NVML XID event (``nvmlEventData_t``) as the suite records it: ``{"xid", "source"}``, and
    for an Xid 154 the GPU's recovery action read at once (``recovery_action``, else
    ``recovery_action_error``: why not), since the event carries no line naming it."""
    event: dict[str, Any] = {"xid": int(data.eventData), "source": "nvml"}
    if event["xid"] == 154:
        code, why = recovery_action(pynvml, data.device)
        if code is None:
            event["recovery_action_error"] = why
        else:
            event["recovery_action"] = code
    return event


class NvmlXidListener:
    """XID events NVML reports for one GPU while this listener is open (``drain`` collects them)."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._nvml = pynvml
        self._set = pynvml.nvmlEventSetCreate()
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
        except Exception:
            pynvml.nvmlEventSetFree(self._set)
            raise
        self._wait = getattr(pynvml, "nvmlEventSetWait_v2", None) or pynvml.nvmlEventSetWait

    def drain(self) -> list[dict[str, Any]]:
        """Every event queued so far (a timeout of 0: NVML answers at once)."""
        events: list[dict[str, Any]] = []
        while True:
            try:
                data = self._wait(self._set, 0)
            except Exception as exc:  # NVMLError_Timeout: nothing (more) queued
                if "Timeout" not in type(exc).__name__:
                    raise
                return events
            events.append(nvml_event(self._nvml, data))

    def close(self) -> None:
        self._nvml.nvmlEventSetFree(self._set)
