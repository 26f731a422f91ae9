"""What jobs left on one node: their processes (by job id and session) and DeepSpeed shm segments.

Runs on every node a session uses, locally or through the remote-exec prefix:

- ``python -m pytest_gpucluster.launch.leftovers --list`` prints one JSON line (`NodeScan`):
  every process whose environment carries a job id (``GPUCLUSTER_JOB_ID``), with the session
  that launched it (``GPUCLUSTER_SESSION``), and every ``/dev/shm/deepspeed_*`` segment with
  the pids that still map it;
- ``python -m pytest_gpucluster.launch.leftovers --reap JOB_ID... [--remove-shm NAME...]``
  stops those jobs' processes (`launch.reaper.terminate_job`) and removes those segments,
  and prints what it did as one JSON line.

Deciding what is a leftover (whose session is gone) is the controller's job
(`launch.leftover_check`); this module only reads and, when told, kills.

A session is named by a `SessionTag`, ``host:pid:start`` of the pytest process that owns it
(start = its start time in clock ticks since boot, so a reused pid is not mistaken for it).

Standard library only (it runs on remote nodes).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_gpucluster.launch.reaper import (
    is_zombie,
    proc_pids,
    process_start_ticks,
    read_proc_file,
    terminate_job,
)
from pytest_gpucluster.workloads._runtime import JOB_ID_ENV, SESSION_ENV

__all__ = [
    "LEFTOVERS_MODULE",
    "JobProcess",
    "NodeScan",
    "SessionTag",
    "ShmSegment",
    "deepspeed_segments",
    "job_processes",
    "reap",
    "scan_node",
]

LEFTOVERS_MODULE = "pytest_gpucluster.launch.leftovers"
SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_"
"""DeepSpeed's CPU comm names its segments ``deepspeed_allreduce_buffer_<n>_<addr>_<port>_<local rank>``."""
OwnerState = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True, slots=True)
class SessionTag:
    """The pytest process that owns a session: ``host:pid:start``."""

    host: str
    pid: int
    start: int

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, text: str | None) -> SessionTag | None:
        """The tag in ``text``, or None when there is none or it is not one."""
        host, _, rest = (text or "").rpartition(":")
        host, _, pid = host.rpartition(":")
        if not host or not pid.isdigit() or not rest.isdigit():
            return None
        return cls(host=host, pid=int(pid), start=int(rest))

    @classmethod
    def of_process(cls, pid: int | None = None, host: str | None = None) -> SessionTag:
        """The tag of a live process on this machine (default: this one)."""
        pid = os.getpid() if pid is None else pid
        start = process_start_ticks(pid)
        if start is None and pid == os.getpid():
            start = 0  # no /proc (not Linux): the tag still names this process, if less surely
        if start is None:
            raise ProcessLookupError(f"no process {pid} on this machine")
        return cls(host=host or socket.gethostname(), pid=pid, start=start)

    def state_here(self, host: str | None = None, proc: str = "/proc") -> OwnerState:
        """Is the owner alive? Only answerable on the owner's own machine ("unknown" elsewhere)."""
        if self.host != (host or socket.gethostname()):
            return "unknown"
        if process_start_ticks(self.pid, proc) != self.start or is_zombie(self.pid, proc):
            return "dead"
        return "alive"


@dataclass(frozen=True, slots=True)
class JobProcess:
    pid: int
    job_id: str
    session: str | None
    """The raw ``GPUCLUSTER_SESSION`` value (None: the process carries none)."""
    command: str
    """Its command line, shortened, for people."""


@dataclass(frozen=True, slots=True)
class ShmSegment:
    path: str
    size_bytes: int
    mapped_by: tuple[int, ...]
    """Live pids that map it; a segment nobody maps is stale."""


