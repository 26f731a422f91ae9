"""XIDs judged by their cause: NVIDIA's XID catalog resolution bucket, and the suite's own kills.

An XID is the driver's report of an error on one GPU. Many are the application's doing: an
out-of-bounds access (13), an MMU fault (31), a software-raised stop (43), or the driver tearing
down the work of a process that was killed (45, logged for Ctrl-C and SIGKILL alike). The suite
kills ranks itself, on a deadline or when a peer failed, so a run that stops a job with GPU work in
flight commonly logs Xid 45 on a perfectly healthy GPU. Blaming the GPU for it drains good nodes.

Source of the classes: NVIDIA, *Analyzing Xid Errors with the Xid Catalog*
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column "Resolution Bucket
(Immediate Action)", for Ampere and newer GPUs; the per-XID notes of *Xid Errors*
(https://docs.nvidia.com/deploy/xid-errors/) for 45 ("Ctrl-C, GPU reset, sigkill are all examples
where the application is aborted and this event is created"). Buckets used here:

- ``RESTART_APP``: restart the application; the GPU is fine. Recorded as a warning, never a suspect.
- ``RESET_GPU``: the GPU needs a reset (``nvidia-smi -r``) before it is used again: a suspect,
  action "reset GPU".
- ``RESTART_BM``: reboot the node (bare metal): a suspect, action "drain node".
- ``RMA``: the part is to be returned (the catalog's investigatory action for row-remap failures,
  64): a suspect, action "RMA".

An XID not in :data:`XID_CLASSES` is a suspect ("drain node", look it up in the catalog): an
unknown code is never taken for a harmless one. An application-class XID inside the window of a job
the suite itself stopped (:class:`KillWindow`, from results.json's ``jobs`` with ``status`` failed)
is attributed to that kill in its warning; a reset/reboot-class XID is a suspect wherever it falls
(a kill does not make a GPU fall off the bus).

Pure: no torch, no pytest, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "KILL_GRACE_S",
    "UNKNOWN_ACTION",
    "XID_CLASSES",
    "KillWindow",
    "XidClass",
    "classify",
    "event_time",
    "kill_window_of",
    "kill_windows",
]

Bucket = Literal["RESTART_APP", "RESET_GPU", "RESTART_BM", "RMA"]
Action = Literal["rerun", "drain node", "reset GPU", "RMA"]


@dataclass(frozen=True, slots=True)
class XidClass:
    xid: int
    name: str
    """The catalog's description, shortened."""
    bucket: Bucket
    """The catalog's immediate-action bucket (``RMA``: its investigatory action)."""

    @property
    def application(self) -> bool:
        return self.bucket == "RESTART_APP"

    @property
    def action(self) -> Action:
        """The project's rung (results/findings.py LADDER) for this bucket."""
        return {"RESTART_APP": "rerun", "RESET_GPU": "reset GPU", "RESTART_BM": "drain node", "RMA": "RMA"}[
            self.bucket
        ]

    @property
    def advice(self) -> str:
        return {
            "RESTART_APP": "restart the application; the GPU is not blamed",
            "RESET_GPU": "drain the node and reset the GPU (nvidia-smi -r), then rerun its burn-in",
            "RESTART_BM": "drain the node and reboot it; RMA the GPU if it comes back",
            "RMA": "drain the node: the GPU has no spare memory rows left, return it (RMA)",
        }[self.bucket]


def _table(*rows: tuple[int, str, Bucket]) -> Mapping[int, XidClass]:
    return {xid: XidClass(xid, name, bucket) for xid, name, bucket in rows}


