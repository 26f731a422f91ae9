"""What ``cluster.run`` costs over a plain ``torchrun --standalone`` of the same no-op job.

Each round times two separate jobs, start to exit, one after the other, the order alternating
every round (after one untimed warm-up of each, for the page cache):

- the harness: ``cluster.run("pytest_gpucluster.workloads.basic:noop")`` on a local `Cluster`
  (torchrun launcher, gloo) — the job directory, ``job.json``, the worker's log redirection and
  rank files, the watch loop and the sweep for leftover processes;
- the reference: ``benchmarks/reference/noop_job.py`` by plain
  ``python -m torch.distributed.run --standalone --nproc-per-node=N``, importing nothing from
  this package.

Same work on the ranks: import torch, join the gloo group, leave it. Same end: both destroy the
group, flush and leave through ``os._exit``. The harness's worker must (a gloo thread racing
Python's finalization aborts about one job in six, pytorch/pytorch#190489), so the reference
does too; a reference running the interpreter's full shutdown would time an exit the harness
never pays (that made the harness look faster than torchrun, 0.81-0.84, in issue 21).

The line ending in ``ratio`` is the median over rounds of the paired harness/reference wall
time, the next line its 95% CI (order statistics; ``ratio_stats``). Rounds go on until the CI
is within +-2%, ``--max-rounds``, or the ``--max-seconds`` budget. Target: at most 1.2.

    python benchmarks/launch_overhead.py [--nproc 2] [--max-seconds 170]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rounds import StopRule, add_stop_options, print_one_key, report_lines, run_interleaved
from sides import REFERENCE_DIR, REPO, local_cluster, run_plain_torchrun

sys.path.insert(0, str(REPO))

WORKLOAD = "pytest_gpucluster.workloads.basic:noop"
REFERENCE = REFERENCE_DIR / "noop_job.py"
KEY = "job wall time"


def children_cpu_s() -> float:
    """CPU seconds of every process this one has waited for (torchrun waits for its ranks, so
    a job's whole tree is counted once its agent is reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="ranks per job")
    add_stop_options(parser, max_rounds=60, max_seconds=170.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rule = StopRule.from_args(args)
    with tempfile.TemporaryDirectory(prefix="launch-overhead-") as tmp:
        cluster = local_cluster(args.nproc, "gloo", Path(tmp))
        cpu: dict[str, list[float]] = {"harness": [], "reference": []}

        def harness() -> dict[str, float]:
            start, start_cpu = time.perf_counter(), children_cpu_s()
            cluster.run(WORKLOAD, timeout=300, name="launch-overhead")  # raises if a rank failed
            elapsed = time.perf_counter() - start
            cpu["harness"].append(children_cpu_s() - start_cpu)
            return {KEY: elapsed}

        def reference() -> dict[str, float]:
            start_cpu = children_cpu_s()
            elapsed = run_plain_torchrun(REFERENCE, args.nproc, timeout_s=300)
            cpu["reference"].append(children_cpu_s() - start_cpu)
            return {KEY: elapsed}

        harness()  # warm the page cache for both sides, untimed
        reference()
        for spent in cpu.values():
            spent.clear()  # the warm-up is not a round
        print(
            f"no-op job, {args.nproc} gloo ranks: cluster.run({WORKLOAD}) against plain torchrun {REFERENCE.name}"
        )
        comparison = run_interleaved(
            harness, reference, rule, on_round=print_one_key(KEY, "cluster.run", "torchrun", digits=3)
        )
    print()
    for line in report_lines(
        comparison, lambda _: "launch overhead, wall time", "s", "cluster.run", "torchrun"
    ):
        print(line)
    # Not gated: the CPU the jobs' processes used is steadier than wall time on a shared
    # machine, and tells a harness that does more work from one that only waited longer.
    quotient = statistics.median(h / r for h, r in zip(cpu["harness"], cpu["reference"], strict=True))
    print(
        f"diagnostic (not gated): CPU seconds of the job's processes, cluster.run over torchrun, median paired quotient {quotient:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
