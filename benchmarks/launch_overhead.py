"""What ``cluster.run`` costs over a plain ``torchrun --standalone`` of the same no-op job.

Both sides start N gloo ranks on this machine that join the process group, do nothing, and
leave it. ``cluster.run`` adds the job directory, ``job.json``, the rank files, the watch loop
and the process-table sweep for leftovers. The two are timed side by side, interleaved (the
order alternates every repetition) after one warm-up of each, and compared by their medians.

    python benchmarks/launch_overhead.py [--reps 5] [--nproc 2]

The last line holds the word ``ratio`` and ends with the ratio (target: at most 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster

PLAIN_SCRIPT = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def time_plain(script: Path, nproc: int, tries: int = 3) -> float:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script),
    ]
    for attempt in range(1, tries + 1):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if done.returncode == 0:
            return elapsed
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        print(
            f"plain torchrun failed (exit {done.returncode}, try {attempt} of {tries}):\n{tail}", flush=True
        )
    raise SystemExit("plain torchrun failed every time; no ratio")


def time_cluster(cluster: Cluster, nproc: int) -> float:
    start = time.perf_counter()
    result = cluster.run("pytest_gpucluster.workloads.basic:noop", nproc_per_node=nproc, timeout=300)
    elapsed = time.perf_counter() - start
    result.raise_on_failure()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as tmp:
        script = Path(tmp) / "noop.py"
        script.write_text(PLAIN_SCRIPT)
        cluster = Cluster(ClusterSpec.from_local(args.nproc, backend="gloo"), get_launcher("torchrun"), tmp)
        time_plain(script, args.nproc)  # warm the page cache for both sides
        time_cluster(cluster, args.nproc)
        plain: list[float] = []
        ours: list[float] = []
        for rep in range(args.reps):
            if rep % 2 == 0:
                plain.append(time_plain(script, args.nproc))
                ours.append(time_cluster(cluster, args.nproc))
            else:
                ours.append(time_cluster(cluster, args.nproc))
                plain.append(time_plain(script, args.nproc))
            print(f"rep {rep + 1}: torchrun {plain[-1]:.3f} s, cluster.run {ours[-1]:.3f} s", flush=True)
    a, b = statistics.median(ours), statistics.median(plain)
    print(f"medians over {args.reps} reps with {args.nproc} ranks: cluster.run {a:.3f} s, torchrun {b:.3f} s")
    print(f"launch overhead ratio (cluster.run / plain torchrun): {a / b:.3f}")


if __name__ == "__main__":
    main()