XID_CLASSES: Mapping[int, XidClass] = _table(
    (8, "GPU stopped processing (idle timeout)", "RESTART_APP"),
    (11, "invalid or corrupted push buffer stream", "RESTART_APP"),
    (13, "graphics engine exception", "RESTART_APP"),
    (31, "GPU memory page fault", "RESTART_APP"),
    (32, "invalid or corrupted push buffer stream (PCIe DMA)", "RESET_GPU"),
    (38, "driver firmware error", "RESET_GPU"),
    (43, "GPU stopped processing (software-raised stop)", "RESTART_APP"),
    (45, "preemptive cleanup, due to previous errors (process killed)", "RESTART_APP"),
    (48, "double-bit ECC error", "RESET_GPU"),
    (54, "auxiliary power is not connected", "RESTART_BM"),
    (61, "internal micro-controller breakpoint/warning", "RESET_GPU"),
    (62, "internal micro-controller halt", "RESET_GPU"),
    (63, "ECC page retirement or row remapping recording event", "RESET_GPU"),
    (64, "ECC page retirement or row remapper recording failure", "RMA"),
    (74, "NVLink error", "RESET_GPU"),
    (79, "GPU has fallen off the bus", "RESTART_BM"),
    (92, "high single-bit ECC error rate", "RESET_GPU"),
    (94, "contained ECC error (row remap pending)", "RESET_GPU"),
    (95, "uncontained ECC error", "RESET_GPU"),
    (109, "context switch timeout", "RESET_GPU"),
    (119, "GSP RPC timeout", "RESET_GPU"),
    (120, "GSP error", "RESET_GPU"),
    (140, "unrecovered ECC error", "RESET_GPU"),
    (149, "NVLink fatal error", "RESET_GPU"),
    (154, "GPU recovery action changed", "RESET_GPU"),
)
"""XIDs by the catalog's resolution bucket (module docstring: source)."""

UNKNOWN_ACTION: Action = "drain node"
"""An XID this table does not hold: a suspect, drained and looked at."""


def classify(xid: int) -> XidClass | None:
    """The catalog class of ``xid``, or None for a code this table does not hold (a suspect)."""
    return XID_CLASSES.get(xid)


# ----------------------------------------------------------------------------------- kills

KILL_GRACE_S = 30.0
"""How long after a stopped job an XID is still its kill's: the driver tears a killed process's GPU
work down when its last reference closes, within seconds of the SIGKILL."""


@dataclass(frozen=True, slots=True)
class KillWindow:
    """A job the suite itself stopped (a deadline, a failed peer): its ranks were killed."""

    job: str
    start: float
    end: float
    """Wall-clock seconds (``time.time()``)."""
    nodes: tuple[str, ...] = ()
    """The hosts it ran on, where results.json names them (empty: any host)."""

    def holds(self, when: float, host: str | None = None) -> bool:
        on_host = not self.nodes or host is None or host in self.nodes
        return on_host and self.start <= when <= self.end + KILL_GRACE_S


def kill_windows(jobs: Iterable[Mapping[str, Any]]) -> list[KillWindow]:
    """The windows of results.json's ``jobs`` whose status says the suite stopped them (``failed``:
    a rank failed or the deadline passed, and the launcher killed the job's other ranks)."""
    out = []
    for job in jobs:
        start, end = job.get("started_at"), job.get("ended_at")
        if (
            job.get("status") != "failed"
            or not isinstance(start, (int, float))
            or not isinstance(end, (int, float))
        ):
            continue
        hosts = job.get("hosts") or ()
        name = str(job.get("job_id") or ",".join(job.get("parts") or ()) or "a job")
        out.append(KillWindow(name, float(start), float(end), tuple(str(h) for h in hosts)))
    return out


_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def event_time(event: Mapping[str, Any]) -> float | None:
    """When an XID event happened: NVML's ``time``, else the ISO timestamp ``journalctl -o
    short-iso`` starts its line with; None for a line without one (``dmesg``'s seconds since boot)."""
    when = event.get("time")
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return float(when)
    match = _ISO.match(str(event.get("line") or ""))
    if not match:
        return None
    text = match[1].replace(",", ".")
    if re.search(r"[+-]\d{4}$", text):
        text = f"{text[:-2]}:{text[-2:]}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def kill_window_of(event: Mapping[str, Any], host: str, windows: Sequence[KillWindow]) -> KillWindow | None:
    """The stopped job whose window holds ``event`` on ``host``, if any."""
    when = event_time(event)
    if when is None:
        return None
    return next((w for w in windows if w.holds(when, host)), None)
