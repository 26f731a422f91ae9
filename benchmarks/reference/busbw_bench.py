#!/usr/bin/env python
"""all_reduce_bench.py from Stas Bekman's ml-engineering guide (seed 004), for three collectives.

An independent reference for ``benchmarks/busbw_fidelity.py``: it imports nothing from
pytest_gpucluster and is launched by plain torchrun as its own job::

    torchrun --standalone --nproc-per-node=2 benchmarks/reference/busbw_bench.py \\
        --sizes 4194304,16777216,67108864 --trials 10 --out result.json

The seed's arithmetic, unchanged: per trial a barrier, then one collective timed on its own
(CUDA events on a GPU as in the seed; ``perf_counter`` on CPU, where gloo's collectives block so
the host clock brackets the work), algbw = size / duration, averaged over the ranks with
``dist.reduce`` to rank 0, then over the trials; busbw = algbw x the collective's nccl-tests
factor. ``--warmup`` untimed trials come first (the seed's 2).

The seed covers all_reduce (in place, factor 2(n-1)/n). all_gather and reduce_scatter follow
nccl-tests' ``doc/PERFORMANCE.md`` and ``src/*.cu``: out of place
(``all_gather_into_tensor``, ``reduce_scatter_tensor``), factor (n-1)/n, the size being the
whole gathered (scattered) buffer, its per-rank part rounded down to a multiple of 16 bytes.

Rank 0 writes a JSON file: per collective and size the seed's busbw and two diagnostics: the
busbw from the trials' mean duration (a mean of per-trial rates reads higher when the trials
vary), and with ``--span`` the busbw of as many collectives timed back to back as one span after
one barrier — nccl-tests' way, which is what the harness does. On a 2-core VM the two timings
differ by themselves: one isolated collective after a barrier runs faster than the same
collective back to back (in one process on the same buffers, back-to-back/isolated was 0.81-0.94
at 16 MiB, load ~1.2), so this diagnostic tells the definitions' gap from the harness's.

It ends as the harness's worker does — process group destroyed, output flushed, ``os._exit`` —
because the harness cannot end otherwise (a gloo thread racing Python's finalization aborts
about one job in six, pytorch/pytorch#190489) and the two jobs must start and end alike.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
FLOAT32_BYTES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter")
    parser.add_argument("--sizes", default=None, help="comma-separated sizes in bytes")
    parser.add_argument(
        "--points",
        default=None,
        help="COLLECTIVE:BYTES,... measured in this order, instead of --collectives x --sizes",
    )
    parser.add_argument("--trials", type=int, default=5, help="timed trials per size (the seed's 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed trials first (the seed's 2)")
    parser.add_argument("--backend", default=None, help="gloo or nccl (default: nccl with CUDA)")
    parser.add_argument(
        "--span", action="store_true", help="also time the trials back to back (nccl-tests' way)"
    )
    parser.add_argument("--out", type=Path, required=True, help="where rank 0 writes the results")
    args = parser.parse_args(argv)
    if (args.points is None) == (args.sizes is None):
        parser.error("give either --sizes (with --collectives) or --points")
    try:
        args.point_list = (
            [(c, int(b)) for c, _, b in (p.partition(":") for p in args.points.split(","))]
            if args.points
            else [(c, int(b)) for c in args.collectives.split(",") for b in args.sizes.split(",")]
        )
    except ValueError:
        parser.error(f"sizes are whole numbers of bytes: --points {args.points!r} --sizes {args.sizes!r}")
    unknown = sorted({c for c, _ in args.point_list} - set(FACTORS))
    if unknown:
        parser.error(f"unknown collective(s) {unknown}; this reference covers {sorted(FACTORS)}")
    if args.trials < 1 or args.warmup < 0:
        parser.error(f"need --trials >= 1 and --warmup >= 0, got {args.trials} and {args.warmup}")
    return args


class Timer:
    """The seed's CUDA events on a GPU; the host clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.end_event = torch.cuda.Event(enable_timing=True)

    def time(self, op: Any) -> float:
        if self.cuda:
            self.start_event.record()
            op()
            self.end_event.record()
            torch.cuda.synchronize()
            return self.start_event.elapsed_time(self.end_event) / 1000
        start = time.perf_counter()
        op()
        return time.perf_counter() - start


def buffers(collective: str, size: int, n: int, device: torch.device) -> tuple[Any, int]:
    """The call to time and the size (bytes) algbw divides, as nccl-tests lays it out."""
    count = size // FLOAT32_BYTES
    if collective == "all_reduce":
        mat = torch.rand(count, dtype=torch.float32, device=device)
        return (lambda: dist.all_reduce(mat)), count * FLOAT32_BYTES
    per_rank = (count // n) // 4 * 4  # nccl-tests aligns the per-rank part to 16 bytes
    small = torch.rand(per_rank, dtype=torch.float32, device=device)
    big = torch.rand(per_rank * n, dtype=torch.float32, device=device)
    total = per_rank * n * FLOAT32_BYTES
    if collective == "all_gather":
        return (lambda: dist.all_gather_into_tensor(big, small)), total
    return (lambda: dist.reduce_scatter_tensor(small, big)), total


def span_algbw(op: Any, size_bytes: int, iters: int, timer: Timer, device: torch.device) -> float:
    """nccl-tests' timing, for contrast (``--span``): a barrier, ``iters`` collectives back to
    back timed as one span, divided by ``iters``, the time averaged over the ranks (its ``-a 1``)."""
    dist.barrier()
    per_op = timer.time(lambda: [op() for _ in range(iters)]) / iters
    total = torch.tensor([per_op], device=device, dtype=torch.float64)
    dist.all_reduce(total)
    return size_bytes / (total.item() / dist.get_world_size())


def bench(
    collective: str, size: int, args: argparse.Namespace, device: torch.device, span_first: bool
) -> dict[str, Any]:
    n = dist.get_world_size()
    op, size_bytes = buffers(collective, size, n, device)
    timer = Timer(device)
    durations: list[float] = []
    span: float | None = None

    def timed() -> torch.Tensor:
        dist.barrier()
        duration = timer.time(op)
        durations.append(duration)
        algbw = torch.tensor([size_bytes / duration], device=device, dtype=torch.float64)
        dist.reduce(algbw, dst=0, op=dist.ReduceOp.SUM)  # the seed's average over the ranks
        return algbw / n

    for _ in range(args.warmup):
        timed()
    if args.span and span_first:
        span = span_algbw(op, size_bytes, args.trials, timer, device)
    algbw = torch.mean(torch.stack([timed() for _ in range(args.trials)])).item()
    if args.span and not span_first:
        span = span_algbw(op, size_bytes, args.trials, timer, device)
    timed_durations = durations[args.warmup :]
    factor = FACTORS[collective](n)
    return {
        "collective": collective,
        "size_bytes": size_bytes,
        "busbw_gbs": algbw * factor / 1e9,
        "busbw_mean_time_gbs": size_bytes / (sum(timed_durations) / len(timed_durations)) * factor / 1e9,
        "busbw_span_gbs": None if span is None else span * factor / 1e9,
        "trials": args.trials,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # the seed's init_processes
        device = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    points = args.point_list
    # With --span the two timings alternate which goes first, point by point.
    results = [bench(c, size, args, device, span_first=i % 2 == 1) for i, (c, size) in enumerate(points)]
    if dist.get_rank() == 0:
        record = {"world_size": dist.get_world_size(), "backend": backend, "results": results}
        args.out.write_text(json.dumps(record, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
