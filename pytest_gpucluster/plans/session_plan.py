"""The session's plan: every job the selected tests would launch, its estimate and deadline, added up.

``--gpucluster-dry-run`` prints it as a table with the session's total and each tier's;
``--gpucluster-budget`` refuses a session whose total exceeds the budget; results.json keeps it
(``plan``) beside what each job really took (``jobs``), so estimates can be checked.

Parts that launch alike (same nodes x ranks, environment and process group, `harness.SharedJobs`)
run in one job: the plan adds their work and counts one start-up, the largest of theirs. A job
whose time was not estimated (a fixed deadline) is listed and left out of the total, which says so.
Pure: no pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
        if any(p.estimate_s is None for p in self.parts):
            return None
        work = sum((p.estimate_s or 0.0) - p.startup_s for p in self.parts)
        return (work + max(p.startup_s for p in self.parts)) * self.parts[0].count

    @property
    def deadline_s(self) -> float:
        return sum(p.deadline_s for p in self.parts) * self.parts[0].count


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

    def total_s(self, tiers: Sequence[str] | None = None) -> float:
        """The estimated wall time, jobs one after another (not estimated ones left out)."""
        return sum(launch.estimate_s or 0.0 for launch in self.launches(tiers))

    def unestimated(self) -> list[PlannedJob]:
        return [j for j in self.jobs if j.estimate_s is None]

    def costliest(self, count: int = 3) -> list[Launch]:
        """The launches that cost most by estimate, then those not estimated (by deadline)."""
        launches = self.launches()
        estimated = sorted(
            (x for x in launches if x.estimate_s is not None), key=lambda x: -(x.estimate_s or 0)
        )
        rest = sorted((x for x in launches if x.estimate_s is None), key=lambda x: -x.deadline_s)
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
        lines = [
            f"{'JOB':<{width}}  {'NODES x RANKS':<13}  {'TIER':<8}  {'ESTIMATED RUN':>13}  {'DEADLINE':>9}"
        ]
        for job in self.jobs:
            shape = f"{job.nodes} x {job.ranks_per_node}"
            lines.append(
                f"{_label(job):<{width}}  {shape:<13}  {job.tier:<8}  {short_time(_scaled(job)):>13}  "
                f"{short_time(job.deadline_s * job.count):>9}"
            )
        launches = self.launches()
        shared = sum(1 for launch in launches if len(launch.parts) > 1)
        lines.append(
            f"estimated total: {short_time(self.total_s())} for {len(self.jobs)} "
            f"job part(s) in {len(launches)} launch(es), one after another"
            + (f"; {shared} launch(es) hold several parts and pay one start-up" if shared else "")
        )
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

    def to_json(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "total_s": round(self.total_s(), 1),
            "tiers": {tier: round(total, 1) for tier, total, _ in self.tier_totals()},
            "jobs": [j.to_json() for j in self.jobs],
        }


def over_budget(plan: SessionPlan, budget_s: float, source: str) -> str:
    """Why a session over its budget does not start: its estimate, the budget, the costliest jobs."""
    costly = "; ".join(
        f"{' + '.join(p.name for p in launch.parts)} "
        + (
            short_time(launch.estimate_s)
            if launch.estimate_s is not None
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
