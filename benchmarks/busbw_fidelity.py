"""Does our all_reduce busbw mean what an independent benchmark's busbw means?

Runs, in one 2-rank gloo job, the harness's all_reduce sweep (``workloads.collectives.sweep``,
exactly as the acceptance test runs it, then ``summarize_sweep``) and a port of
``all_reduce_bench.py`` from Stas Bekman's ml-engineering guide (seed 004,
``004_284f5fe90c840b8e.txt``) at 64 MiB and 256 MiB, interleaved round by round (the order
flips each round) so that drift on a shared machine hits both alike. Per size it prints the
median busbw of each over the rounds and, last on the line, the median over rounds of the
paired ratio harness / reference (target >= 0.97).

The reference is the seed's script with its CUDA events swapped for ``perf_counter`` (gloo
collectives block, so the host clock brackets the work) and ``torch.rand(N, M)`` sized to the
payload; its arithmetic is unchanged: a barrier and one all_reduce per trial, algbw = size /
duration per trial, averaged over the ranks with ``dist.reduce`` and over the trials, busbw =
algbw * 2(n-1)/n. It imports nothing from this package.

    python benchmarks/busbw_fidelity.py [--rounds 5] [--sizes 64M,256M] [--nproc 2]
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# The reference: all_reduce_bench.py (seed 004), on CPU. Independent of the harness.
# --------------------------------------------------------------------------------------------


def reference_all_reduce_bench(size_bytes: int, trials: int = 5, warmup: int = 2) -> dict[str, float]:
    """The seed's benchmark at one payload. Returns its busbw in bytes/s (rank 0's is the one it
    prints) and, as a diagnostic, the same trials' busbw from the mean duration instead of the
    mean of per-trial rates (nccl-tests divides total time; a mean of rates reads high when the
    trials vary)."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    mat = torch.rand(size_bytes // 4, dtype=torch.float32)

    durations: list[float] = []

    def timed_allreduce() -> Any:
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(mat)
        duration = time.perf_counter() - start
        durations.append(duration)
        algbw = torch.tensor([size_bytes / duration])
        dist.reduce(algbw, dst=0, op=dist.ReduceOp.SUM)  # average over the ranks, as the seed does
        return algbw / n

    for _ in range(warmup):
        timed_allreduce()
    algbw_gather = [timed_allreduce() for _ in range(trials)]
    algbw = torch.mean(torch.stack(algbw_gather)).item()
    timed = durations[warmup:]
    return {
        "busbw": algbw * (2 * (n - 1) / n),
        "busbw_mean_time": size_bytes / (sum(timed) / len(timed)) * (2 * (n - 1) / n),
    }


# --------------------------------------------------------------------------------------------
# Rank side: the interleaved job (workload "busbw_fidelity:interleaved")
# --------------------------------------------------------------------------------------------


def interleaved(ctx: Any) -> dict[str, Any]:
    """Each round and size: the harness sweep at that size and the reference, in an order that
    flips every round. Returns this rank's sweep values and the reference busbw."""
    from dataclasses import replace

    from pytest_gpucluster.workloads.collectives import sweep

    sizes = [int(s) for s in ctx.options["sizes"]]
    common = {"collective": "all_reduce", "in_place": False, "check": False}
    common.update(warmup=int(ctx.options.get("warmup", 2)), iters=int(ctx.options.get("iters", 5)))
    rounds = []
    for index in range(int(ctx.options.get("rounds", 5))):
        record: dict[str, Any] = {"harness": {}, "reference_busbw": {}}
        for size in sizes:
            order = ("harness", "reference") if index % 2 == 0 else ("reference", "harness")
            for which in order:
                if which == "harness":
                    options = {**common, "min_bytes": size, "max_bytes": size}
                    record["harness"][str(size)] = sweep(replace(ctx, options=options))
                else:
                    record["reference_busbw"][str(size)] = reference_all_reduce_bench(size)
        rounds.append(record)
        if ctx.rank == 0:
            ctx.progress(f"# round {index + 1} done")
    return {"rank": ctx.rank, "rounds": rounds}


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def _launch(job_dir: Path, options: dict[str, Any], nproc: int, timeout_s: float) -> list[dict[str, Any]]:
    job = {
        "workload": "busbw_fidelity:interleaved",
        "options": options,
        "backend": "gloo",
        "timeout_s": timeout_s,
    }
    (job_dir / "job.json").write_text(json.dumps(job))
    path = os.pathsep.join(filter(None, [str(REPO), str(HERE), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "pytest_gpucluster.workloads._worker", str(job_dir)]
    proc = subprocess.run(
        argv, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, timeout=timeout_s
    )
    values = []
    for rank in range(nproc):
        result = job_dir / f"rank-{rank}.json"
        record = json.loads(result.read_text()) if result.exists() else {"status": "missing"}
        if record.get("status") != "ok":
            log = (
                (job_dir / f"rank-{rank}.log").read_text()[-3000:]
                if (job_dir / f"rank-{rank}.log").exists()
                else ""
            )
            sys.exit(
                f"rank {rank} failed ({record.get('status')}, torchrun rc {proc.returncode}):\n{log}{proc.stderr[-2000:]}"
            )
        values.append(record["value"])
    return values


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from pytest_gpucluster.maths.sweep import parse_size, summarize_sweep

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="64M,256M")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5, help="harness -n (the reference runs 5 trials)")
    parser.add_argument("--warmup", type=int, default=2, help="harness -w (the reference warms up twice)")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="busbw-fidelity-") as tmp:
        options = {"sizes": sizes, "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup}
        values = _launch(Path(tmp), options, args.nproc, timeout_s=900)
    harness: dict[int, list[float]] = {s: [] for s in sizes}
    reference: dict[int, list[float]] = {s: [] for s in sizes}
    reference_mean_time: dict[int, list[float]] = {s: [] for s in sizes}
    for index in range(args.rounds):
        for s in sizes:
            [point] = summarize_sweep([v["rounds"][index]["harness"][str(s)] for v in values])
            harness[s].append(point.busbw_gbs)
            measured = values[0]["rounds"][index]["reference_busbw"][str(s)]
            reference[s].append(measured["busbw"] / 1e9)
            reference_mean_time[s].append(measured["busbw_mean_time"] / 1e9)

    print(
        f"all_reduce busbw, {args.nproc} gloo ranks, {args.rounds} interleaved rounds, {time.monotonic() - started:.0f} s"
    )
    for s in sizes:
        ours, theirs = statistics.median(harness[s]), statistics.median(reference[s])
        # Each round's two measurements ran back to back, so their ratio cancels drift that a
        # ratio of medians over the whole run would keep; the verdict is the median of those.
        paired = statistics.median(h / r for h, r in zip(harness[s], reference[s], strict=True))
        print(
            f"  {s >> 20:4d} MiB  per round harness {' '.join(f'{x:.3f}' for x in harness[s])}"
            f" | all_reduce_bench {' '.join(f'{x:.3f}' for x in reference[s])} GB/s"
        )
        by_time = statistics.median(h / r for h, r in zip(harness[s], reference_mean_time[s], strict=True))
        print(
            f"  {s >> 20:4d} MiB  diagnostic: all_reduce_bench's trials from their mean duration"
            f" {statistics.median(reference_mean_time[s]):.3f} GB/s; harness over it, paired: {by_time:.3f}"
        )
        print(
            f"  {s >> 20:4d} MiB  harness {ours:.3f} GB/s  all_reduce_bench {theirs:.3f} GB/s (medians,"
            f" {ours / theirs:.3f} apart)  harness/all_reduce_bench paired ratio {paired:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
