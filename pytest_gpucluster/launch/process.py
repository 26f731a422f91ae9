"""Start a job's agents, watch them against a deadline, and leave no process behind.

Every process of a job carries ``GPUCLUSTER_JOB_ID=<id>`` in its environment (set on the
agents, inherited by everything they start). That is how the whole job is found in /proc even
after reparenting: torchrun starts its workers in sessions of their own, so killing the agent's
process group alone would miss them. Killing goes: SIGUSR1 to the ranks (the worker registered
``faulthandler`` on it, so each hung rank's log gets its stack), a short grace, SIGTERM to
everything with the job id, then SIGKILL until nothing with the id is left.

While waiting, new lines of rank 0's ``progress.log`` go to a callback, and the rank files are
watched so that one failed rank (or a dead agent) stops the whole job after a short grace
instead of leaving the other ranks blocked in a collective until the timeout.

On nodes whose processes are not in this machine's /proc (real remote nodes), the same kill
runs there as ``python -m pytest_gpucluster.launch.process --reap JOB_ID`` through the
remote-exec prefix (see `run_commands`' ``reap_commands``).

If this process dies without cleaning up (SIGKILL, the OOM killer), the guard around every
agent (`launch.guard`) does it. A remote command gets a stdin pipe that stays open as long as
this process runs (it starts with `HELLO`): its guard on the far side takes end-of-file for
this process's death.

Standard library only (this module is also the remote reaper).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pytest_gpucluster.workloads._runtime import JOB_ID_ENV, PROGRESS_FILE

__all__ = [
    "HELLO",
    "ProcessOutcome",
    "find_job_pids",
    "process_start_ticks",
    "read_rank_states",
    "run_commands",
    "tail_lines",
    "terminate_job",
]

WORKER_MODULE = "pytest_gpucluster.workloads._worker"
POLL_S = 0.05
HELLO = b"gpucluster-controller-hello\n"
"""Written into the stdin pipe of every remote command: the far side's guard (`launch.guard`)
knows from it that stdin is forwarded, so a later end-of-file means the controller is gone."""


@dataclass(frozen=True)
class ProcessOutcome:
    """What happened to the processes of one job (the rank files say what the ranks did)."""

    agent_exit_codes: tuple[int | None, ...]
    """Per command, in order; negative = killed by that signal; None = never exited (cannot happen
    after a successful cleanup)."""
    agent_logs: tuple[Path, ...]
    duration_s: float
    timed_out: bool = False
    abort_reason: str | None = None
    """Why the job was stopped before its agents finished (a failed rank, a dead agent,
    a rendezvous that never completed); None when it ended by itself or timed out."""
    survivors: tuple[int, ...] = ()
    """Pids still alive after cleanup: should always be empty."""
    start_error: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- finding processes


def _is_zombie(pid: int, proc: str) -> bool:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    # The state follows the parenthesised command name, which may itself contain ") ".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def process_start_ticks(pid: int, proc: str = "/proc") -> int | None:
    """When ``pid`` started (field 22 of /proc/<pid>/stat, clock ticks since boot): a pid and
    its start time name one process, even after the pid is reused. None if there is none."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def find_job_pids(job_id: str, proc: str = "/proc") -> list[int]:
    """Live pids whose environment holds ``GPUCLUSTER_JOB_ID=<job_id>`` (never this process)."""
    needle = f"{JOB_ID_ENV}={job_id}".encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if needle in environ.split(b"\0") and not _is_zombie(int(entry), proc):
            found.append(int(entry))
    return sorted(found)


