"""How much of ``pytest acceptance/`` is the harness: the suite's wall time over its workloads' own time.

Runs ``pytest acceptance/`` (extra arguments are passed on, e.g. ``--hw=cpu-local``) ``--runs`` times
in a fresh results directory each, and reads back every job it launched: a job's workload time is
rank 0's time inside the workload (``rank-0.json``: started to finished), and for a job carrying
several parts (``workloads/bundle.py``) the sum of rank 0's time in each part — start-up (the
launcher's agent, imports, rendezvous) is what the ratio charges to the harness. The 1-minute load
average before and after each run is printed: on a shared machine the suite's time follows it.

    python benchmarks/suite_time.py [--runs 3] [-- pytest arguments]

The last line holds the word ``ratio`` and ends with the median ratio (1.0 would mean no overhead).
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


def one_run(pytest_args: list[str]) -> tuple[float, float, list[tuple[str, float, str]], str]:
    with tempfile.TemporaryDirectory(prefix="gpucluster-suite-") as tmp:
        results = Path(tmp) / "results"
        argv = [sys.executable, "-m", "pytest", "acceptance/", "-q", "-p", "no:cacheprovider"]
        argv += [f"--results-dir={results}", *pytest_args]
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        jobs = []
        for job_dir in sorted((results / "jobs").glob("*")):
            seconds, what = workload_seconds(job_dir)
            jobs.append((job_dir.name, seconds, what))
        return wall, sum(s for _, s, _ in jobs), jobs, tail[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (put them after --)")
    args = parser.parse_args()
    ratios, walls = [], []
    for run in range(1, args.runs + 1):
        before = os.getloadavg()[0]
        wall, work, jobs, verdict = one_run(args.pytest_args)
        after = os.getloadavg()[0]
        for name, seconds, what in jobs:
            print(f"  {name}: {seconds:.1f} s in {what}")
        ratio = wall / work if work > 0 else float("inf")
        ratios.append(ratio)
        walls.append(wall)
        print(
            f"run {run}: suite {wall:.1f} s, workloads {work:.1f} s in {len(jobs)} job(s), ratio {ratio:.2f}; "
            f"load average {before:.1f} -> {after:.1f}; pytest said: {verdict}",
            flush=True,
        )
    print(f"median suite time over {args.runs} run(s): {statistics.median(walls):.1f} s")
    print(f"suite time / workload time, median ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
