"""XIDs judged by their cause: NVIDIA's XID catalog resolution bucket, and the suite's own kills.

An XID is the driver's report of an error on one GPU. Many are the application's doing: an
out-of-bounds access (13), an MMU fault (31), a software-raised stop (43), or the driver tearing
down the work of a process that was killed (45, logged for Ctrl-C and SIGKILL alike). The suite
kills ranks itself, on a deadline or when a peer failed, so a run that stops a job with GPU work in
flight commonly logs Xid 45 on a perfectly healthy GPU. Blaming the GPU for it drains good nodes.

Source of the classes: NVIDIA, *Analyzing Xid Errors with the Xid Catalog*
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column "Resolution Bucket
(Immediate Action)", for Ampere and newer GPUs: the rows are ``xid_catalog.CATALOG_ROWS``, each
citing its source, checked against a saved excerpt of the catalog. The catalog's bucket is kept
as written (:attr:`XidClass.bucket`); :data:`BUCKET_ACTIONS` says what the suite does with each:

- a warning, recorded and never a suspect, where the catalog asks nothing of the GPU:
  ``RESTART_APP`` (restart the application), ``IGNORE`` (no action required), ``RESTART_VM`` (restart
  the VM; "RESET_GPU or RESTART_BM is not deemed necessary"), ``XID_154_EVAL`` (a decoded NVLink5
  line: with an Xid 154, take its action, which is judged on its own; without, RESTART_APP) and
  ``WORKFLOW_XID_45`` (with another
  XID: follow that one, which is judged on its own; its trigger conditions: "Control-C, GPU resets,
  sigkill are all examples where the application is aborted and this event is created");
- a suspect with the action "reset GPU" for ``RESET_GPU``, ``WORKFLOW_XID_48`` (solo: RESET_GPU),
  ``WORKFLOW_NVLINK_ERR`` ("A GPU reset or node reboot is needed to clear this error"),
  ``WORKFLOW_NVLINK5_ERR`` (Xid 144-150: the line's registers decoded on the catalog's "XID 144-150
  Decode" sheet, `xid_nvlink5`, give the bucket; a line it cannot decode keeps this one, judged as
  the sheet's fatal decodes are, RESET_GPU) and ``CHECK_UVM`` (RESET_GPU where UVM is in use, as
  CUDA applications do);
- a suspect with "drain node" for ``RESTART_BM`` (reboot the node), ``CHECK_MECHANICALS`` (check the
  GPU's seating and connections), ``XID_154`` and ``CONTACT_SUPPORT``; "fix node setup" for
  ``UPDATE_SWFW``.

An Xid 154 line names the recovery action the GPU needs (NVML's ``nvmlDeviceGpuRecoveryAction_t``
code, `xid_recovery`): it is judged by that action, as the bucket whose rung fits it (0x0 None:
IGNORE, a warning; 0x1 GPU reset, 0x4 drain and reset, 0x6 bus reset: RESET_GPU; 0x2 node reboot,
0x7 system reboot: RESTART_BM); Drain P2P, IMEX-domain recovery, an unknown code or a line naming
none keep ``XID_154``, "drain node". An NVML event has no line: the code NVML read when it arrived
(the event's ``recovery_action``) is judged the same way; without one it stays "drain node", saying why.

Counters judge the memory on their own (``health.COUNTERS``, ``STATES``): a pending or failed row
remap, an uncorrectable ECC count that rose, are suspects whatever bucket the XID beside them has.

An XID not in :data:`XID_CLASSES` is a suspect ("drain node", look it up in the catalog): an
unknown code is never taken for a harmless one. A warning-class XID inside the window of a job
the suite itself stopped (:class:`KillWindow`, from results.json's ``jobs`` with ``status`` failed)
is attributed to that kill in its warning; a suspect-class XID is a suspect wherever it falls
(a kill does not make a GPU fall off the bus).

Pure: no torch, no pytest, no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pytest_gpucluster.checks.burnin.xid_catalog import CATALOG_ROWS, SOURCES, CatalogBucket
from pytest_gpucluster.checks.burnin.xid_nvlink5 import decode
from pytest_gpucluster.checks.burnin.xid_recovery import recovery_of

__all__ = [
    "BUCKET_ACTIONS",
    "BUCKET_ADVICE",
    "KILL_GRACE_S",
    "UNKNOWN_ACTION",
    "WARNING_BUCKETS",
    "XID_CLASSES",
    "KillWindow",
    "XidClass",
    "classify",
    "classify_event",
    "event_time",
    "kill_window_of",
    "kill_windows",
]

Action = Literal["rerun", "fix node setup", "drain node", "reset GPU", "RMA"]

WARNING_BUCKETS: frozenset[CatalogBucket] = frozenset(
    {"RESTART_APP", "IGNORE", "RESTART_VM", "WORKFLOW_XID_45", "XID_154_EVAL"}
)
"""The catalog's buckets that ask nothing of the GPU: an XID in one is recorded as a warning."""

BUCKET_ACTIONS: Mapping[CatalogBucket, Action] = {
    "RESTART_APP": "rerun",
    "IGNORE": "rerun",
    "RESTART_VM": "rerun",
    "WORKFLOW_XID_45": "rerun",
    "XID_154_EVAL": "rerun",
    "RESET_GPU": "reset GPU",
    "WORKFLOW_XID_48": "reset GPU",
    "WORKFLOW_NVLINK_ERR": "reset GPU",
    "WORKFLOW_NVLINK5_ERR": "reset GPU",
    "CHECK_UVM": "reset GPU",
    "RESTART_BM": "drain node",
    "CHECK_MECHANICALS": "drain node",
    "XID_154": "drain node",
    "CONTACT_SUPPORT": "drain node",
    "UPDATE_SWFW": "fix node setup",
}
"""The project's rung (results/findings.py LADDER) for each catalog bucket (module docstring: why)."""