def _is_worker(pid: int, proc: str = "/proc") -> bool:
    """A rank process (the agent's own argv names the worker module too, but it is no rank)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return False
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


def _wait_gone(job_id: str, seconds: float) -> list[int]:
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
    pids = _wait_gone(job_id, term_grace_s)
    end = time.monotonic() + kill_wait_s
    while True:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        _signal_all(pids, signal.SIGKILL)
        pids = _wait_gone(job_id, 0.2)
        if not pids or time.monotonic() >= end:
            return pids


# --------------------------------------------------------------------------- job files


def tail_lines(path: Path, count: int = 15, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``count`` lines of a text file ([] if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(size - max_bytes, 0))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]


_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")


def read_rank_states(job_dir: Path) -> dict[int, dict]:
    """``rank -> record`` for every rank file written so far (see workloads._runtime)."""
    import json

    states: dict[int, dict] = {}
    try:
        names = os.listdir(job_dir)
    except OSError:
        return states
    for name in names:
        match = _RANK_FILE.match(name)
        if not match:
            continue
        try:
            states[int(match.group(1))] = json.loads((job_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # written atomically, so only a vanished file can land here
    return states


def _safe_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"


def agent_log_paths(job_dir: Path, hosts: Sequence[str]) -> list[Path]:
    """``agent-<host>.log`` per command; a host listed twice gets ``agent-<host>.<i>.log``."""
    paths: list[Path] = []
    seen: dict[str, int] = {}
    for host in hosts:
        name = _safe_name(host)
        count = seen.get(name, 0)
        seen[name] = count + 1
        paths.append(job_dir / (f"agent-{name}.log" if count == 0 else f"agent-{name}.{count}.log"))
    return paths


class _ProgressTail:
    def __init__(self, path: Path, callback: Callable[[str], None] | None) -> None:
        self.path = path
        self.callback = callback
        self.offset = 0
        self.partial = b""

    def poll(self, final: bool = False) -> None:
        if self.callback is None:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = b"" if final else lines.pop()
        for line in lines:
            if line:
                try:
                    self.callback(line.decode("utf-8", errors="replace"))
                except Exception:
                    self.callback = None
                    return


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class LaunchSpec:
    """The part of a job `run_commands` needs (kept small so it is easy to fake in tests)."""

    job_id: str
    job_dir: Path
    world_size: int
    timeout_s: float
    rendezvous_timeout_s: float = 60.0
    failure_grace_s: float = 5.0
    """After a rank fails or an agent dies, how long the other ranks get to finish on their own."""
    settle_s: float = 1.0
    """After the agents exit, how long leftover processes get before they are killed."""


def run_commands(
    spec: LaunchSpec,
    commands: Sequence[object],
    *,
    progress: Callable[[str], None] | None = None,
    reap_commands: Sequence[object] = (),
) -> ProcessOutcome:
    """Start ``commands`` (LaunchCommand-like: ``host``, ``argv``, ``env``), wait, clean up."""
    start = time.monotonic()
    deadline = start + spec.timeout_s
    logs = agent_log_paths(spec.job_dir, [c.host for c in commands])  # type: ignore[attr-defined]
    procs: list[subprocess.Popen | None] = []
    handles = []
    lifelines: list[IO[bytes]] = []  # stdin pipes of remote commands, open until their agents are done
    start_error: str | None = None
    timed_out = False
    abort_reason: str | None = None
    notes: list[str] = []
    progress_tail = _ProgressTail(spec.job_dir / PROGRESS_FILE, progress)
    try:
        for command, log_path in zip(commands, logs, strict=True):
            env = {**os.environ, **command.env, JOB_ID_ENV: spec.job_id}  # type: ignore[attr-defined]
            handle = open(log_path, "ab")  # noqa: SIM115 - closed in the finally below
            handles.append(handle)
            remote = bool(getattr(command, "remote", False))
            try:
                proc = subprocess.Popen(
                    list(command.argv),  # type: ignore[attr-defined]
                    env=env,
                    stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                procs.append(proc)
                if proc.stdin is not None:
                    lifelines.append(proc.stdin)
                    with contextlib.suppress(OSError):  # an agent that died at once
                        proc.stdin.write(HELLO)
                        proc.stdin.flush()
            except OSError as exc:
                procs.append(None)
                start_error = f"could not start the agent for {command.host}: {exc}"  # type: ignore[attr-defined]
                handle.write(f"{start_error}\n".encode())
                abort_reason = start_error
                break

        trouble_since: float | None = None
        next_scan = 0.0
        while abort_reason is None:
            codes = [p.poll() if p is not None else None for p in procs]
            progress_tail.poll()
            now = time.monotonic()
            if all(code is not None for code in codes):
                break
            if now >= deadline:
                timed_out = True
                break
            if now >= next_scan:
                next_scan = now + 0.25
                states = read_rank_states(spec.job_dir)
                failed = sorted(r for r, s in states.items() if s.get("status") == "error")
                dead = [
                    (c.host, code)  # type: ignore[attr-defined]
                    for c, code in zip(commands, codes, strict=False)
                    if code not in (None, 0)
                ]
                if (failed or dead) and trouble_since is None:
                    trouble_since = now
                if trouble_since is not None and now - trouble_since >= spec.failure_grace_s:
                    if failed:
                        abort_reason = (
                            f"rank {failed[0]} failed; the other ranks were stopped "
                            f"{spec.failure_grace_s:g} s later"
                        )
                    else:
                        host, code = dead[0]
                        abort_reason = (
                            f"the agent on {host} exited with code {code}; the job was stopped "
                            f"{spec.failure_grace_s:g} s later"
                        )
                elif len(states) < spec.world_size and now - start >= spec.rendezvous_timeout_s:
                    abort_reason = (
                        f"only {len(states)} of {spec.world_size} ranks had started after "
                        f"{spec.rendezvous_timeout_s:g} s (the rendezvous did not complete)"
                    )
            time.sleep(POLL_S)

        if not timed_out and abort_reason is None:
            # The agents are done; ranks they left behind get a moment, then they are killed.
            leftovers = _wait_gone(spec.job_id, spec.settle_s)
            if leftovers:
                notes.append(f"{len(leftovers)} process(es) outlived their agent and were killed")
        survivors: list[int] = []
        if timed_out or abort_reason is not None or find_job_pids(spec.job_id):
            survivors = _stop_everything(
                spec, procs, reap_commands, dump_stacks=timed_out or abort_reason is not None
            )
    except BaseException:
        # Ctrl-C, or SIGTERM turned into it (sigterm.py): the stacks say where the job was.
        _stop_everything(spec, procs, reap_commands, dump_stacks=True)
        raise
    finally:
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pipe in lifelines:
            with contextlib.suppress(OSError):
                pipe.close()
        for handle in handles:
            handle.close()
        progress_tail.poll(final=True)
    survivors = find_job_pids(spec.job_id) or survivors
    return ProcessOutcome(
        agent_exit_codes=tuple(p.returncode if p is not None else None for p in procs),
        agent_logs=tuple(logs[: len(procs)]),
        duration_s=time.monotonic() - start,
        timed_out=timed_out,
        abort_reason=abort_reason,
        survivors=tuple(survivors),
        start_error=start_error,
        notes=tuple(notes),
    )


def _stop_everything(
    spec: LaunchSpec,
    procs: Sequence[subprocess.Popen | None],
    reap_commands: Sequence[object],
    *,
    dump_stacks: bool,
) -> list[int]:
    groups = [p.pid for p in procs if p is not None and p.poll() is None]
    reapers = []
    for command in reap_commands:  # remote nodes: the same kill, run there
        with contextlib.suppress(OSError):
            reapers.append(
                subprocess.Popen(
                    list(command.argv),  # type: ignore[attr-defined]
                    env={**os.environ, **command.env},  # type: ignore[attr-defined]
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    survivors = terminate_job(spec.job_id, dump_stacks=dump_stacks, groups=groups)
    for reaper in reapers:
        try:
            reaper.wait(timeout=15)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()
    return survivors


def reap_argv(python: str, job_id: str) -> list[str]:
    """The remote reaper's argv (to be wrapped in the node's remote-exec prefix)."""
    return [python, "-m", "pytest_gpucluster.launch.process", "--reap", job_id]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--reap":
        print("usage: python -m pytest_gpucluster.launch.process --reap JOB_ID", file=sys.stderr)
        return 2
    survivors = terminate_job(args[1], dump_stacks=True)
    if survivors:
        print(f"still alive after SIGKILL: {survivors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
