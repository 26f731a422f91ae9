"""What a collective sweep job measured, per collective: the ranks' values (``collect``) or parsed
nccl-tests runs (``points_from_runs``) turned into `CollectiveData`, which ``checks/collectives.py``
judges. Pure: no torch, no pytest, no launching.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.maths.metrics import summarize
from pytest_gpucluster.maths.sweep import Point, summarize_sweep
from pytest_gpucluster.parsers.nccl_tests import Run

__all__ = ["CollectiveData", "collect", "points_from_runs"]


@dataclass(frozen=True, slots=True)
class CollectiveData:
    """What one job measured of one collective: its points, or why it could not run."""

    collective: str
    points: tuple[Point, ...] = ()
    skipped: str | None = None
    hosts: tuple[str, ...] = ()
    """Host of each rank, in rank order."""
    wrong_by_rank: Mapping[tuple[int, bool], tuple[int, ...]] = field(default_factory=dict)
    """``(size_bytes, in_place) -> wrong elements per rank`` where the check ran."""
    timer: str | None = None
    """How the sweep timed a span (``perf_counter``, ``cuda_events``); None for nccl-tests output."""


def collect(values: Sequence[Mapping[str, Any]]) -> dict[str, CollectiveData]:
    """Per collective, the points of all its sweeps in one job (``values``: each rank's return
    value of ``collectives:sweep_many``, in rank order), merged by size and placement."""
    if not values:
        raise JobFailed("the collective sweep job returned no rank values")
    hosts = tuple(str(v.get("host", "?")) for v in values)
    merged: dict[str, dict[tuple[int, bool], Point]] = {}
    skipped: dict[str, str] = {}
    timers: dict[str, str] = {}
    wrong: dict[str, dict[tuple[int, bool], tuple[int, ...]]] = {}
    for index in range(len(values[0]["sweeps"])):
        per_rank = [v["sweeps"][index] for v in values]
        collective = str(per_rank[0]["collective"])
        reasons = sorted({str(p["skipped"]) for p in per_rank if "skipped" in p})
        if reasons:
            skipped[collective] = "; ".join(reasons)
            continue
        points = merged.setdefault(collective, {})
        timers.setdefault(collective, str(per_rank[0].get("timer") or ""))
        for point in summarize_sweep(per_rank):
            points.setdefault((point.size_bytes, point.in_place), point)
        for n, raw in enumerate(per_rank[0]["points"]):
            for placement in ("out_of_place", "in_place"):
                cells = [r["points"][n].get(placement) for r in per_rank]
                if cells[0] is not None and all(c and c.get("wrong") is not None for c in cells):
                    key = (int(raw["size_bytes"]), placement == "in_place")
                    wrong.setdefault(collective, {})[key] = tuple(int(c["wrong"]) for c in cells)
    out: dict[str, CollectiveData] = {}
    for collective in dict.fromkeys(str(s["collective"]) for s in values[0]["sweeps"]):
        if collective in skipped:
            out[collective] = CollectiveData(collective, skipped=skipped[collective], hosts=hosts)
        else:
            points = tuple(v for _, v in sorted(merged.get(collective, {}).items()))
            out[collective] = CollectiveData(
                collective, points, None, hosts, wrong.get(collective, {}), timers.get(collective) or None
            )
    return out


def points_from_runs(runs_per_repeat: Sequence[Sequence[Run]]) -> list[Point]:
    """Points from nccl-tests output, one list of parsed runs per repetition of the same command:
    per size, the median over the repetitions (nccl-tests prints no per-rank times)."""
    cells: dict[tuple[int, bool], list[tuple[float, float, float, int | None]]] = {}
    meta: dict[int, tuple[str, int, int]] = {}
    for runs in runs_per_repeat:
        for run in runs:
            for row in run.rows:
                meta[row.size_bytes] = (run.collective or "?", row.count, run.nranks or 0)
                for in_place, m in ((False, row.out_of_place), (True, row.in_place)):
                    if m is not None:
                        cells.setdefault((row.size_bytes, in_place), []).append(
                            (m.time_us, m.algbw_gbs, m.busbw_gbs, m.wrong)
                        )
    points = []
    for (size, in_place), rows in sorted(cells.items()):
        collective, count, nranks = meta[size]
        times = tuple(r[0] for r in rows)
        busbws = [r[2] for r in rows]
        wrongs = [r[3] for r in rows]
        points.append(
            Point(
                collective=collective,
                size_bytes=size,
                count=count,
                in_place=in_place,
                nranks=nranks,
                time_us=statistics.median(times),
                algbw_gbs=statistics.median(r[1] for r in rows),
                busbw_gbs=statistics.median(busbws),
                wrong=None if any(w is None for w in wrongs) else sum(int(w) for w in wrongs),
                slowest_rank=-1,
                per_rank_time_us=(),
                per_rank_lag_us=(),
                repeat_time_us=times,
                busbw_spread=summarize(busbws),
            )
        )
    return points
