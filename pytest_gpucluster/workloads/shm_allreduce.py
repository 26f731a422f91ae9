"""Rank side of the CPU analogue of the NVLink speedup test: shared memory versus the network.

On a GPU node the NVLink test compares all_reduce over NVLink with all_reduce forced through
the network (``NCCL_P2P_DISABLE=1``/``NCCL_SHM_DISABLE=1``). On a CPU-only machine the same
question — does the intra-node fast path beat the network path, and by how much? — is
DeepSpeed's shared-memory all_reduce (``deepspeed.comm.inference_all_reduce``, a JIT-built C++
op) against plain gloo ``all_reduce`` over loopback TCP. Both run here side by side, per size
and interleaved repeat by repeat, on the same buffers, so drift on a shared machine hits both.

DeepSpeed needs no second process group: ``deepspeed.comm.init_distributed`` sees the group
the worker already made, wraps it, builds the shm op (about 26 s the first time, cached in the
torch extensions directory after that) and maps every local rank's segment. The op only runs
when every rank is on this node — it reads ``LOCAL_SIZE`` for that, and segfaults under
torchrun without it; the worker exports ``LOCAL_SIZE`` — and only for float32 (AVX2) and
bfloat16/float16 (AVX-512BW); for other dtypes it silently returns without reducing, which is
why every size is checked. A job where the op cannot run is skipped with the reason.

Depends on the standard library, torch, DeepSpeed (imported here only) and ``maths.sweep``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_gpucluster.maths.sweep import DTYPE_SIZES, canonical_dtype, parse_size, sweep_sizes
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip

__all__ = ["compare", "summarize_compare"]

_SHM_DTYPES = {"float32": 1, "bfloat16": 2, "float16": 2}
"""dtypes the shm kernel reduces, and the vector-kernel level (DeepSpeed's ``vector_kernel_level``)
each needs: 1 = AVX2, 2 = AVX-512BW."""

_EXACT = {"float32": 2**24, "bfloat16": 256, "float16": 2048}

_DEFAULTS: dict[str, Any] = {
    "min_bytes": 1 << 10,
    "max_bytes": 64 << 20,
    "factor": 4,
    "warmup": 5,
    "iters": 20,
    "repeat": 3,
    "dtype": "float32",
}


def _init_deepspeed_shm(ctx: RankContext, dtype: str) -> Any:
    """Wrap the worker's process group in deepspeed.comm and return its shm op, or skip."""
    import os

    if ctx.is_cuda:
        raise WorkloadSkip("the shm all_reduce comparison is the CPU analogue; this job runs on GPUs")
    local_size = int(os.environ.get("LOCAL_SIZE", "0") or 0)
    if local_size != ctx.world_size:
        raise WorkloadSkip(
            f"DeepSpeed's shm all_reduce needs every rank on one node: LOCAL_SIZE={local_size},"
            f" world size {ctx.world_size}"
        )
    try:
        import deepspeed.comm as dscomm
        from deepspeed.comm import comm as dscomm_state
    except ImportError as exc:
        raise WorkloadSkip(f"DeepSpeed is not importable on {ctx.host}: {exc}") from exc
    if ctx.rank == 0:
        ctx.progress("# loading DeepSpeed's shm op (a first build takes about 30 s)")
    started = time.perf_counter()
    dscomm.init_distributed(dist_backend=ctx.backend, verbose=False)
    backend = dscomm_state.cdb
    shm_op = getattr(backend, "shm_comm_op", None)
    level = int(getattr(backend, "shm_vector_kernel_level", 0) or 0)
    if shm_op is None:
        raise WorkloadSkip("DeepSpeed's shm op (ShareMemCommBuilder) is not compatible with this machine")
    if level < _SHM_DTYPES[dtype]:
        need = "AVX2" if _SHM_DTYPES[dtype] == 1 else "AVX-512BW"
        raise WorkloadSkip(f"DeepSpeed's shm {dtype} kernel needs {need}, which this CPU lacks")
    _unlink_shm_segment(ctx)
    if ctx.rank == 0:
        ctx.progress(f"# shm op ready in {time.perf_counter() - started:.1f} s (vector kernel level {level})")
    return dscomm


def _unlink_shm_segment(ctx: RankContext) -> None:
    """Remove this rank's DeepSpeed segment from /dev/shm once every rank has mapped it.

    DeepSpeed never unlinks its ``deepspeed_allreduce_buffer_*`` segments (66 MiB per rank,
    in RAM); without this every job leaves them behind. The mappings stay valid after the
    unlink, and doing it right after the set-up means a job that dies later leaks nothing.
    """
    import os

    ctx.barrier()  # every rank has opened every segment inside init_distributed
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    path = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{ctx.rank}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        print(f"removed {path}", flush=True)


def _span(ctx: RankContext, run: Callable[[], Any], iters: int) -> float:
    """Microseconds per call over ``iters`` back-to-back calls, after a barrier (as the sweep)."""
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - t0) / iters * 1e6


