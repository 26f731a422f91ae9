"""Calibration: the plan counts what a job really took in an earlier run, where it ran the same job.

Every real run records in results.json, per job, its parts, nodes x ranks and the seconds it took
(``jobs[].actual_s``, `harness.job_timing`). Given such a run (``--baseline PATH``, or the newest
run of the ``--gpucluster-history`` store), the dry run's table, its total and
``--gpucluster-budget`` take a launch's recorded time instead of the formula when the earlier run
holds a job that is the same launch: the same part names, the same nodes x ranks, finished ``ok``,
in a run of the same profile and the same tier (the tier sets the durations: a quick sweep and a
standard one of the same name are not the same work). Anything else keeps the formula. The table
says which is which (``measured 2026-11-27`` or ``estimated``).

Pure: no pytest, no torch, no file access (`session.plan` reads the files).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RecordedJob", "RecordedRun", "launch_key", "recorded_run", "tier_of"]

_TIER_KEYS = ("name", "sweep", "load_s", "numerics_s", "soak_s")
"""What of results.json's ``tier`` (`session.header`) sets the work of a job: its name and durations."""

LaunchKey = tuple[tuple[str, ...], int, int]
"""A launch as calibration matches it: its part names (sorted), nodes, ranks per node."""


def launch_key(names: Iterable[str], nodes: int, ranks_per_node: int) -> LaunchKey:
    return (tuple(sorted(names)), int(nodes), int(ranks_per_node))


@dataclass(frozen=True, slots=True)
class RecordedJob:
    """One finished job of an earlier run, as results.json's ``jobs`` holds it."""

    key: LaunchKey
    actual_s: float


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """The job times of one earlier run, and what they may calibrate."""

    source: str
    """``results.json`` path, or ``history run #N (path)``."""
    profile: str | None
    tier: tuple[Any, ...] | None
    """`tier_of` the run's ``tier`` record."""
    started_at: float | None
    jobs: tuple[RecordedJob, ...]

    @property
    def when(self) -> str:
        """``2026-11-27`` (UTC), or ``an earlier run`` when the file does not say."""
        if self.started_at is None:
            return "an earlier run"
        return time.strftime("%Y-%m-%d", time.gmtime(self.started_at))

    @property
    def label(self) -> str:
        """The table's mark for a launch this run calibrates."""
        return f"measured {self.when}"

    def mismatch(self, profile: str, tier: tuple[Any, ...] | None) -> str | None:
        """Why this run cannot calibrate a session of ``profile`` at ``tier`` (`tier_of`); None when
        it can."""
        if not self.jobs:
            return (
                f"{self.source} holds no job times that say their nodes x ranks (jobs[]: parts, nodes, "
                "ranks_per_node, actual_s, status ok)"
            )
        if self.profile != profile:
            return f"{self.source} ran profile {self.profile}, this session {profile}"
        if self.tier != tier:
            return (
                f"{self.source} ran tier {_tier_text(self.tier)}, this session {_tier_text(tier)}: "
                "their durations set other work"
            )
        return None

    def actual_s(self, key: LaunchKey) -> float | None:
        """The recorded seconds of the launch ``key`` (the median, where the run launched it more
        than once: the pair jobs, a before and an after reading); None when it never ran it."""
        times = [job.actual_s for job in self.jobs if job.key == key]
        return statistics.median(times) if times else None


def recorded_run(data: Mapping[str, Any], source: str) -> RecordedRun:
    """The job times of a results.json (parsed ``data``): the jobs that finished ``ok`` and say
    their nodes x ranks (a job recorded without ``ranks_per_node``, by an older plugin, cannot be
    matched and is left out)."""
    profile = data.get("profile")
    jobs = []
    for entry in _entries(data.get("jobs")):
        names, nodes, ranks, actual = (
            entry.get("parts"), entry.get("nodes"), entry.get("ranks_per_node"), entry.get("actual_s"),
        )  # fmt: skip
        if entry.get("status") != "ok" or not _names(names) or not _count(nodes) or not _count(ranks):
            continue
        if not isinstance(actual, (int, float)) or isinstance(actual, bool) or actual < 0:
            continue
        jobs.append(RecordedJob(launch_key(names, nodes, ranks), float(actual)))
    return RecordedRun(
        source=source,
        profile=profile.get("name") if isinstance(profile, Mapping) else None,
        tier=tier_of(data.get("tier")),
        started_at=data.get("started_at") if isinstance(data.get("started_at"), (int, float)) else None,
        jobs=tuple(jobs),
    )


def tier_of(record: Any) -> tuple[Any, ...] | None:
    """The tier's name and durations from a ``tier`` record (results.json's, `session.header`)."""
    if not isinstance(record, Mapping):
        return None
    return tuple(record.get(key) for key in _TIER_KEYS)


def _tier_text(tier: tuple[Any, ...] | None) -> str:
    if tier is None:
        return "(none recorded)"
    name, *durations = tier
    given = ", ".join(f"{k} {v}" for k, v in zip(_TIER_KEYS[1:], durations, strict=True) if v is not None)
    return f"{name} ({given})" if given else str(name)


def _entries(jobs: Any) -> list[Mapping[str, Any]]:
    return [j for j in jobs if isinstance(j, Mapping)] if isinstance(jobs, Sequence) else []


def _names(names: Any) -> bool:
    return (
        isinstance(names, Sequence) and not isinstance(names, str) and all(isinstance(n, str) for n in names)
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
