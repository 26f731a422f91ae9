"""`JobResult`: what every rank of a finished job did, and the failure report a person reads.

Built from the rank files (``rank-<i>.json``, see `workloads._runtime`) and what
`launch.process` saw of the processes. The report puts the root cause first (the earliest
error by finish time; for a hang, the ranks that never finished, with the tail of their stack
dump), then ranks that died without a word (exit code or signal), then ranks that never
started (with the tail of their node's agent log), and last the ranks stopped because of the
others. Every entry names its host and log file; the job directory is always printed.

No torch, no pytest.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import JobFailed, JobSkipped
from pytest_gpucluster.launch.base import LaunchCommand, is_local_host
from pytest_gpucluster.launch.job_files import tail_lines
from pytest_gpucluster.launch.process import ProcessOutcome
from pytest_gpucluster.workloads._runtime import rank_log_path

__all__ = ["JobResult", "JobSkipped", "RankOutcome", "build_result", "shared_gpus"]

TAIL = 15

OK, ERROR, SKIPPED = "ok", "error", "skipped"
HUNG = "hung"
"""Still running when the job timed out."""
CRASHED = "crashed"
"""Started, then ended without writing its result (a signal, os._exit, a C++ abort)."""
STOPPED = "stopped"
"""Still running when another rank's failure stopped the job: collateral, not the cause."""
MISSING = "missing"
"""Never wrote its rank file: never started (its node or agent failed first)."""


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    host: str | None
    local_rank: int | None
    node_rank: int | None
    status: str
    value: Any = None
    error: dict[str, str] | None = None
    exit_code: int | None = None
    """The rank's process exit code as its agent saw it; negative numbers are signals."""
    log_path: Path | None = None
    agent_log: Path | None = None
    reason: str | None = None
    """Why it skipped."""
    started_at: float | None = None
    finished_at: float | None = None
    gpu: dict[str, Any] | None = None
    """The CUDA device the rank took: ``index``, ``visible``, ``cuda_visible_devices``, ``uuid``
    (None on CPU ranks)."""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def signal(self) -> int | None:
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None

    def where(self) -> str:
        return f"rank {self.rank} on {self.host or 'an unknown host'}"

    def exit_text(self) -> str | None:
        if self.signal is not None:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = "?"
            return f"killed by signal {self.signal} ({name})"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return None