def compare(ctx: RankContext) -> dict[str, Any]:
    """Time gloo all_reduce and DeepSpeed's shm all_reduce per size; return this rank's times.

    Options: ``min_bytes``, ``max_bytes``, ``factor`` (sizes as in the collective sweep),
    ``warmup``, ``iters``, ``repeat`` (interleaved gloo/shm spans per size) and ``dtype``
    (float32, bfloat16 or float16).
    """
    import torch
    import torch.distributed as dist

    unknown = sorted(set(ctx.options) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_DEFAULTS))}")
    opts = {**_DEFAULTS, **ctx.options}
    dtype = canonical_dtype(opts["dtype"])
    if dtype not in _SHM_DTYPES:
        raise ValueError(f"DeepSpeed's shm all_reduce reduces {', '.join(_SHM_DTYPES)} only, not {dtype}")
    sizes = sweep_sizes(parse_size(opts["min_bytes"]), parse_size(opts["max_bytes"]), int(opts["factor"]))
    warmup, iters, repeat = int(opts["warmup"]), int(opts["iters"]), int(opts["repeat"])
    dscomm = _init_deepspeed_shm(ctx, dtype)
    torch_dtype, elt = getattr(torch, dtype), DTYPE_SIZES[dtype]
    buf = torch.zeros(max(sizes[-1] // elt, 1), dtype=torch_dtype)
    sum_op = dist.ReduceOp.SUM

    if ctx.rank == 0:
        ctx.progress(
            f"# {'size':>10s}  {'count':>12s}  {'gloo(us)':>9s}  {'shm(us)':>9s}  {'speedup':>7s}  #wrong"
        )
    points = []
    for size in sizes:
        count = size // elt
        data = buf[:count]
        gloo_run = lambda data=data: dist.all_reduce(data, op=sum_op)  # noqa: E731
        shm_run = lambda data=data: dscomm.inference_all_reduce(data)  # noqa: E731
        for run in (gloo_run, shm_run):
            for _ in range(warmup):
                run()
        gloo_us, shm_us = [], []
        for index in range(repeat):  # alternate which goes first, so neither always runs warm
            first, second = ((gloo_run, gloo_us), (shm_run, shm_us))[:: 1 if index % 2 == 0 else -1]
            for run, into in (first, second):
                data.zero_()
                into.append(_span(ctx, run, iters))
        # Rank r holds (i mod m) + r + 1 at index i, with m small enough that the sum is exact.
        n = ctx.world_size
        m = max(1, min(64, (_EXACT[dtype] - n * (n + 1) // 2) // n))
        pattern = torch.arange(count, dtype=torch.int64) % m
        data.copy_(pattern + ctx.rank + 1)
        ctx.barrier()
        shm_run()
        expected = pattern * ctx.world_size + ctx.world_size * (ctx.world_size + 1) // 2
        wrong = int(torch.count_nonzero(data.double() != expected.double()).item())
        point = {
            "size_bytes": count * elt,
            "count": count,
            "gloo_us": gloo_us,
            "shm_us": shm_us,
            "speedup": statistics.median(gloo_us) / statistics.median(shm_us),
            "shm_wrong": wrong,
        }
        points.append(point)
        if ctx.rank == 0:
            ctx.progress(
                f"  {point['size_bytes']:>10d}  {count:>12d}  {statistics.median(gloo_us):9.1f}"
                f"  {statistics.median(shm_us):9.1f}  {point['speedup']:7.2f}  {wrong:6d}"
            )
    return {
        "dtype": dtype,
        "nranks": ctx.world_size,
        "iters": iters,
        "repeat": repeat,
        "points": points,
        "host": ctx.host,
        "rank": ctx.rank,
    }


def summarize_compare(rank_values: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parent side: per size, the ranks' average time of each repeat, the median over repeats,
    and ``speedup`` = gloo time / shm time (above 1: shared memory is faster)."""
    if not rank_values:
        raise ValueError("no rank values to summarize")
    values = sorted(rank_values, key=lambda v: int(v["rank"]))
    summary = []
    for index, first in enumerate(values[0]["points"]):
        cells = [v["points"][index] for v in values]
        per_repeat = {
            key: [statistics.fmean(c[key][j] for c in cells) for j in range(min(len(c[key]) for c in cells))]
            for key in ("gloo_us", "shm_us")
        }
        gloo_us, shm_us = statistics.median(per_repeat["gloo_us"]), statistics.median(per_repeat["shm_us"])
        summary.append(
            {
                "size_bytes": int(first["size_bytes"]),
                "gloo_us": gloo_us,
                "shm_us": shm_us,
                "speedup": gloo_us / shm_us,
                "shm_wrong": sum(int(c["shm_wrong"]) for c in cells),
            }
        )
    return summary
