"""The report's "Job times" section: each job's estimate (the plan's) beside what it really took.

results.json keeps both (``jobs[].estimate_s/actual_s/deadline_s``, `harness.job_timing`, and the
session's ``plan``), so that a later dry run can calibrate from them (`plans.calibration`); this
puts them where a person reads them: which jobs ran long against the plan, how close each came to
its deadline, and the session's total against the plan's. Pure: no pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.plans.session_plan import short_time

__all__ = ["JOB_TIME_HEADER", "job_time_rows", "job_time_summary"]

JOB_TIME_HEADER = ("job", "nodes x ranks", "status", "estimated", "took", "took / estimated", "deadline used")

_SHOWN_PARTS = 3


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _name(job: Mapping[str, Any]) -> str:
    parts = [str(p) for p in job.get("parts") or ()] or [str(job.get("job_id") or "?")]
    more = f" (+{len(parts) - _SHOWN_PARTS} more)" if len(parts) > _SHOWN_PARTS else ""
    return ", ".join(parts[:_SHOWN_PARTS]) + more


def _ratio(numerator: float | None, denominator: float | None, style: str) -> str:
    if numerator is None or not denominator:
        return "-"
    return f"{numerator / denominator:.2f}x" if style == "x" else f"{numerator / denominator:.0%}"


def job_time_rows(jobs: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """One row per job in the order they ran: its parts, shape, status, the plan's estimate, the
    time it took, their ratio and the share of its deadline it used."""
    rows = []
    for job in jobs:
        estimate, actual, deadline = (_number(job.get(k)) for k in ("estimate_s", "actual_s", "deadline_s"))
        nodes, ranks = job.get("nodes"), job.get("ranks_per_node")
        rows.append(
            (
                _name(job),
                f"{nodes} x {ranks}" if ranks is not None else f"{nodes} x ?",
                str(job.get("status") or "?"),
                short_time(estimate),
                short_time(actual),
                _ratio(actual, estimate, "x"),
                _ratio(actual, deadline, "%"),
            )
        )
    return rows


def job_time_summary(jobs: Sequence[Mapping[str, Any]], plan: Mapping[str, Any] | None) -> str:
    """One sentence: the jobs' time in all against the plan's total, and the job that ran furthest
    past its estimate."""
    took = [t for t in (_number(j.get("actual_s")) for j in jobs) if t is not None]
    text = f"{len(jobs)} job(s) took {short_time(sum(took))} in all"
    planned = _number((plan or {}).get("total_s"))
    if planned:
        text += f" against the plan's estimate of {short_time(planned)} ({sum(took) / planned:.2f}x)"
    over = [
        (actual / estimate, j)
        for j in jobs
        if (actual := _number(j.get("actual_s"))) is not None and (estimate := _number(j.get("estimate_s")))
    ]
    if over:
        ratio, worst = max(over, key=lambda pair: pair[0])
        if ratio > 1:
            text += f"; furthest past its estimate: {_name(worst)} at {ratio:.2f}x"
    unestimated = sum(_number(j.get("estimate_s")) is None for j in jobs)
    if unestimated:
        text += f"; {unestimated} job(s) had no estimate (a fixed deadline, or no device peak to plan from)"
    return text + ". A later dry run with this results.json as --baseline plans from these times."
