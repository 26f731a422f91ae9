"""At session start: what earlier sessions left on the nodes this session uses, judged and reported.

`check_leftovers` scans this machine in process and every other node through the remote-exec
prefix (``python -m pytest_gpucluster.launch.leftovers --list``, in parallel), then `judge`
sorts what it found:

- a job whose session is gone (the pytest named by its `SessionTag` no longer runs on this
  machine) is a **leftover**: reported, and with ``--gpucluster-reap`` killed where it runs;
- a job of another live session, or of a session this machine cannot check (no tag, or a
  pytest on another machine), is reported as a warning and never touched: it may be someone's
  run, but it competes with this one for the node;
- a DeepSpeed ``/dev/shm`` segment that no live process maps is **stale**: reported, and
  removed with ``--gpucluster-reap``.

Nodes that share one kernel (network namespaces standing in for nodes, containers without a
pid namespace) show the same processes; a process is reported once, for the first node that
saw it (this machine first), where killing it by job id works as well.

No pytest, no torch.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from pytest_gpucluster.launch.base import (
    RemoteExec,
    current_pythonpath_entry,
    is_local_host,
    merge_pythonpath,
)
from pytest_gpucluster.launch.leftovers import (
    LEFTOVERS_MODULE,
    NodeScan,
    OwnerState,
    SessionTag,
    reap,
    scan_node,
)

__all__ = ["FoundJob", "LeftoverReport", "StaleSegment", "check_leftovers", "judge", "scan_nodes"]

REMOTE_TIMEOUT_S = 30.0
MAX_LINES = 12


@dataclass(frozen=True, slots=True)
class FoundJob:
    """The processes of one job on one node that belong to another session."""

    host: str
    job_id: str
    session: str | None
    owner: OwnerState
    """``dead``: a leftover; ``alive``: another running session; ``unknown``: cannot tell here."""
    pids: tuple[int, ...]
    commands: tuple[str, ...]
    action: str = "reported"
    """``reported``, ``killed``, or ``survived: <pids>``."""

    @property
    def is_leftover(self) -> bool:
        return self.owner == "dead"

    def describe(self) -> str:
        """``job X of <whose>``, for people."""
        tag = SessionTag.parse(self.session)
        if tag is None:
            return f"job {self.job_id} (no session tag: started by hand, or by an older pytest-gpucluster)"
        where = f"pytest pid {tag.pid} on {tag.host}"
        whose = {
            "dead": f"a session that is gone ({where})",
            "alive": f"another running session ({where})",
            "unknown": f"a session on another machine ({where}), which cannot be checked from here",
        }[self.owner]
        return f"job {self.job_id} of {whose}"


@dataclass(frozen=True, slots=True)
class StaleSegment:
    host: str
    path: str
    size_bytes: int
    action: str = "reported"
    """``reported``, ``removed``, or ``not removed: <why>``."""


@dataclass(frozen=True, slots=True)
class LeftoverReport:
    jobs: tuple[FoundJob, ...] = ()
    segments: tuple[StaleSegment, ...] = ()
    unchecked: tuple[tuple[str, str], ...] = ()
    """``(host, why)`` for nodes that could not be scanned."""

    @property
    def leftovers(self) -> tuple[FoundJob, ...]:
        return tuple(job for job in self.jobs if job.is_leftover)

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.segments or self.unchecked)

    def to_json(self) -> dict[str, Any]:
        data = {
            "jobs": [asdict(job) for job in self.jobs],
            "shm_segments": [asdict(segment) for segment in self.segments],
            "unchecked": [{"host": host, "reason": why} for host, why in self.unchecked],
        }
        return json.loads(json.dumps(data))  # tuples as lists, as results.json will hold them

    def lines(self) -> list[str]:
        """For the report header: one line per job, segment and unreachable node."""
        out = []
        for job in sorted(self.jobs, key=lambda j: not j.is_leftover):  # what to act on first
            pids = ", ".join(map(str, job.pids[:8])) + (" ..." if len(job.pids) > 8 else "")
            what = f"{job.describe()}: {len(job.pids)} process(es) (pids {pids}; {job.commands[0]})"
            if not job.is_leftover:
                out.append(f"WARNING on {job.host}: {what}; not touched, but it competes with this run")
            elif job.action == "reported":
                out.append(f"LEFTOVER on {job.host}: {what}; --gpucluster-reap kills them")
            else:
                out.append(f"LEFTOVER on {job.host}: {what}: {job.action}")
        for segment in self.segments:
            size = f"{segment.size_bytes / 2**20:.0f} MiB"
            what = f"{segment.path} ({size}), mapped by no process"
            action = "--gpucluster-reap removes it" if segment.action == "reported" else segment.action
            out.append(f"LEFTOVER on {segment.host}: {what}; {action}")
        for host, why in self.unchecked:
            out.append(f"WARNING: could not look for leftovers on {host}: {why}")
        if len(out) > MAX_LINES:
            out = [*out[: MAX_LINES - 1], f"... and {len(out) - MAX_LINES + 1} more (all in results.json)"]
        return out


def judge(
    scans: Sequence[NodeScan], current_session: str, owner_state: Callable[[SessionTag], OwnerState]
) -> LeftoverReport:
    """Sort what the scans found (pure, given ``owner_state``): ``scans`` in order, this machine
    first; jobs of ``current_session`` are this run's own and left out."""
    seen: set[tuple[str, int]] = set()
    grouped: dict[tuple[str, str], list[Any]] = {}
    for scan in scans:
        for process in scan.processes:
            if process.session == current_session or (scan.boot_id, process.pid) in seen:
                continue
            seen.add((scan.boot_id, process.pid))
            grouped.setdefault((scan.host, process.job_id), []).append(process)
    jobs = []
    for (host, job_id), processes in grouped.items():
        session = processes[0].session
        tag = SessionTag.parse(session)
        jobs.append(
            FoundJob(
                host=host,
                job_id=job_id,
                session=session,
                owner="unknown" if tag is None else owner_state(tag),
                pids=tuple(p.pid for p in processes),
                commands=tuple(p.command for p in processes),
            )
        )
    segments, seen_paths = [], set()
    for scan in scans:
        for segment in scan.shm:
            if segment.mapped_by or (scan.boot_id, segment.path) in seen_paths:
                continue
            seen_paths.add((scan.boot_id, segment.path))
            segments.append(StaleSegment(host=scan.host, path=segment.path, size_bytes=segment.size_bytes))
    unchecked = tuple((scan.host, scan.error) for scan in scans if scan.error)
    return LeftoverReport(jobs=tuple(jobs), segments=tuple(segments), unchecked=unchecked)


