"""The session's plan: every job the selected tests would launch, its estimate and deadline, added up.

``--gpucluster-dry-run`` prints it as a table with the session's total and each tier's;
``--gpucluster-budget`` refuses a session whose total exceeds the budget; results.json keeps it
(``plan``) beside what each job really took (``jobs``), so estimates can be checked.

Parts that launch alike (same nodes x ranks, environment and process group, `harness.SharedJobs`)
run in one job: the plan adds their work and counts one start-up, the largest of theirs
(`plans.startup`: the *expected* start-up, not the allowance a deadline grants). A job whose time
was not estimated (a fixed deadline) is listed and left out of the total, which says so. With an
earlier run's job times (`plans.calibration`), a launch that run made counts its recorded time,
marked ``measured <date>`` in the table, instead of the formula.
Pure: no pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.plans.calibration import LaunchKey, RecordedRun, launch_key
from pytest_gpucluster.plans.startup import launch_estimate
from pytest_gpucluster.plans.tiers import TIERS

__all__ = ["Launch", "PlannedJob", "SessionPlan", "over_budget", "short_time"]


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job part the plan holds."""

    name: str
    nodes: int
    ranks_per_node: int
    tier: str
    """The shortest tier that runs it (``quick`` < ``standard`` < ``burnin``)."""
    deadline_s: float
    estimate_s: float | None
    startup_s: float = 0.0
    shape: str = ""
    """Parts of the same non-empty shape share one job; empty: a job of its own."""
    why: str = ""
    """How the deadline and estimate were set (shown with -v)."""
    count: int = 1
    """Jobs of this kind (the pairwise localization's pair jobs)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "tier": self.tier,
            "deadline_s": self.deadline_s,
            "estimate_s": self.estimate_s,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class Launch:
    """What really starts: one job holding one part or several that share it."""

    parts: tuple[PlannedJob, ...]

    @property
    def estimate_s(self) -> float | None:
        """Its parts' work and one start-up (`plans.startup.launch_estimate`), times the jobs it
        stands for; a part not estimated adds nothing (the table names it), None if none is."""
        estimate = launch_estimate((p.estimate_s, p.startup_s) for p in self.parts)
        return estimate * self.parts[0].count if estimate is not None else None

    @property
    def deadline_s(self) -> float:
        return sum(p.deadline_s for p in self.parts) * self.parts[0].count

    @property
    def key(self) -> LaunchKey:
        """What calibration matches a recorded job on: part names, nodes, ranks per node."""
        first = self.parts[0]
        return launch_key((p.name for p in self.parts), first.nodes, first.ranks_per_node)


def _launches(jobs: Iterable[PlannedJob]) -> list[Launch]:
    groups: dict[str, list[PlannedJob]] = {}
    for job in jobs:
        key = job.shape if job.shape else f"alone:{job.name}:{id(job)}"
        groups.setdefault(key, []).append(job)
    return [Launch(tuple(parts)) for parts in groups.values()]


def short_time(value: float | None) -> str:
    """``45 s``, ``2.3 min``, ``1 h 32 min``: a table cell."""
    if value is None:
        return "-"
    if value < 90:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    hours, rest = divmod(round(value / 60), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


@dataclass
class SessionPlan:
    """The plan of one session, built at collection (the controller's)."""

    jobs: list[PlannedJob] = field(default_factory=list)
    basis: str = ""
    """Where the node count and shape come from (probed nodes, or the profile and hostfile)."""
    calibration: RecordedRun | None = None
    """An earlier run whose job times replace the formula where it ran the same launch."""
    calibration_note: str = ""
    """Why an earlier run given (``--baseline``, the history) calibrates nothing, when it does not."""

    def add(self, job: PlannedJob) -> None:
        """Add a job part once: a second test asking for the same part adds nothing, and the part
        keeps the shortest tier of the tests that use it."""
        for index, known in enumerate(self.jobs):
            if known.name == job.name and known.shape == job.shape:
                if TIERS.index(job.tier) < TIERS.index(known.tier):  # type: ignore[arg-type]
                    self.jobs[index] = _with_tier(known, job.tier)
                return
        self.jobs.append(job)

    def launches(self, tiers: Sequence[str] | None = None) -> list[Launch]:
        return _launches(j for j in self.jobs if tiers is None or j.tier in tiers)

    def measured_s(self, launch: Launch) -> float | None:
        """The launch's recorded time in the calibrating run (times the jobs it stands for), or None."""
        if self.calibration is None:
            return None
        actual = self.calibration.actual_s(launch.key)
        return actual * launch.parts[0].count if actual is not None else None

    def expected_s(self, launch: Launch) -> float | None:
        """What the plan counts for the launch: its recorded time, else its estimate."""
        measured = self.measured_s(launch)
        return measured if measured is not None else launch.estimate_s

    def total_s(self, tiers: Sequence[str] | None = None) -> float:
        """The expected wall time, jobs one after another: recorded times where the calibrating run
        made the same launch, estimates elsewhere (not estimated ones left out)."""
        return sum(self.expected_s(launch) or 0.0 for launch in self.launches(tiers))

    def measured_launches(self) -> list[Launch]:
        return [launch for launch in self.launches() if self.measured_s(launch) is not None]

    def unestimated(self) -> list[PlannedJob]:
        """Parts with neither an estimate nor a recorded time."""
        measured = {id(p) for launch in self.measured_launches() for p in launch.parts}
        return [j for j in self.jobs if j.estimate_s is None and id(j) not in measured]

    def costliest(self, count: int = 3) -> list[Launch]:
        """The launches that cost most (recorded or estimated), then those not estimated (by deadline)."""
        launches = self.launches()
        estimated = sorted(
            (x for x in launches if self.expected_s(x) is not None), key=lambda x: -(self.expected_s(x) or 0)
        )
        rest = sorted((x for x in launches if self.expected_s(x) is None), key=lambda x: -x.deadline_s)
        return (estimated + rest)[:count]

    def tier_totals(self) -> list[tuple[str, float, int]]:
        """Each tier present: its cumulative total (the tiers nest) and its launch count."""
        present = {j.tier for j in self.jobs}
        totals = []
        for index, tier in enumerate(TIERS):
            if tier not in present:
                continue
            upto = TIERS[: index + 1]
            totals.append((tier, self.total_s(upto), len(self.launches(upto))))
        return totals

    def table(self) -> list[str]:
        """The table, its totals and what the totals leave out."""
        if not self.jobs:
            return [
                "no job: the selected tests launch nothing here, or skip for what the session lacks (-rs)"
            ]
        width = max(len("JOB"), *(len(_label(j)) for j in self.jobs))
        cells = self._run_cells()
        lines = [
            f"{'JOB':<{width}}  {'NODES x RANKS':<13}  {'TIER':<8}  {'ESTIMATED RUN':>13}  {'DEADLINE':>9}"
            + ("  FROM" if self.calibration is not None else "")
        ]
        for job in self.jobs:
            shape = f"{job.nodes} x {job.ranks_per_node}"
            run, basis = cells.get(id(job), (short_time(_scaled(job)), "estimated" if job.estimate_s else ""))
            lines.append(
                f"{_label(job):<{width}}  {shape:<13}  {job.tier:<8}  {run:>13}  "
                f"{short_time(job.deadline_s * job.count):>9}"
                + (f"  {basis}".rstrip() if self.calibration is not None else "")
            )
        launches = self.launches()
        shared = sum(1 for launch in launches if len(launch.parts) > 1)
        measured = len(self.measured_launches())
        lines.append(
            f"estimated total: {short_time(self.total_s())} for {len(self.jobs)} "
            f"job part(s) in {len(launches)} launch(es), one after another"
            + (f"; {shared} launch(es) hold several parts and pay one start-up" if shared else "")
        )
        if self.calibration is not None:
            rest = len(launches) - measured
            lines.append(
                f"calibrated: {measured} of {len(launches)} launch(es) count the time they took in "
                f"{self.calibration.source} ({self.calibration.label})"
                + (f"; the other {rest} the formula's estimate" if rest else "")
            )
        elif self.calibration_note:
            lines.append(f"not calibrated: {self.calibration_note}")
        if self.tier_totals():
            per_tier = ", ".join(
                f"{tier} {short_time(total)} ({count} launch(es))"
                for tier, total, count in self.tier_totals()
            )
            lines.append(f"by tier (each includes the shorter ones, at this run's durations): {per_tier}")
        missing = self.unestimated()
        if missing:
            names = ", ".join(j.name for j in missing)
            bound = sum(j.deadline_s * j.count for j in missing)
            lines.append(
                f"not estimated, not in the total: {names} (fixed deadlines; at most {short_time(bound)} more)"
            )
        return lines

    def _run_cells(self) -> dict[int, tuple[str, str]]:
        """The run time and ``FROM`` cells of the parts of measured launches: the launch's recorded
        time on its first part, the others pointing at it."""
        cells: dict[int, tuple[str, str]] = {}
        for launch in self.measured_launches():
            first, *others = launch.parts
            label = self.calibration.label if self.calibration is not None else ""
            shared = f", one job of {len(launch.parts)} parts" if others else ""
            cells[id(first)] = (short_time(self.measured_s(launch)), label + shared)
            for part in others:
                cells[id(part)] = ("", f"{label}, in {_label(first)}'s job")
        return cells

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "basis": self.basis,
            "total_s": round(self.total_s(), 1),
            "tiers": {tier: round(total, 1) for tier, total, _ in self.tier_totals()},
            "jobs": [j.to_json() for j in self.jobs],
        }
        if self.calibration is not None:
            data["calibration"] = {
                "source": self.calibration.source,
                "started_at": self.calibration.started_at,
                "measured": [
                    {"parts": [p.name for p in launch.parts], "actual_s": self.measured_s(launch)}
                    for launch in self.measured_launches()
                ],
            }
        elif self.calibration_note:
            data["calibration"] = {"none": self.calibration_note}
        return data


