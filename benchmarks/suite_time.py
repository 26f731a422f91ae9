"""How much of ``pytest acceptance/`` is the harness, and what the quick tier costs beside the default run.

Runs ``pytest acceptance/`` (extra arguments are passed on, e.g. ``--hw=cpu-local``) ``--runs`` times
in a fresh results directory each; with ``--tiers``, each round runs the default suite and then
``-m quick`` side by side (same load, same round), and the quick tier's suite time over the default's
is printed per round and as a median (the quick tier's promise: at most a third). It reads back every
job it launched: a job's workload time is
rank 0's time inside the workload (``rank-0.json``: started to finished), and for a job carrying
several parts (``workloads/bundle.py``) the sum of rank 0's time in each part — start-up (the
launcher's agent, imports, rendezvous) is what the ratio charges to the harness. The 1-minute load
average before and after each run is printed: on a shared machine the suite's time follows it.

    python benchmarks/suite_time.py [--runs 3] [--tiers] [-- pytest arguments]

The ratio lines hold the word ``ratio`` and end with the median ratio: suite time over workload time
(1.0 would mean no overhead), the plan's estimated total over the time its jobs really took
(results.json ``plan.total_s`` over the sum of ``jobs[].actual_s``: how well the dry run's estimate
adds up, ``plans/startup.py``) and, with ``--tiers``, quick suite time over default suite time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def workload_seconds(job_dir: Path) -> tuple[float, str]:
    """Rank 0's time inside the job's workload(s), and what the job ran."""
    parts = sorted(job_dir.glob("part-*-rank-0.json"), key=lambda p: int(p.name.split("-")[1]))
    if parts:
        records = [json.loads(p.read_text(encoding="utf-8")) for p in parts]
        return sum(float(r.get("seconds") or 0.0) for r in records), "+".join(r["name"] for r in records)
    rank0 = job_dir / "rank-0.json"
    if not rank0.is_file():
        return 0.0, "(no rank-0.json)"
    record = json.loads(rank0.read_text(encoding="utf-8"))
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    spent = float(record.get("finished_at") or record.get("started_at") or 0) - float(
        record.get("started_at") or 0
    )
    return max(spent, 0.0), str(job.get("workload", "?"))


def plan_and_actual(results_json: Path) -> tuple[float, float]:
    """The plan's estimated total and the sum of the recorded jobs' real times (results.json)."""
    if not results_json.is_file():
        return 0.0, 0.0
    data = json.loads(results_json.read_text(encoding="utf-8"))
    actual = sum(float(j.get("actual_s") or 0.0) for j in data.get("jobs") or ())
    return float((data.get("plan") or {}).get("total_s") or 0.0), actual


def one_run(
    pytest_args: list[str],
) -> tuple[float, float, list[tuple[str, float, str]], str, tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="gpucluster-suite-") as tmp:
        results = Path(tmp) / "results"
        # --confcutdir: the suite as its users run it, without this repository's own test conftest
        # (which imports torch, matplotlib and hypothesis for pytester's sake: seconds per run).
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "acceptance/",
            "-q",
            "-p",
            "no:cacheprovider",
            "--confcutdir=acceptance",
        ]
        argv += [f"--results-dir={results}", *pytest_args]
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        jobs = []
        for job_dir in sorted((results / "jobs").glob("*")):
            seconds, what = workload_seconds(job_dir)
            jobs.append((job_dir.name, seconds, what))
        return wall, sum(s for _, s, _ in jobs), jobs, tail[0], plan_and_actual(results / "results.json")


def _run_and_report(label: str, pytest_args: list[str]) -> tuple[float, float, float]:
    """One suite run: its jobs and one summary line; returns (suite wall time, harness ratio, the
    plan's estimate over its jobs' real time)."""
    before = os.getloadavg()[0]
    wall, work, jobs, verdict, (planned, actual) = one_run(pytest_args)
    after = os.getloadavg()[0]
    for name, seconds, what in jobs:
        print(f"  {name}: {seconds:.1f} s in {what}")
    ratio = wall / work if work > 0 else float("inf")
    print(
        f"{label}: suite {wall:.1f} s, workloads {work:.1f} s in {len(jobs)} job(s), ratio {ratio:.2f}; "
        f"load average {before:.1f} -> {after:.1f}; pytest said: {verdict}",
        flush=True,
    )
    plan_ratio = planned / actual if actual > 0 else float("inf")
    print(f"{label}: plan's estimate {planned:.1f} s, jobs' actual_s {actual:.1f} s, ratio {plan_ratio:.2f}")
    return wall, ratio, plan_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--tiers", action="store_true", help="each round also runs -m quick beside the default suite"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (put them after --)")
    args = parser.parse_args()
    ratios, walls, quick_walls, tier_ratios, plan_ratios, quick_plan_ratios = [], [], [], [], [], []
    for run in range(1, args.runs + 1):
        wall, ratio, plan_ratio = _run_and_report(f"run {run} default", args.pytest_args)
        ratios.append(ratio)
        walls.append(wall)
        plan_ratios.append(plan_ratio)
        if args.tiers:
            quick, _, quick_plan = _run_and_report(f"run {run} -m quick", [*args.pytest_args, "-m", "quick"])
            quick_walls.append(quick)
            quick_plan_ratios.append(quick_plan)
            tier_ratios.append(quick / wall)
            print(f"run {run}: quick / default suite time ratio {quick / wall:.3f}", flush=True)
    print(f"median suite time over {args.runs} run(s): {statistics.median(walls):.1f} s")
    if args.tiers:
        print(f"median quick-tier suite time over {args.runs} run(s): {statistics.median(quick_walls):.1f} s")
    print(f"suite time / workload time, median ratio: {statistics.median(ratios):.3f}")
    print(f"default: plan's estimate / jobs' actual time, median ratio: {statistics.median(plan_ratios):.3f}")
    if args.tiers:
        print(
            f"quick: plan's estimate / jobs' actual time, median ratio: {statistics.median(quick_plan_ratios):.3f}"
        )
        print(f"quick tier / default suite time, median ratio: {statistics.median(tier_ratios):.3f}")


if __name__ == "__main__":
    main()
