"""Several workloads in one job: every rank runs the parts in order, so they share one start-up.

A launch costs seconds before a workload runs (the launcher's agent and every rank import torch,
join the process group; an SFT rank imports DeepSpeed and transformers too), so the parent
(`pytest_gpucluster.harness`) sends the parts that run on the same ranks as one job:
``options = {"parts": [{"name", "workload": "pkg.mod:func", "options", "timeout_s",
"measures_memory"}, ...]}``.

Between parts every rank restores the torch thread count and, before a part that reports its
peak memory (``measures_memory``), resets what it reads — the peak resident set
(``/proc/self/clear_refs``, read back as ``VmHWM``) after collecting and trimming freed memory, and
CUDA's peak-memory statistics — then meets the others at a barrier, so each part starts as in a job
of its own. A part that raises `WorkloadSkip` is recorded as skipped and the next one runs (every rank
decides a skip alike, as workloads do); any other exception ends the job, as it would a job of
its own. Each part has its own deadline: past it the rank dumps its stacks into its log and exits,
so one hung part does not keep the job until the sum of all deadlines.

As each part ends, every rank writes ``part-<k>-rank-<r>.json`` (:func:`part_path`) into the job
directory: when a later part fails, the parent still hands the earlier parts' values to their
tests. Rank-side module: the standard library and, lazily, torch only.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip, write_json_atomic

__all__ = ["PART_TIMEOUT_EXIT", "part_path", "run_parts"]

PART_TIMEOUT_EXIT = 124
"""Exit code of a rank whose part ran past its deadline (as ``timeout(1)`` exits)."""


def part_path(job_dir: Path, index: int, rank: int) -> Path:
    return job_dir / f"part-{index}-rank-{rank}.json"


def _reset_peaks(ctx: RankContext) -> None:
    """Each part's peak memory is its own: the previous part's peak must not show in it, nor the
    heap it freed (glibc keeps freed memory unless trimmed)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")  # resets VmHWM to the current resident set
    except OSError:
        pass  # not Linux, or not allowed: the peak then covers the job so far
    if ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _threads() -> int | None:
    if "torch" not in sys.modules:
        return None
    import torch

    return torch.get_num_threads()


def _watchdog(ctx: RankContext, index: int, name: str, timeout_s: float) -> threading.Timer:
    def expire() -> None:
        write_json_atomic(
            part_path(ctx.job_dir, index, ctx.rank),
            {"name": name, "status": "timeout", "timeout_s": timeout_s},
        )
        print(f"part {name} ran past its {timeout_s:g} s deadline on rank {ctx.rank}; stacks:", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PART_TIMEOUT_EXIT)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _resolve(spec: str) -> Any:
    from pytest_gpucluster.workloads._worker import resolve_workload

    return resolve_workload(spec)


def run_parts(ctx: RankContext) -> dict[str, Any]:
    """Run every part of ``ctx.options["parts"]`` in order; return each one's status and value."""
    parts = ctx.options.get("parts")
    if not isinstance(parts, list) or not parts:
        raise ValueError(f"a bundle needs options {{'parts': [...]}}, got {ctx.options!r}")
    results: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        name = str(part["name"])
        workload = _resolve(str(part["workload"]))
        threads = _threads()
        if part.get("measures_memory"):
            _reset_peaks(ctx)  # a collection costs ~0.2 s with transformers loaded: only where it matters
        ctx.barrier()
        if ctx.rank == 0:
            ctx.progress(f"# part {index + 1} of {len(parts)}: {name}")
        write_json_atomic(part_path(ctx.job_dir, index, ctx.rank), {"name": name, "status": "running"})
        timer = _watchdog(ctx, index, name, float(part.get("timeout_s") or 600.0))
        started = time.perf_counter()
        try:
            value = workload(replace(ctx, options=dict(part.get("options") or {})))
            record: dict[str, Any] = {
                "name": name,
                "status": "ok",
                "value": value if value is not None else {},
            }
        except WorkloadSkip as skip:
            record = {"name": name, "status": "skipped", "reason": str(skip)}
        finally:
            timer.cancel()
        record["seconds"] = time.perf_counter() - started
        write_json_atomic(part_path(ctx.job_dir, index, ctx.rank), record)
        results.append(record)
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
    return {"parts": results, "rank": ctx.rank, "host": ctx.host}
