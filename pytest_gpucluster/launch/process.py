"""Start a job's agents, watch them against a deadline, and leave no process behind.

While waiting, new lines of rank 0's ``progress.log`` go to a callback, and the rank files are
watched so that one failed rank (or a dead agent) stops the whole job after a short grace
instead of leaving the other ranks blocked in a collective until the timeout. Stopping a job
(here and, through ``reap_commands``, on remote nodes) is `launch.reaper`'s.

If this process dies without cleaning up (SIGKILL, the OOM killer), the guard around every
agent (`launch.guard`) does it. A remote command gets a stdin pipe that stays open as long as
this process runs (it starts with `HELLO`): its guard on the far side takes end-of-file for
this process's death.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pytest_gpucluster.launch.job_files import ProgressTail, agent_log_paths, read_rank_states
from pytest_gpucluster.launch.reaper import POLL_S, find_job_pids, terminate_job, wait_gone
from pytest_gpucluster.workloads._runtime import JOB_ID_ENV, PROGRESS_FILE

__all__ = ["HELLO", "LaunchSpec", "ProcessOutcome", "run_commands"]

HELLO = b"gpucluster-controller-hello\n"
"""Written into the stdin pipe of every remote command: the far side's guard (`launch.guard`)
knows from it that stdin is forwarded, so a later end-of-file means the controller is gone."""


REAPER_WAIT_S = 15.0
"""How long a remote reaper (the kill run on a node through its prefix) gets to finish."""
SILENT_REAPER_WAIT_S = 2.0
"""The same for a node whose launch never answered: its reaper hangs as the launch did."""


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


@dataclass
class _Agents:
    """The started agents of one job, with what must be closed when it ends."""

    procs: list[subprocess.Popen | None] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    """The host of each started (or tried) agent, in order."""
    log_paths: list[Path] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    lifelines: list[IO[bytes]] = field(default_factory=list)
    """stdin pipes of remote commands, open until their agents are done."""
    start_error: str | None = None

    def exit_codes(self) -> list[int | None]:
        return [p.poll() if p is not None else None for p in self.procs]

    def silent_hosts(self) -> set[str]:
        """Hosts none of whose agents wrote a byte to its log: their launch never answered.

        A remote agent's log gets the far-side guard's first line (`launch.guard`) as soon as the
        node runs the command, so an empty log once the local agent is gone means nothing of the
        job ever started there (``ssh`` to a host that does not answer prints nothing until its
        own timeout). Read after the local agents were killed, so no late line is missed.
        """
        heard: set[str] = set()
        for host, path in zip(self.hosts, self.log_paths, strict=True):
            try:
                if path.stat().st_size > 0:
                    heard.add(host)
            except OSError:
                pass
        return set(self.hosts) - heard

    def close(self) -> None:
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pipe in self.lifelines:
            with contextlib.suppress(OSError):
                pipe.close()
        for handle in self.logs:
            handle.close()


def _start_agents(
    spec: LaunchSpec, commands: Sequence[object], log_paths: Sequence[Path], agents: _Agents
) -> None:
    """Start one agent per command, each in a session of its own; stop at the first that cannot start."""
    for command, log_path in zip(commands, log_paths, strict=True):
        env = {**os.environ, **command.env, JOB_ID_ENV: spec.job_id}  # type: ignore[attr-defined]
        handle = open(log_path, "ab")  # noqa: SIM115 - closed by _Agents.close
        agents.logs.append(handle)
        agents.hosts.append(command.host)  # type: ignore[attr-defined]
        agents.log_paths.append(log_path)
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
        except OSError as exc:
            agents.procs.append(None)
            agents.start_error = f"could not start the agent for {command.host}: {exc}"  # type: ignore[attr-defined]
            handle.write(f"{agents.start_error}\n".encode())
            return
        agents.procs.append(proc)
        if proc.stdin is not None:
            agents.lifelines.append(proc.stdin)
            with contextlib.suppress(OSError):  # an agent that died at once
                proc.stdin.write(HELLO)
                proc.stdin.flush()


@dataclass
class _Watch:
    """Why the wait for the agents ended early (both unset: they all exited by themselves)."""

    timed_out: bool = False
    abort_reason: str | None = None


def _trouble_reason(
    spec: LaunchSpec,
    commands: Sequence[object],
    codes: Sequence[int | None],
    states: dict[int, dict],
    waited_s: float,
) -> tuple[bool, str | None]:
    """(is there trouble, the reason to stop now): a failed rank or dead agent is trouble that stops
    the job after the grace; a rendezvous that never completed stops it at once."""
    failed = sorted(r for r, s in states.items() if s.get("status") == "error")
    dead = [(c.host, code) for c, code in zip(commands, codes, strict=False) if code not in (None, 0)]  # type: ignore[attr-defined]
    if failed:
        return True, f"rank {failed[0]} failed; the other ranks were stopped {spec.failure_grace_s:g} s later"
    if dead:
        host, code = dead[0]
        return True, (
            f"the agent on {host} exited with code {code}; the job was stopped {spec.failure_grace_s:g} s later"
        )
    if len(states) < spec.world_size and waited_s >= spec.rendezvous_timeout_s:
        return False, (
            f"only {len(states)} of {spec.world_size} ranks had started after "
            f"{spec.rendezvous_timeout_s:g} s (the rendezvous did not complete)"
        )
    return False, None


def _watch(
    spec: LaunchSpec, commands: Sequence[object], agents: _Agents, progress_tail: ProgressTail
) -> _Watch:
    """Wait until every agent exits, the deadline passes, or trouble outlasts its grace."""
    start = time.monotonic()
    deadline = start + spec.timeout_s
    trouble_since: float | None = None
    next_scan = 0.0
    while True:
        codes = agents.exit_codes()
        progress_tail.poll()
        now = time.monotonic()
        if all(code is not None for code in codes):
            return _Watch()
        if now >= deadline:
            return _Watch(timed_out=True)
        if now >= next_scan:
            next_scan = now + 0.25
            trouble, reason = _trouble_reason(
                spec, commands, codes, read_rank_states(spec.job_dir), now - start
            )
            if trouble:
                trouble_since = now if trouble_since is None else trouble_since
                if now - trouble_since >= spec.failure_grace_s:
                    return _Watch(abort_reason=reason)
            elif reason is not None and trouble_since is None:
                return _Watch(abort_reason=reason)
        time.sleep(POLL_S)


def run_commands(
    spec: LaunchSpec,
    commands: Sequence[object],
    *,
    progress: Callable[[str], None] | None = None,
    reap_commands: Sequence[object] = (),
) -> ProcessOutcome:
    """Start ``commands`` (LaunchCommand-like: ``host``, ``argv``, ``env``), wait, clean up."""
    start = time.monotonic()
    log_paths = agent_log_paths(spec.job_dir, [c.host for c in commands])  # type: ignore[attr-defined]
    agents = _Agents()
    watch = _Watch()
    notes: list[str] = []
    survivors: list[int] = []
    progress_tail = ProgressTail(spec.job_dir / PROGRESS_FILE, progress)
    try:
        _start_agents(spec, commands, log_paths, agents)
        if agents.start_error is not None:
            watch = _Watch(abort_reason=agents.start_error)
        else:
            watch = _watch(spec, commands, agents, progress_tail)
        stopped_early = watch.timed_out or watch.abort_reason is not None
        if not stopped_early:
            # The agents are done; ranks they left behind get a moment, then they are killed.
            leftovers = wait_gone(spec.job_id, spec.settle_s)
            if leftovers:
                notes.append(f"{len(leftovers)} process(es) outlived their agent and were killed")
        if stopped_early or find_job_pids(spec.job_id):
            survivors = _stop_everything(spec, agents, reap_commands, dump_stacks=stopped_early)
    except BaseException:
        # Ctrl-C, or SIGTERM turned into it (sigterm.py): the stacks say where the job was.
        _stop_everything(spec, agents, reap_commands, dump_stacks=True)
        raise
    finally:
        agents.close()
        progress_tail.poll(final=True)
    survivors = find_job_pids(spec.job_id) or survivors
    return ProcessOutcome(
        agent_exit_codes=tuple(p.returncode if p is not None else None for p in agents.procs),
        agent_logs=tuple(log_paths[: len(agents.procs)]),
        duration_s=time.monotonic() - start,
        timed_out=watch.timed_out,
        abort_reason=watch.abort_reason,
        survivors=tuple(survivors),
        start_error=agents.start_error,
        notes=tuple(notes),
    )


def _stop_everything(
    spec: LaunchSpec,
    agents: _Agents,
    reap_commands: Sequence[object],
    *,
    dump_stacks: bool,
) -> list[int]:
    """Kill the job here and, through ``reap_commands``, on its remote nodes; the survivors here.

    The remote reapers run while the local kill does. Each gets `REAPER_WAIT_S` to finish,
    except a reaper for a node whose launch never answered (`_Agents.silent_hosts`): the kill
    sent there would hang as the launch did, and nothing of the job runs there to kill, so it
    gets `SILENT_REAPER_WAIT_S` (a bad node then costs its job's deadline, not that + 15 s). A
    node that answered late is still covered: its guard ends the job once the local agent,
    and with it the stdin pipe, is gone.
    """
    groups = [p.pid for p in agents.procs if p is not None and p.poll() is None]
    reapers: list[tuple[object, subprocess.Popen]] = []
    started = time.monotonic()
    for command in reap_commands:  # remote nodes: the same kill, run there
        with contextlib.suppress(OSError):
            reapers.append(
                (
                    command,
                    subprocess.Popen(
                        list(command.argv),  # type: ignore[attr-defined]
                        env={**os.environ, **command.env},  # type: ignore[attr-defined]
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    ),
                )
            )
    survivors = terminate_job(spec.job_id, dump_stacks=dump_stacks, groups=groups)
    silent = agents.silent_hosts()  # the local agents are dead: their logs are final
    for command, reaper in reapers:
        cut = bool(getattr(command, "remote", False)) and command.host in silent  # type: ignore[attr-defined]
        end = started + (SILENT_REAPER_WAIT_S if cut else REAPER_WAIT_S)
        try:
            reaper.wait(timeout=max(end - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()
    return survivors
