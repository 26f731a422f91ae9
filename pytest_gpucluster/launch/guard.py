"""The guard: each agent of a job runs under one, so no process outlives the pytest that owns it.

``python -m pytest_gpucluster.launch.guard --job-id=ID (--watch-pid=PID | --watch-stdin)
[--on-orphan=JSON_ARGV]... -- AGENT ARGV...``

The guard starts the agent (torchrun, srun, mpirun, the DeepSpeed runner) as its child and
waits for it, watching the controller, the pytest process that launched the job:

- **on this machine** (``--watch-pid``): the controller's pid, through a pidfd (Linux 5.3+)
  or, failing that, by polling its start time in /proc;
- **on another node** (``--watch-stdin``, inside the remote-exec prefix): its own stdin. The
  controller keeps a pipe to every remote command open and writes `HELLO` into it; ssh forwards
  stdin and closes it when the local client dies, and ``ip netns exec`` passes the pipe on as
  is. End-of-file after the hello means the controller (or the way to it) is gone. End-of-file
  *before* the hello means the prefix does not forward stdin (pdsh): the guard says so in the
  agent log and stops watching; the ranks' own hard deadline still ends them.

When the controller is gone, the guard runs the ``--on-orphan`` commands (``scancel`` of the
job's Slurm step), stops every process of the job on its node by job id (stack dump, SIGTERM,
SIGKILL: `launch.reaper.terminate_job`) and exits with `ORPHANED_EXIT`. The agent it starts
gets ``PR_SET_PDEATHSIG``, so killing the guard itself takes the agent with it, and every rank
sets the same on itself (`workloads._worker`): the chain controller -> guard -> agent -> rank
holds even where one link is killed outright.

Otherwise the guard is invisible: SIGTERM and SIGINT are passed on to the agent, and the guard
leaves the way the agent left (same exit code, or killed by the same signal), so the launcher
sees the agent's own outcome.

Standard library only (it runs on remote nodes); no pytest, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from pytest_gpucluster.launch.process import HELLO
from pytest_gpucluster.launch.reaper import process_start_ticks, terminate_job
from pytest_gpucluster.workloads._parent_death import die_with_parent
from pytest_gpucluster.workloads._runtime import JOB_ID_ENV

__all__ = ["GUARD_MODULE", "ORPHANED_EXIT", "GuardArgs", "guard_argv", "main", "parse_args"]

GUARD_MODULE = "pytest_gpucluster.launch.guard"
ORPHANED_EXIT = 97
"""The guard's exit code after it stopped a job whose controller was gone (nobody reads it)."""
POLL_S = 0.25
CLEANUP_WAIT_S = 20.0
USAGE = (
    f"usage: python -m {GUARD_MODULE} --job-id=ID (--watch-pid=PID | --watch-stdin) "
    "[--on-orphan=JSON_ARGV]... -- AGENT ARGV..."
)


@dataclass(frozen=True, slots=True)
class GuardArgs:
    job_id: str
    watch_pid: int | None
    """The controller's pid (a guard on the controller's machine), or None: watch stdin."""
    on_orphan: tuple[tuple[str, ...], ...]
    """Commands to run once the controller is gone (e.g. the Slurm cancel), before the kill."""
    command: tuple[str, ...]


def guard_argv(
    python: str, job_id: str, *, watch_pid: int | None = None, on_orphan: Sequence[Sequence[str]] = ()
) -> list[str]:
    """The guard's own argv up to and including ``--``; the agent's argv follows."""
    argv = [python, "-m", GUARD_MODULE, f"--job-id={job_id}"]
    argv.append(f"--watch-pid={watch_pid}" if watch_pid is not None else "--watch-stdin")
    argv += [f"--on-orphan={json.dumps([str(a) for a in command])}" for command in on_orphan]
    return [*argv, "--"]


def parse_args(argv: Sequence[str]) -> GuardArgs:
    """The guard's options; ValueError says what is wrong."""
    args = list(argv)
    if "--" not in args:
        raise ValueError("no '--' before the agent's command")
    split = args.index("--")
    options, command = args[:split], tuple(args[split + 1 :])
    if not command:
        raise ValueError("no agent command after '--'")
    job_id: str | None = None
    watch_pid: int | None = None
    watch_stdin = False
    on_orphan: list[tuple[str, ...]] = []
    for option in options:
        name, _, value = option.partition("=")
        if name == "--job-id" and value:
            job_id = value
        elif name == "--watch-pid":
            if not value.isdigit() or int(value) <= 0:
                raise ValueError(f"--watch-pid needs a process id, got {value!r}")
            watch_pid = int(value)
        elif option == "--watch-stdin":
            watch_stdin = True
        elif name == "--on-orphan":
            try:
                cleanup = json.loads(value)
            except ValueError:
                cleanup = None
            if not isinstance(cleanup, list) or not cleanup or not all(isinstance(a, str) for a in cleanup):
                raise ValueError(f"--on-orphan needs a JSON list of strings (an argv), got {value!r}")
            on_orphan.append(tuple(cleanup))
        else:
            raise ValueError(f"unknown option {option!r}")
    if job_id is None:
        raise ValueError("--job-id=ID is required")
    if (watch_pid is None) == (not watch_stdin):
        raise ValueError("give exactly one of --watch-pid=PID and --watch-stdin")
    return GuardArgs(job_id=job_id, watch_pid=watch_pid, on_orphan=tuple(on_orphan), command=command)