@dataclass(frozen=True)
class JobResult:
    job_id: str
    job_dir: Path
    ranks: tuple[RankOutcome, ...]
    commands: tuple[LaunchCommand, ...]
    duration_s: float
    timed_out: bool = False
    timeout_s: float | None = None
    abort_reason: str | None = None
    agent_exit_codes: tuple[int | None, ...] = ()
    agent_logs: tuple[Path, ...] = ()
    agent_hosts: tuple[str, ...] = ()
    survivors: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return (
            bool(self.ranks) and all(r.ok for r in self.ranks) and not self.survivors and not self.shared_gpus
        )

    @property
    def shared_gpus(self) -> list[str]:
        """A sentence per GPU that two or more ranks of one node took (`shared_gpus`)."""
        return shared_gpus(self.ranks)

    @property
    def failures(self) -> list[RankOutcome]:
        """Failed ranks, root cause first."""
        order = {ERROR: 0, CRASHED: 1, HUNG: 2, MISSING: 3, STOPPED: 4}
        bad = [r for r in self.ranks if r.status in order]
        return sorted(bad, key=lambda r: (order[r.status], r.finished_at or float("inf"), r.rank))

    @property
    def skip_reason(self) -> str | None:
        skipped = [r for r in self.ranks if r.status == SKIPPED]
        if not skipped or self.failures:
            return None
        reasons = sorted({r.reason or "no reason given" for r in skipped})
        ranks = ", ".join(str(r.rank) for r in skipped)
        return f"skipped on rank{'s' if len(skipped) > 1 else ''} {ranks}: {'; '.join(reasons)}"

    @property
    def values(self) -> list[Any]:
        """Per-rank return values, by rank; raises `JobFailed` / `JobSkipped` unless every rank succeeded."""
        self.raise_on_failure()
        return [r.value for r in self.ranks]

    @property
    def hosts(self) -> list[str | None]:
        return [r.host for r in self.ranks]

    def raise_on_failure(self) -> JobResult:
        __tracebackhide__ = True
        if self.ok:
            return self
        if self.skip_reason and not self.survivors and not self.shared_gpus:
            raise JobSkipped(f"job {self.job_id} {self.skip_reason}")
        raise JobFailed(self.failure_report(), result=self)

    # ------------------------------------------------------------------ the report

    def failure_report(self) -> str:
        failures = self.failures
        head = f"job {self.job_id} failed"
        if self.timed_out:
            head += f": timed out after {self.timeout_s:g} s"
        elif self.abort_reason:
            head += f": {self.abort_reason}"
        causes = [r for r in failures if r.status not in (STOPPED, MISSING)]
        missing = [r for r in failures if r.status == MISSING]
        stopped = [r for r in failures if r.status == STOPPED]
        head += f" ({len(causes) + len(missing)} of {len(self.ranks)} ranks failed)"
        shared = self.shared_gpus
        if shared:  # the root cause of NCCL's "Duplicate GPU detected", whatever the ranks then did
            head += f"; {shared[0]}"
        elif causes:  # the first line alone (the summary shows only it) names the root cause
            head += f"; first: {self._describe(causes[0])[0]}"
        lines = [head, *shared[1:]]
        for outcome in causes:
            lines += self._describe(outcome)
        shown: set[Path] = set()
        by_host: dict[str | None, list[RankOutcome]] = {}
        for outcome in missing:
            by_host.setdefault(outcome.host, []).append(outcome)
        for host, group in by_host.items():
            ranks = f"rank{'s' if len(group) > 1 else ''} {_ranks_text(group)}"
            log = group[0].agent_log
            if host is None:
                lines.append(
                    f"{ranks} never started; no rank reported from their node, so which node it is is unknown"
                )
            elif log is None:
                lines.append(f"{ranks} on {host} never started")
            else:
                lines.append(f"{ranks} on {host} never started — see {log.name}:")
                lines += _indent(tail_lines(log, TAIL) or ["(the log is empty)"])
                shown.add(log)
        for host, code, log in zip(self.agent_hosts, self.agent_exit_codes, self.agent_logs, strict=False):
            if code and log not in shown and (missing or not causes):
                lines.append(f"the agent on {host} exited with code {code}; the end of {log.name}:")
                lines += _indent(tail_lines(log, TAIL) or ["(the log is empty)"])
        if stopped:
            lines.append(
                f"rank{'s' if len(stopped) > 1 else ''} {_ranks_text(stopped)} "
                "were still running and were stopped because of the failure above."
            )
        if self.survivors:
            lines.append(
                f"{len(self.survivors)} process(es) of this job survived SIGKILL: pids "
                f"{', '.join(map(str, self.survivors))} (GPUCLUSTER_JOB_ID={self.job_id})"
            )
        lines += list(self.notes)
        lines.append(f"job directory (per-rank logs kept): {self.job_dir}")
        return "\n".join(lines)

    def _describe(self, r: RankOutcome) -> list[str]:
        where = r.where()
        if r.status == ERROR:
            error = r.error or {}
            out = [f"{where} raised {error.get('type', 'an error')}: {error.get('message', '')}"]
            out += _indent((error.get("traceback") or "").rstrip().splitlines()[-TAIL:])
        elif r.status == HUNG:
            out = [f"{where} never finished (still running at the timeout); the end of its log (stack dump):"]
            out += _indent(tail_lines(r.log_path, TAIL) if r.log_path else [])
        else:  # CRASHED
            how = r.exit_text() or "ended without reporting a result"
            out = [f"{where} {how} before reporting a result; the end of its log:"]
            out += _indent(tail_lines(r.log_path, TAIL) if r.log_path else [])
        if r.log_path is not None:
            out.append(f"  log: {r.log_path}")
        return out


def shared_gpus(ranks: Sequence[RankOutcome]) -> list[str]:
    """A sentence per physical GPU (by UUID) that two or more ranks of one host took. NCCL refuses
    such a job at init ("Duplicate GPU detected"); said here, it names the ranks, the host and the
    devices each rank saw, so the cause (more ranks than GPUs, a per-task GPU binding that shows
    every rank device 0...) is read off the message."""
    taken: dict[tuple[str, str], list[RankOutcome]] = {}
    for rank in ranks:
        uuid = (rank.gpu or {}).get("uuid")
        if uuid and rank.host:
            taken.setdefault((rank.host, str(uuid)), []).append(rank)
    out = []
    for (host, uuid), group in taken.items():
        if len(group) < 2:
            continue
        gpu = group[0].gpu or {}
        out.append(
            f"ranks {_ranks_text(group)} on {host} all took GPU {uuid} (CUDA device {gpu.get('index')} of "
            f"{gpu.get('visible')} visible, CUDA_VISIBLE_DEVICES={gpu.get('cuda_visible_devices') or '(unset)'}): "
            "NCCL refuses two ranks on one GPU; run at most as many ranks per node as it has GPUs, each "
            "seeing its own (Slurm: --gpus-per-node with --gpu-bind=none, not --gpus-per-task)"
        )
    return out


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"    {line}" for line in lines]