@dataclass(frozen=True, slots=True)
class NodeScan:
    host: str
    processes: tuple[JobProcess, ...] = ()
    shm: tuple[ShmSegment, ...] = ()
    error: str | None = None
    """Why the node could not be scanned (unreachable, no Python there...)."""
    boot_id: str = ""
    """The kernel's boot id: nodes that show the same one share a kernel, and their processes."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeScan:
        return cls(
            host=str(data["host"]),
            processes=tuple(JobProcess(**p) for p in data.get("processes") or ()),
            shm=tuple(
                ShmSegment(path=s["path"], size_bytes=int(s["size_bytes"]), mapped_by=tuple(s["mapped_by"]))
                for s in data.get("shm") or ()
            ),
            error=data.get("error"),
            boot_id=str(data.get("boot_id") or ""),
        )


def _environ(pid: int, proc: str) -> dict[bytes, bytes] | None:
    raw = read_proc_file(pid, "environ", proc)
    if raw is None:
        return None
    return dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)


def _command(pid: int, proc: str) -> str:
    raw = read_proc_file(pid, "cmdline", proc)
    if raw is None:
        return "?"
    line = " ".join(a.decode("utf-8", errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
    return line if len(line) <= 200 else line[:197] + "..."


def job_processes(proc: str = "/proc") -> list[JobProcess]:
    """Every live process here whose environment carries a job id (never this one)."""
    found = []
    me = os.getpid()
    key, session_key = JOB_ID_ENV.encode(), SESSION_ENV.encode()
    for pid in proc_pids(proc):  # no /proc: nothing can be found (and nothing was launched by us)
        env = _environ(pid, proc) if pid != me else None
        if not env or key not in env or is_zombie(pid, proc):
            continue
        session = env.get(session_key)
        found.append(
            JobProcess(
                pid=pid,
                job_id=env[key].decode("utf-8", errors="replace"),
                session=session.decode("utf-8", errors="replace") if session is not None else None,
                command=_command(pid, proc),
            )
        )
    return found


def deepspeed_segments(shm: str = SHM_DIR, proc: str = "/proc") -> list[ShmSegment]:
    """DeepSpeed's shared-memory segments here, each with the live pids that map it."""
    try:
        paths = sorted(p for p in Path(shm).iterdir() if p.name.startswith(SHM_PREFIX) and p.is_file())
    except OSError:
        return []
    if not paths:
        return []
    mapped: dict[str, list[int]] = {str(p): [] for p in paths}
    needles = {str(p): str(p).encode() for p in paths}
    for pid in proc_pids(proc):
        maps = read_proc_file(pid, "maps", proc)
        if maps is None:
            continue
        for path, needle in needles.items():
            if needle in maps:
                mapped[path].append(pid)
    segments = []
    for path in paths:
        try:
            size = path.stat().st_size
        except OSError:
            continue  # removed meanwhile
        segments.append(ShmSegment(path=str(path), size_bytes=size, mapped_by=tuple(mapped[str(path)])))
    return segments


def _boot_id(proc: str) -> str:
    try:
        return Path(f"{proc}/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def scan_node(proc: str = "/proc", shm: str = SHM_DIR, host: str | None = None) -> NodeScan:
    return NodeScan(
        host=host or socket.gethostname(),
        processes=tuple(job_processes(proc)),
        shm=tuple(deepspeed_segments(shm, proc)),
        boot_id=_boot_id(proc),
    )


def reap(job_ids: Sequence[str], shm_names: Sequence[str] = (), shm: str = SHM_DIR) -> dict[str, Any]:
    """Stop the processes of ``job_ids`` and remove the named DeepSpeed segments of ``shm``.

    Returns ``{"survivors": {job_id: [pids]}, "removed": [...], "not_removed": {name: why}}``.
    Only names starting with ``deepspeed_`` directly inside ``shm`` are ever removed.
    """
    survivors = {job_id: terminate_job(job_id, dump_stacks=True) for job_id in job_ids}
    removed: list[str] = []
    refused: dict[str, str] = {}
    for name in shm_names:
        target = Path(shm) / Path(name).name
        if not target.name.startswith(SHM_PREFIX) or Path(name).parent not in (Path("."), Path(shm)):
            refused[name] = f"not a DeepSpeed segment in {shm}"
            continue
        try:
            target.unlink()
            removed.append(str(target))
        except OSError as exc:
            refused[name] = str(exc)
    return {
        "survivors": {k: v for k, v in survivors.items() if v},
        "removed": removed,
        "not_removed": refused,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--list"]:
        print(json.dumps(scan_node().to_json()))
        return 0
    if args[:1] == ["--reap"]:
        rest = args[1:]
        jobs = rest[: rest.index("--remove-shm")] if "--remove-shm" in rest else rest
        names = rest[rest.index("--remove-shm") + 1 :] if "--remove-shm" in rest else []
        if jobs or names:
            done = reap(jobs, names)
            print(json.dumps(done))
            return 1 if done["survivors"] or done["not_removed"] else 0
    print(
        f"usage: python -m {LEFTOVERS_MODULE} --list\n"
        f"       python -m {LEFTOVERS_MODULE} --reap [JOB_ID...] [--remove-shm NAME...]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