# --------------------------------------------------------------------------- watching the controller


class _PidWatch:
    """The controller is a process on this machine."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = process_start_ticks(pid)
        self.fd: int | None = _pidfd(pid)

    def gone(self, readable: bool) -> str | None:
        if self.start is None or readable or process_start_ticks(self.pid) != self.start:
            return f"pytest (pid {self.pid}) that owns the job has exited"
        return None


class _StdinWatch:
    """The controller is on another machine, at the other end of this process's stdin."""

    def __init__(self) -> None:
        self.fd: int | None = sys.stdin.fileno()
        self.heard = b""
        self.armed = False

    def gone(self, readable: bool) -> str | None:
        if not readable or self.fd is None:
            return None
        try:
            data = os.read(self.fd, 4096)
        except OSError as exc:
            data, error = b"", exc
        else:
            error = None
        if data:
            if not self.armed:
                self.heard = (self.heard + data)[-len(HELLO) * 2 :]
                self.armed = HELLO in self.heard
            return None
        if self.armed:
            return f"stdin closed{f' ({error})' if error else ''}: the pytest that owns the job, or the connection to it, is gone"
        self.fd = None
        _say(
            "stdin ended before the controller's hello: this remote-exec prefix does not forward "
            "stdin (pdsh does not), so this guard cannot see the controller die; the ranks' own "
            "hard deadline still ends them"
        )
        return None


# --------------------------------------------------------------------------- the guard


def _say(message: str) -> None:
    with contextlib.suppress(OSError):  # the agent log, or an ssh channel that may be gone
        print(f"gpucluster guard on {socket.gethostname()}: {message}", file=sys.stderr, flush=True)


def _start_agent(args: GuardArgs) -> subprocess.Popen:
    guard = os.getpid()
    return subprocess.Popen(
        list(args.command),
        # A remote guard owns stdin (the controller's pipe); a local one passes its own on.
        stdin=subprocess.DEVNULL if args.watch_pid is None else None,
        preexec_fn=lambda: die_with_parent(signal.SIGKILL, expected_parent=guard),
    )


def _stop_orphaned_job(args: GuardArgs, agent: subprocess.Popen, why: str) -> int:
    _say(f"{why}; stopping job {args.job_id} on this node")
    env = {k: v for k, v in os.environ.items() if k != JOB_ID_ENV}  # or the kill below takes them
    cleaners = []
    for command in args.on_orphan:
        try:
            cleaners.append(
                subprocess.Popen(list(command), env=env, stdin=subprocess.DEVNULL, start_new_session=True)
            )
        except OSError as exc:
            _say(f"could not run {' '.join(command)}: {exc}")
    survivors = terminate_job(args.job_id, dump_stacks=True)
    if agent.poll() is None:  # an agent that dropped the job id from its environment
        agent.kill()
    end = time.monotonic() + CLEANUP_WAIT_S
    for cleaner in cleaners:
        try:
            cleaner.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            cleaner.kill()
    agent.wait()
    _say(
        f"job {args.job_id}: " + (f"still alive after SIGKILL: {survivors}" if survivors else "nothing left")
    )
    return ORPHANED_EXIT


def _leave_like(code: int) -> int:
    """Exit as the agent did: the same code, or death by the same signal."""
    if code >= 0:
        return code
    sig = -code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # a signal whose default action is to ignore it ends up here
    return 128 + sig


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def run(args: GuardArgs) -> int:
    watch = _PidWatch(args.watch_pid) if args.watch_pid is not None else _StdinWatch()
    try:
        agent = _start_agent(args)
    except OSError as exc:
        _say(f"could not start {args.command[0]}: {exc}")
        return 127
    if args.watch_pid is None:
        # The controller's sign that this node answered (`launch.process`: a remote agent whose
        # log stays empty never ran, and its reaper is not waited for).
        _say(f"job {args.job_id}: agent started (pid {agent.pid})")
    hangup: list[str] = []

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            agent.send_signal(signum)

    def hung_up(_signum: int, _frame: FrameType | None) -> None:
        hangup.append("SIGHUP: the session to the controller ended")

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    signal.signal(signal.SIGHUP, hung_up if args.watch_pid is None else pass_on)
    agent_fd = _pidfd(agent.pid)  # wakes the wait below the moment the agent ends
    while True:
        fds = [watch.fd] if watch.fd is not None else []
        readable, _, _ = select.select([*fds, *([agent_fd] if agent_fd is not None else [])], [], [], POLL_S)
        why = watch.gone(watch.fd in readable) or (hangup[0] if hangup else None)
        if why is not None:
            return _stop_orphaned_job(args, agent, why)
        code = agent.poll()
        if code is not None:
            # The controller may have died with the agent: then its ranks may still be about.
            why = watch.gone(bool(select.select(fds, [], [], 0)[0])) if fds else None
            return _stop_orphaned_job(args, agent, why) if why else _leave_like(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"{GUARD_MODULE}: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
