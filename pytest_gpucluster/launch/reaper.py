"""Find every process of a job in /proc and stop them all; also the remote reaper's entry point.

Every process of a job carries ``GPUCLUSTER_JOB_ID=<id>`` in its environment (set on the
agents, inherited by everything they start). That is how the whole job is found in /proc even
after reparenting: torchrun starts its workers in sessions of their own, so killing the agent's
process group alone would miss them. Killing goes: SIGUSR1 to the ranks (the worker registered
``faulthandler`` on it, so each hung rank's log gets its stack), a short grace, SIGTERM to
everything with the job id, then SIGKILL until nothing with the id is left.

On nodes whose processes are not in this machine's /proc (real remote nodes), the same kill
runs there as ``python -m pytest_gpucluster.launch.reaper --reap JOB_ID`` through the node's
remote-exec prefix.

Standard library only (it runs on remote nodes as a script).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence

from pytest_gpucluster.workloads._runtime import JOB_ID_ENV

__all__ = [
    "find_job_pids",
    "proc_pids",
    "process_start_ticks",
    "read_proc_file",
    "reap_argv",
    "terminate_job",
]

WORKER_MODULE = "pytest_gpucluster.workloads._worker"
POLL_S = 0.05


def proc_pids(proc: str = "/proc") -> list[int]:
    """Every pid in ``proc``, in order; none where there is no /proc."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    return sorted(int(entry) for entry in entries if entry.isdigit())


def read_proc_file(pid: int, name: str, proc: str = "/proc") -> bytes | None:
    """``/proc/<pid>/<name>``; None once the process is gone, or where it is not ours to read."""
    try:
        with open(f"{proc}/{pid}/{name}", "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _stat_fields(pid: int, proc: str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from the state on (field 3), or None if there is no process."""
    stat = read_proc_file(pid, "stat", proc)
    if stat is None:
        return None
    # They follow the parenthesised command name, which may itself contain ") ".
    return stat[stat.rfind(b")") + 2 :].split()


def is_zombie(pid: int, proc: str) -> bool:
    fields = _stat_fields(pid, proc)
    return fields is None or (bool(fields) and fields[0] in (b"Z", b"X"))


def process_start_ticks(pid: int, proc: str = "/proc") -> int | None:
    """When ``pid`` started (field 22 of /proc/<pid>/stat, clock ticks since boot): a pid and
    its start time name one process, even after the pid is reused. None if there is none."""
    fields = _stat_fields(pid, proc) or []
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def find_job_pids(job_id: str, proc: str = "/proc") -> list[int]:
    """Live pids whose environment holds ``GPUCLUSTER_JOB_ID=<job_id>`` (never this process)."""
    needle = f"{JOB_ID_ENV}={job_id}".encode()
    me = os.getpid()
    found = []
    for pid in proc_pids(proc):
        environ = read_proc_file(pid, "environ", proc) if pid != me else None
        if environ is not None and needle in environ.split(b"\0") and not is_zombie(pid, proc):
            found.append(pid)
    return found


def _is_worker(pid: int, proc: str = "/proc") -> bool:
    """A rank process (the agent's own argv names the worker module too, but it is no rank)."""
    cmdline = read_proc_file(pid, "cmdline", proc)
    if cmdline is None:
        return False
    args = cmdline.split(b"\0")
    # Only a process started as `python -m <worker>` is a rank: agents and engine front ends
    # (torchrun, srun, mpirun, the DeepSpeed runner) name the worker module further down their
    # argv, and SIGUSR1 would kill them instead of dumping a stack.
    head = args[:4]
    return any(
        a == b"-m" and i + 1 < len(head) and head[i + 1] == WORKER_MODULE.encode() for i, a in enumerate(head)
    )


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(job_id: str, seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    pids = find_job_pids(job_id)
    while pids and time.monotonic() < end:
        time.sleep(POLL_S)
        pids = find_job_pids(job_id)
    return pids


def terminate_job(
    job_id: str,
    *,
    dump_stacks: bool = True,
    dump_grace_s: float = 0.5,
    term_grace_s: float = 2.0,
    kill_wait_s: float = 3.0,
    groups: Sequence[int] = (),
) -> list[int]:
    """Stop every process of ``job_id`` on this machine; returns the pids that survived (none).

    ``groups``: process groups to signal as well (the agents' sessions), for a process that
    lost the job id from its environment.
    """
    if dump_stacks:
        workers = [pid for pid in find_job_pids(job_id) if _is_worker(pid)]
        _signal_all(workers, signal.SIGUSR1)
        if workers:
            time.sleep(dump_grace_s)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
    _signal_all(find_job_pids(job_id), signal.SIGTERM)
    pids = wait_gone(job_id, term_grace_s)
    end = time.monotonic() + kill_wait_s
    while True:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        _signal_all(pids, signal.SIGKILL)
        pids = wait_gone(job_id, 0.2)
        if not pids or time.monotonic() >= end:
            return pids


def reap_argv(python: str, job_id: str) -> list[str]:
    """The remote reaper's argv (to be wrapped in the node's remote-exec prefix)."""
    return [python, "-m", "pytest_gpucluster.launch.reaper", "--reap", job_id]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--reap":
        print("usage: python -m pytest_gpucluster.launch.reaper --reap JOB_ID", file=sys.stderr)
        return 2
    survivors = terminate_job(args[1], dump_stacks=True)
    if survivors:
        print(f"still alive after SIGKILL: {survivors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