# --------------------------------------------------------------------------- running it on the nodes


@dataclass(frozen=True, slots=True)
class _Node:
    host: str
    user: str | None


def _remote_argv(remote: RemoteExec, node: _Node, python: str, args: Sequence[str]) -> list[str]:
    env = {"PYTHONPATH": merge_pythonpath(current_pythonpath_entry())}
    return remote.wrap(node.host, [python, "-m", LEFTOVERS_MODULE, *args], env, user=node.user)


def _run_everywhere(
    nodes: Sequence[_Node], remote: RemoteExec, python: str, args_for: Callable[[_Node], Sequence[str]]
) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Run the leftovers module on every node at once: ``host -> (its JSON answer, or why none)``."""
    started = {}
    answers: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    for node in nodes:
        argv = _remote_argv(remote, node, python, args_for(node))
        try:
            started[node.host] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            answers[node.host] = (None, f"could not run {argv[0]}: {exc}")
    for host, proc in started.items():
        try:
            out, err = proc.communicate(timeout=REMOTE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            answers[host] = (None, f"no answer in {REMOTE_TIMEOUT_S:g} s")
            continue
        lines = [line for line in out.splitlines() if line.startswith("{")]
        try:
            answers[host] = (json.loads(lines[-1]), None)
        except (IndexError, ValueError):
            said = (err.strip().splitlines() or ["no output"])[-1]
            answers[host] = (None, f"exit code {proc.returncode}: {said}")
    return answers


def scan_nodes(
    hosts: Sequence[tuple[str, str | None]], remote: RemoteExec | None, python: str
) -> list[NodeScan]:
    """This machine, then every other host of ``(host, user)`` through ``remote``."""
    scans = [scan_node()]
    far = [_Node(h, u) for h, u in dict(hosts).items() if not is_local_host(h)]
    if far and remote is None:
        return scans + [NodeScan(host=n.host, error="no remote-exec prefix to reach it") for n in far]
    if far:
        assert remote is not None
        answers = _run_everywhere(far, remote, python, lambda _node: ["--list"])
        for node in far:
            data, why = answers[node.host]
            scans.append(
                NodeScan.from_json({**data, "host": node.host}) if data else NodeScan(node.host, error=why)
            )
    return scans


def reap_report(
    report: LeftoverReport, hosts: Sequence[tuple[str, str | None]], remote: RemoteExec | None, python: str
) -> LeftoverReport:
    """Kill the leftover jobs and remove the stale segments; the report with what happened."""
    users = dict(hosts)
    by_host: dict[str, tuple[list[str], list[str]]] = {}
    for job in report.leftovers:
        by_host.setdefault(job.host, ([], []))[0].append(job.job_id)
    for segment in report.segments:
        by_host.setdefault(segment.host, ([], []))[1].append(segment.path)
    results: dict[str, dict[str, Any]] = {}
    far = []
    for host, (jobs, paths) in by_host.items():
        if is_local_host(host):
            results[host] = reap(jobs, paths)
        else:
            far.append(_Node(host, users.get(host)))
    if far and remote is not None:

        def args(node: _Node) -> list[str]:
            jobs, paths = by_host[node.host]
            return ["--reap", *jobs, "--remove-shm", *paths]

        for host, (data, why) in _run_everywhere(far, remote, python, args).items():
            results[host] = data or {"error": why}
    return _with_actions(report, results)


def _with_actions(report: LeftoverReport, results: dict[str, dict[str, Any]]) -> LeftoverReport:
    jobs = []
    for job in report.jobs:
        done = results.get(job.host)
        if not job.is_leftover or done is None:
            jobs.append(job)
        elif "error" in done:
            jobs.append(replace(job, action=f"not killed: {done['error']}"))
        else:
            survivors = done.get("survivors", {}).get(job.job_id)
            jobs.append(replace(job, action=f"survived: {survivors}" if survivors else "killed"))
    segments = []
    for segment in report.segments:
        done = results.get(segment.host) or {}
        if segment.path in done.get("removed", ()):
            segments.append(replace(segment, action="removed"))
        else:
            why = (done.get("not_removed") or {}).get(segment.path) or done.get("error") or "not tried"
            segments.append(replace(segment, action=f"not removed: {why}"))
    return replace(report, jobs=tuple(jobs), segments=tuple(segments))


def check_leftovers(
    hosts: Sequence[tuple[str, str | None]],
    remote: RemoteExec | None,
    python: str,
    session: str,
    *,
    kill: bool = False,
) -> LeftoverReport:
    """Scan, judge (owners checked on this machine), and with ``kill`` reap the leftovers."""
    report = judge(scan_nodes(hosts, remote, python), session, lambda tag: tag.state_here())
    if kill and (report.leftovers or report.segments):
        report = reap_report(report, hosts, remote, python)
    return report