BUCKET_ADVICE: Mapping[CatalogBucket, str] = {
    "RESTART_APP": "restart the application; a GPU reset or reboot is not deemed necessary, the GPU is not blamed",
    "IGNORE": "no action required; the GPU is not blamed (its ECC and remap counters are judged on their own)",
    "RESTART_VM": "restart the VM that owns the GPU; a GPU reset or reboot is not deemed necessary",
    "WORKFLOW_XID_45": "with another XID follow that one; a killed or aborted application logs it, the GPU is "
    "not blamed (solo and unexplained, the catalog says restart the fabric manager)",
    "XID_154_EVAL": "with an Xid 154 beside it take the action that one names (it is judged on its own); "
    "without, restart the application",
    "RESET_GPU": "drain the node and reset the GPU (nvidia-smi -r), then rerun its burn-in",
    "WORKFLOW_XID_48": "drain the node and reset the GPU (with Xid 63/64: drain and reset); run the field "
    "diagnostics if it comes back",
    "WORKFLOW_NVLINK_ERR": "drain the node and reset the GPU (or reboot the node) to clear the NVLink error; "
    "contact the vendor if it comes back",
    "WORKFLOW_NVLINK5_ERR": "drain the node and reset the GPU: the line did not decode on the catalog's 'XID "
    "144-150 Decode' sheet, so it is judged as the sheet's fatal decodes are",
    "CHECK_UVM": "drain the node and reset the GPU where UVM or vGPU is in use (CUDA applications use UVM)",
    "RESTART_BM": "drain the node and reboot it; contact support if it comes back",
    "CHECK_MECHANICALS": "drain the node and check that the GPU is seated and its power connected",
    "XID_154": "drain the node and do the recovery action the XID 154 line names (drain P2P, recover the "
    "IMEX domain), then read the GPU's recovery action again (nvidia-smi -q); a line naming no known "
    "action: look it up",
    "CONTACT_SUPPORT": "drain the node and contact your support organization",
    "UPDATE_SWFW": "update the driver and firmware, then rerun",
}
"""What to do about an XID of each catalog bucket (the catalog's "Guidance Classes", and the suite's part)."""


@dataclass(frozen=True, slots=True)
class XidClass:
    xid: int
    mnemonic: str
    """The catalog's mnemonic (``ROBUST_CHANNEL_...``)."""
    name: str
    """The catalog's description."""
    bucket: CatalogBucket
    """The catalog's "Resolution Bucket (Immediate Action)", as written."""
    source: str
    """Where the bucket comes from: a key of ``xid_catalog.SOURCES``."""
    decoded: str = ""
    """For an NVLink5 XID whose line was decoded (`xid_nvlink5`): what the decode read; the bucket is
    then the decode sheet's."""

    @property
    def warning(self) -> bool:
        """The catalog asks nothing of the GPU: recorded as a warning, never a suspect."""
        return self.bucket in WARNING_BUCKETS

    @property
    def action(self) -> Action:
        """The project's rung (results/findings.py LADDER) for this bucket."""
        return BUCKET_ACTIONS[self.bucket]

    @property
    def advice(self) -> str:
        return BUCKET_ADVICE[self.bucket]

    @property
    def cited(self) -> str:
        """The full citation of :attr:`source`."""
        return SOURCES[self.source]


XID_CLASSES: Mapping[int, XidClass] = {
    xid: XidClass(xid, mnemonic, name, bucket, source)
    for source, rows in CATALOG_ROWS.items()
    for xid, mnemonic, name, bucket in rows
}
"""XIDs by the catalog's resolution bucket, each citing its source (module docstring)."""

UNKNOWN_ACTION: Action = "drain node"
"""An XID this table does not hold: a suspect, drained and looked at."""


def classify(xid: int) -> XidClass | None:
    """The catalog class of ``xid``, or None for a code this table does not hold (a suspect)."""
    return XID_CLASSES.get(xid)


def classify_event(
    xid: int, line: str | None, recovery_action: object = None, recovery_error: str | None = None
) -> XidClass | None:
    """:func:`classify`, with an NVLink5 XID (``WORKFLOW_NVLINK5_ERR``) whose log line decodes on the
    catalog's "XID 144-150 Decode" sheet given that sheet's bucket, and an Xid 154 whose line names a
    known recovery action given that action's bucket (`xid_recovery`); an Xid 154 without a line
    (an NVML event) is judged by the code NVML read with it (``recovery_action``; where the read
    failed, ``recovery_error`` says why and the bucket stays ``XID_154``)."""
    found = classify(xid)
    if found is not None and found.bucket == "XID_154":
        change, why = recovery_of(line, recovery_action, recovery_error)
        if change is None:
            return dataclasses.replace(found, decoded=why) if why else found
        if change.action is None:
            return dataclasses.replace(found, decoded=str(change))
        return dataclasses.replace(found, bucket=change.action.bucket, decoded=str(change))
    if found is None or found.bucket != "WORKFLOW_NVLINK5_ERR":
        return found
    decoded = decode(xid, line or "")
    if decoded is None or decoded.bucket not in BUCKET_ACTIONS:
        return found
    bucket: CatalogBucket = decoded.bucket  # type: ignore[assignment]
    return dataclasses.replace(found, bucket=bucket, decoded=str(decoded))


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