def over_budget(plan: SessionPlan, budget_s: float, source: str) -> str:
    """Why a session over its budget does not start: its estimate, the budget, the costliest jobs."""
    costly = "; ".join(
        f"{' + '.join(p.name for p in launch.parts)} "
        + (
            short_time(plan.expected_s(launch))
            + (
                f" ({plan.calibration.label})"
                if plan.calibration and plan.measured_s(launch) is not None
                else ""
            )
            if plan.expected_s(launch) is not None
            else f"(not estimated; deadline {short_time(launch.deadline_s)})"
        )
        for launch in plan.costliest()
    )
    return (
        f"the plan's estimated wall time {short_time(plan.total_s())} exceeds --gpucluster-budget "
        f"{short_time(budget_s)} (from {source}); nothing was launched but the node probe. "
        f"Costliest: {costly}. Select fewer tests (-m quick, -k), or see the whole plan with --gpucluster-dry-run"
    )


def _label(job: PlannedJob) -> str:
    return f"{job.name} (x{job.count})" if job.count > 1 else job.name


def _scaled(job: PlannedJob) -> float | None:
    return job.estimate_s * job.count if job.estimate_s is not None else None


def _with_tier(job: PlannedJob, tier: str) -> PlannedJob:
    from dataclasses import replace

    return replace(job, tier=tier)