def _ranks_text(outcomes: Sequence[RankOutcome]) -> str:
    return ", ".join(str(r.rank) for r in outcomes)


_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exit_codes(text: str) -> dict[int, int]:
    """``rank -> exit code`` from the failure summary a torchrun agent prints when a worker fails."""
    return {int(rank): int(code) for rank, code in _TORCHRUN_FAILURE.findall(text)}


def build_result(
    *,
    job_id: str,
    job_dir: Path,
    world_size: int,
    nproc_per_node: int,
    hosts: Sequence[str],
    commands: Sequence[LaunchCommand],
    process: ProcessOutcome,
    states: dict[int, dict],
    timeout_s: float,
) -> JobResult:
    exit_codes: dict[int, int] = {}
    for log in process.agent_logs:
        exit_codes.update(torchrun_exit_codes("\n".join(tail_lines(log, 400, max_bytes=256 * 1024))))
    any_error = any(s.get("status") == ERROR for s in states.values())
    node_hosts = _node_hosts(states, hosts, nproc_per_node, world_size)
    agent_log_of = dict(zip(hosts, process.agent_logs, strict=False))
    outcomes = []
    for rank in range(world_size):
        state = states.get(rank)
        node = rank // nproc_per_node
        if state is None:
            host = node_hosts.get(node)
            outcomes.append(
                RankOutcome(
                    rank=rank,
                    host=host,
                    local_rank=rank % nproc_per_node,
                    node_rank=node,
                    status=MISSING,
                    agent_log=agent_log_of.get(host) if host else None,
                    exit_code=exit_codes.get(rank),
                )
            )
            continue
        status = state.get("status")
        if status == "running":
            status = HUNG if process.timed_out else (STOPPED if any_error else CRASHED)
        outcomes.append(
            RankOutcome(
                rank=rank,
                host=state.get("host"),
                local_rank=state.get("local_rank"),
                node_rank=state.get("node_rank"),
                status=status,
                value=state.get("value"),
                error=state.get("error"),
                exit_code=exit_codes.get(rank, 1 if status == ERROR else None),
                log_path=rank_log_path(job_dir, rank),
                reason=state.get("reason"),
                started_at=state.get("started_at"),
                finished_at=state.get("finished_at"),
                gpu=state.get("gpu"),
            )
        )
    notes = list(process.notes)
    if process.start_error:
        notes.append(process.start_error)
    if all(o.ok for o in outcomes) and (process.timed_out or any(process.agent_exit_codes)):
        notes.append(
            "every rank reported success, but the job did not end cleanly (an abort or hang during "
            "teardown); see the agent logs"
        )
    return JobResult(
        job_id=job_id,
        job_dir=job_dir,
        ranks=tuple(outcomes),
        commands=tuple(commands),
        duration_s=process.duration_s,
        timed_out=process.timed_out and not all(o.ok for o in outcomes),
        timeout_s=timeout_s,
        abort_reason=process.abort_reason or process.start_error,
        agent_exit_codes=process.agent_exit_codes,
        agent_logs=process.agent_logs,
        agent_hosts=tuple(hosts),
        survivors=process.survivors,
        notes=tuple(notes),
    )


def _node_hosts(states: dict[int, dict], hosts: Sequence[str], nproc: int, world: int) -> dict[int, str]:
    """``node rank -> host``: from the ranks that reported, and by elimination for one silent node."""
    if len(hosts) == 1:
        return {0: hosts[0]}
    known: dict[int, str] = {}
    for state in states.values():
        if state.get("node_rank") is not None and state.get("host"):
            known[int(state["node_rank"])] = str(state["host"])
    reported = set(known.values())
    unheard = [h for h in hosts if h not in reported and not (is_local_host(h) and _any_local(reported))]
    silent_nodes = [n for n in range(max(world // max(nproc, 1), 1)) if n not in known]
    if len(unheard) == 1 and len(silent_nodes) == 1:
        known[silent_nodes[0]] = unheard[0]
    return known


def _any_local(names: set[str]) -> bool:
    return any(is_local_host(n) for n in names)
