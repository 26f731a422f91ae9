"""Jobs shared between tests: a test asks for the `Part` it needs, and pays for a launch at most once.

A `Part` is one workload with its options and the ranks it runs on. `SharedJobs.run` gives a test
the `PartRun` of its part:

- an equal part that already ran (test_scaling's 2-rank run is test_sft's) is not run again;
- the first request launches, in one job, this part and every part the tests still to come will
  ask for that runs on the same ranks (``upcoming``, from the plugin) — a launch costs seconds of
  imports and rendezvous before a workload starts, so several workloads share them
  (``workloads/bundle.py``);
- a part whose ranks skipped raises `JobSkipped` (the plugin turns it into a skip); a part that
  failed raises `JobFailed` with the job's report. Every test that asked for the part gets its own
  exception with the same message. When a bundled job fails, the parts that finished before the
  failure still reach their tests.

`SharedJobs.rerun` runs a part again, alone, for the regression gate's confirmation of a
suspected regression (``Recorder.check_all(..., remeasure=...)``); a second test asking to
confirm the same part gets the same rerun.

No pytest here: the plugin's ``shared_jobs`` fixture builds one `SharedJobs` per session around
the session's cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterError, JobFailed, JobSkipped
from pytest_gpucluster.workloads.bundle import part_path

__all__ = ["BUNDLE_WORKLOAD", "Part", "PartRun", "SharedJobs", "job_timing"]

BUNDLE_WORKLOAD = "pytest_gpucluster.workloads.bundle:run_parts"


@dataclass(frozen=True, slots=True)
class Part:
    """One workload a test needs run: what, with which options, on which ranks."""

    name: str
    """How jobs and messages call it: ``collectives-all_reduce``, ``sft-tiny-zero2-1x2``."""
    workload: str
    options: Mapping[str, Any] = field(default_factory=dict)
    nodes: int = 1
    nproc_per_node: int | None = None
    """None: the cluster's ranks per node."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the cluster's default environment (the profile's NCCL variables)."""
    timeout_s: float = 600.0
    deadline: str = ""
    """How ``timeout_s`` was chosen (`plans.deadlines`), shown by ``--gpucluster-dry-run``."""
    init_process_group: bool = True
    shareable: bool = True
    """False keeps the part in a job of its own (it must not run beside others, or time them)."""
    measures_memory: bool = False
    """It reports its process's peak memory: in a shared job it runs before the parts that do not,
    since a peak can only be reset to what the process holds when the part starts."""
    estimate_s: float | None = None
    """How long a healthy run of it alone takes, start-up included (`plans.deadlines`); None: not
    estimated. The dry run's table and total, the budget and results.json's job times use it."""
    startup_s: float = 0.0
    """How much of ``estimate_s`` is start-up, which parts sharing a job pay once."""

    @property
    def key(self) -> str:
        """Equal keys are the same work: the second asker gets the first one's run."""
        return json.dumps(
            [self.workload, self.options, self.nodes, self.nproc_per_node, self.env, self.init_process_group],
            sort_keys=True,
            default=str,
        )


@dataclass(frozen=True, slots=True)
class PartRun:
    """What a part's ranks returned (rank order), and the job that ran it."""

    part: Part
    values: tuple[dict[str, Any], ...]
    job_id: str
    job_dir: Path
    launched_by: str
    """The test whose request launched the job (a later test reusing the run can say so)."""
    companions: tuple[str, ...] = ()
    """The other parts of the same job."""

    @property
    def origin(self) -> str:
        shared = f", shared with {', '.join(self.companions)}" if self.companions else ""
        return f"job {self.job_id} ({self.job_dir}{shared})"


Outcome = PartRun | GpuClusterError


class SharedJobs:
    """One per session: runs parts, once each, bundling those that launch alike."""

    def __init__(
        self,
        cluster: Any,
        upcoming: Callable[[], Iterable[Part]] = tuple,
        env: Mapping[str, str] | None = None,
        on_job: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.upcoming = upcoming
        self.env = dict(env or {})
        """Every job's environment (the session's NCCL variables), under each part's own."""
        self.on_job = on_job
        """Told of every job once it ended: its parts, estimate, deadline and the time it took."""
        self._done: dict[str, Outcome] = {}

    def run(self, part: Part, test_id: str) -> PartRun:
        __tracebackhide__ = True
        if part.key not in self._done:
            self._launch(self._group(part), test_id)
        outcome = self._done[part.key]
        if isinstance(outcome, GpuClusterError):
            raise type(outcome)(str(outcome))
        return outcome

    def rerun(self, part: Part, test_id: str) -> PartRun:
        """``part`` measured again in a job of its own (never bundled, never the first run's values)."""
        __tracebackhide__ = True
        key = f"rerun:{part.key}"
        if key not in self._done:
            named = part if part.name.endswith("-confirm") else replace(part, name=f"{part.name}-confirm")
            self._done[key] = self._run_alone(named, test_id)
        outcome = self._done[key]
        if isinstance(outcome, GpuClusterError):
            raise type(outcome)(str(outcome))
        return outcome

    def _env(self, part: Part) -> dict[str, str] | None:
        return {**self.env, **part.env} or None

    def _launch_shape(self, part: Part) -> str:
        """Parts with the same shape run on the same ranks with the same environment: one job can hold them."""
        nproc = part.nproc_per_node or getattr(getattr(self.cluster, "spec", None), "nproc_per_node", None)
        return json.dumps([part.nodes, nproc, self._env(part), part.init_process_group], sort_keys=True)

    def _group(self, part: Part) -> list[Part]:
        """The part, then every upcoming part not yet run that may share its job."""
        if not part.shareable:
            return [part]
        shape = self._launch_shape(part)
        group = {part.key: part}
        for other in self.upcoming():
            if (
                other.shareable
                and other.key not in self._done
                and other.key not in group
                and self._launch_shape(other) == shape
            ):
                group[other.key] = other
        return sorted(group.values(), key=lambda p: not p.measures_memory)  # stable: else in test order

    def _launch(self, parts: list[Part], test_id: str) -> None:
        __tracebackhide__ = True
        if len(parts) == 1:
            self._done[parts[0].key] = self._run_alone(parts[0], test_id)
            return
        first = parts[0]
        started = time.monotonic()
        try:
            job = self.cluster.run(
                BUNDLE_WORKLOAD,
                nodes=first.nodes,
                nproc_per_node=first.nproc_per_node,
                env=self._env(first),
                timeout=sum(p.timeout_s for p in parts),
                options={"parts": [_part_options(p) for p in parts]},
                name=f"shared-{len(parts)}-parts",
                init_process_group=first.init_process_group,
            )
            values = job.values
        except JobFailed as exc:
            self._tell(parts, started, getattr(exc.result, "job_id", None), "failed")
            self._done.update(_salvage(parts, exc, test_id))
            return
        except GpuClusterError as exc:  # could not launch, or every rank skipped
            self._done.update({p.key: exc for p in parts})
            return
        self._tell(parts, started, job.job_id, "ok")
        for index, part in enumerate(parts):
            self._done[part.key] = _part_outcome(
                part,
                [v["parts"][index] for v in values],
                job.job_id,
                Path(job.job_dir),
                test_id,
                tuple(p.name for p in parts if p is not part),
            )

    def _tell(self, parts: list[Part], started: float, job_id: str | None, status: str) -> None:
        if self.on_job is not None:
            ranks = getattr(getattr(self.cluster, "spec", None), "nproc_per_node", None)
            self.on_job(job_timing(parts, time.monotonic() - started, job_id, status, ranks))

    def _run_alone(self, part: Part, test_id: str) -> Outcome:
        started = time.monotonic()
        try:
            job = self.cluster.run(
                part.workload,
                nodes=part.nodes,
                nproc_per_node=part.nproc_per_node,
                env=self._env(part),
                timeout=part.timeout_s,
                options=dict(part.options),
                name=part.name,
                init_process_group=part.init_process_group,
            )
            values = tuple(job.values)
        except JobFailed as exc:
            self._tell([part], started, getattr(exc.result, "job_id", None), "failed")
            return exc
        except GpuClusterError as exc:
            return exc
        self._tell([part], started, job.job_id, "ok")
        return PartRun(part, values, job.job_id, Path(job.job_dir), test_id)


def job_timing(
    parts: list[Part], actual_s: float, job_id: str | None, status: str, ranks_per_node: int | None = None
) -> dict[str, Any]:
    """results.json's record of one job: its parts, its nodes x ranks, the plan's estimate (their
    work plus one start-up, `plans.startup.launch_estimate`, as the plan adds them) and deadline,
    and the time it really took (what a later dry run's calibration reads, `plans.calibration`);
    its wall-clock window (``started_at``/``ended_at``): a failed job's ranks were killed by the
    suite, and an XID in that window is the kill's (`checks.burnin.xid_classes.kill_windows`)."""
    from pytest_gpucluster.plans.startup import launch_estimate

    ended = time.time()
    estimate = launch_estimate((p.estimate_s, p.startup_s) for p in parts)
    return {
        "job_id": job_id,
        "parts": [p.name for p in parts],
        "nodes": parts[0].nodes,
        "ranks_per_node": parts[0].nproc_per_node or ranks_per_node,
        "estimate_s": round(estimate, 1) if estimate is not None else None,
        "deadline_s": round(sum(p.timeout_s for p in parts), 1),
        "actual_s": round(actual_s, 1),
        "status": status,
        "started_at": round(ended - actual_s, 3),
        "ended_at": round(ended, 3),
    }


def _part_options(part: Part) -> dict[str, Any]:
    return {
        "name": part.name,
        "workload": part.workload,
        "options": dict(part.options),
        "timeout_s": part.timeout_s,
        "measures_memory": part.measures_memory,
    }


def _part_outcome(
    part: Part,
    records: list[Mapping[str, Any]],
    job_id: str,
    job_dir: Path,
    test_id: str,
    companions: tuple[str, ...],
) -> Outcome:
    """One part's outcome from every rank's record of it (``workloads/bundle.py``)."""
    skipped = sorted({str(r.get("reason")) for r in records if r.get("status") == "skipped"})
    if skipped:
        return JobSkipped(f"{part.name} (part of job {job_id}): {'; '.join(skipped)}")
    return PartRun(part, tuple(r["value"] for r in records), job_id, job_dir, test_id, companions)


def _salvage(parts: list[Part], exc: JobFailed, test_id: str) -> dict[str, Outcome]:
    """A bundled job failed: parts every rank finished keep their values; the one that was running
    when the job died, and those after it, fail with the job's report naming that part."""
    result = exc.result
    if result is None:  # no job directory to read: every part failed with the job
        return {p.key: JobFailed(f"{p.name} failed with the job it shared: {exc}") for p in parts}
    job_dir, world = Path(result.job_dir), len(result.ranks)
    outcomes: dict[str, Outcome] = {}
    culprit: str | None = None
    names = tuple(p.name for p in parts)
    for index, part in enumerate(parts):
        records = _read_records(job_dir, index, world) if culprit is None else None
        if records is not None and all(r.get("status") in ("ok", "skipped") for r in records):
            others = tuple(n for n in names if n != part.name)
            outcomes[part.key] = _part_outcome(part, records, result.job_id, job_dir, test_id, others)
            continue
        if culprit is None:
            culprit = part.name
            timed_out = records is not None and any(r.get("status") == "timeout" for r in records)
            why = f" (it ran past its {part.timeout_s:g} s deadline)" if timed_out else ""
            outcomes[part.key] = JobFailed(f"{part.name} failed in a job it shared with others{why}: {exc}")
        else:
            outcomes[part.key] = JobFailed(
                f"{part.name} did not run: the job it shared failed earlier, in {culprit}: {exc}"
            )
    return outcomes


def _read_records(job_dir: Path, index: int, world: int) -> list[dict[str, Any]] | None:
    """Every rank's record of part ``index``, or None if a rank left none."""
    records = []
    for rank in range(world):
        path = part_path(job_dir, index, rank)
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None
    return records or None
