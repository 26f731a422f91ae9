"""Rank side of the collective sweep: nccl-tests' measurement loop over ``torch.distributed``.

``sweep(ctx)`` runs on every rank (workload spec ``pytest_gpucluster.workloads.collectives:sweep``)
and returns that rank's own times; the parent combines the ranks with
:func:`pytest_gpucluster.maths.sweep.summarize_sweep`. Like the rest of
``workloads/``, it depends on the standard library, torch and the pure ``maths`` package.

What is measured, per size and placement, mirrors nccl-tests' ``BenchTime``: one untimed
collective, a barrier, then ``iters`` back-to-back collectives timed as one span (CUDA events
on a GPU; ``perf_counter`` around the loop on CPU, where gloo's collectives block), divided by
``iters``. ``repeat`` repeats that span so the parent can gate a median. Before the first size,
``warmup`` collectives run at the largest and at the smallest size, as nccl-tests does.

Out-of-place and in-place. torch has in-place APIs only for all_reduce, reduce and broadcast,
so there "out-of-place" runs the same in-place call on the receive buffer after the send
buffer is copied into it outside the timed loop: the timed work is the same single
collective per iteration that nccl-tests times, and no copy is added to it. all_gather,
reduce_scatter, alltoall and sendrecv have genuine two-buffer calls; in place they use one
buffer at nccl-tests' offsets.

The check (nccl-tests ``-c``) runs one more collective on fresh inputs after the timed loop
and counts wrong elements. Inputs are small integers derived from (rank, index, repetition),
chosen per dtype and op so that every partial result is exact; the expected output is
recomputed on each rank from the same formula. reduce is checked on the root only, and
in-place alltoall/sendrecv report ``None`` (nccl-tests prints N/A there).

``sweep_many(ctx)`` runs several sweeps (one per entry of ``options["sweeps"]``) in one job, so
a test of every collective pays for one launch (torch import, rendezvous) instead of seven; a
sweep the backend cannot run is reported as skipped and the others still run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from pytest_gpucluster.maths.metrics import COLLECTIVES
from pytest_gpucluster.maths.sweep import (
    DTYPE_SIZES,
    NCCL_TYPE_NAMES,
    REDUCING,
    ROOTED,
    Layout,
    canonical_dtype,
    layout,
    parse_size,
    reports_in_place_errors,
    sweep_sizes,
)
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip, flush_c_stdio
from pytest_gpucluster.workloads._sweep_data import SweepData
from pytest_gpucluster.workloads._sweep_table import Table

__all__ = ["SweepOptions", "sweep", "sweep_many"]

OPS = ("sum", "prod", "max", "min", "avg")
_TORCH_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}
_UNSUPPORTED_MARKERS = (
    "not supported",
    "unsupported",
    "not implemented",
    "does not support",
    "can't be cast",
    "cannot be cast",
    "no kernel",
)
"""Words of the errors a backend raises for an op or dtype it lacks (gloo's AVG on integers
says "result type Float can't be cast to the desired output type Int")."""


@dataclass(frozen=True)
class SweepOptions:
    """The options of :func:`sweep` (the job's ``options``), named after nccl-tests' flags."""

    collective: str = "all_reduce"
    min_bytes: int = 32 << 20
    """``-b``: the first size (bytes, or a string such as ``"64M"``)."""
    max_bytes: int = 32 << 20
    """``-e``: the last size."""
    factor: int = 2
    """``-f``: multiply the size by this between points; 1 adds ``step_bytes`` instead (``-i``)."""
    step_bytes: int = 1 << 20
    warmup: int = 5
    """``-w``: untimed collectives at the largest and smallest size before the sweep."""
    iters: int = 20
    """``-n``: collectives per timed span."""
    dtype: str = "float32"
    op: str = "sum"
    """``-o``: sum, prod, max, min or avg (for all_reduce, reduce and reduce_scatter)."""
    root: int = 0
    """``-r``: the root of broadcast and reduce."""
    in_place: bool = True
    """Also measure in place (nccl-tests always does; False halves the run time)."""
    check: bool = True
    """``-c``: count wrong elements after each timed span."""
    repeat: int = 1
    """Timed spans per point; the parent gates the median."""
    inject_delay_s: float = 0.0
    """Sleep this long before every timed collective on ``inject_rank`` (a synthetic straggler)."""
    inject_rank: int | None = None
    corrupt_rank: int | None = None
    """Damage ``corrupt_elements`` of this rank's result before the check (tests the check)."""
    corrupt_elements: int = 1

    @classmethod
    def from_dict(cls, options: dict[str, Any], world_size: int) -> SweepOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown sweep option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        raw = dict(options)
        for key in ("min_bytes", "max_bytes", "step_bytes"):
            if key in raw:
                raw[key] = parse_size(raw[key])
        for key in ("factor", "warmup", "iters", "root", "repeat", "corrupt_elements"):
            if key in raw:
                raw[key] = int(raw[key])
        if "inject_delay_s" in raw:
            raw["inject_delay_s"] = float(raw["inject_delay_s"])
        for key in ("inject_rank", "corrupt_rank"):
            if raw.get(key) is not None:
                raw[key] = int(raw[key])
        opts = cls(**raw)
        opts = cls(**{**opts.__dict__, "dtype": canonical_dtype(opts.dtype), "op": str(opts.op).lower()})
        opts.validate(world_size)
        return opts

    def validate(self, world_size: int) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.collective!r}; known: {', '.join(COLLECTIVES)}")
        if self.op not in OPS:
            raise ValueError(f"unknown reduction op {self.op!r}; known: {', '.join(OPS)}")
        if not 0 <= self.root < world_size:
            raise ValueError(f"root {self.root} is not a rank of this {world_size}-rank job")
        if self.iters < 1 or self.warmup < 0 or self.repeat < 1:
            raise ValueError(
                f"need iters >= 1, warmup >= 0, repeat >= 1; got {self.iters}, {self.warmup}, {self.repeat}"
            )
        sweep_sizes(self.min_bytes, self.max_bytes, self.factor, self.step_bytes)  # raises on nonsense


class _Bench:
    """Buffers and collective calls of one sweep on this rank."""

    def __init__(self, ctx: RankContext, opts: SweepOptions) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.ctx, self.opts = torch, dist, ctx, opts
        self.rank, self.n = ctx.rank, ctx.world_size
        self.dtype = getattr(torch, opts.dtype)
        self.elt = DTYPE_SIZES[opts.dtype]
        self.redop = getattr(dist.ReduceOp, _TORCH_OPS[opts.op])
        self.coll = opts.collective
        self.data = SweepData(
            torch, ctx.device, opts.collective, opts.op, opts.dtype, ctx.rank, self.n, opts.root
        )
        top = layout(self.coll, opts.max_bytes, self.elt, self.n)
        self.send_full = torch.zeros(max(top.send_count, 1), dtype=self.dtype, device=ctx.device)
        self.recv_full = torch.zeros(
            max(top.send_count, top.recv_count, 1), dtype=self.dtype, device=ctx.device
        )

    # -- the collective calls -------------------------------------------------------------

    def buffers(self, lay: Layout, in_place: bool) -> tuple[Any, Any]:
        """(input, output) tensors of one call, as views of the two allocations."""
        send, full = self.send_full, self.recv_full
        c, r = lay.count, self.rank
        if self.coll in ("all_reduce", "reduce", "broadcast"):
            return full[:c], full[:c]  # in-place API: the call works on the receive buffer
        if self.coll == "all_gather":
            out = full[: c * self.n]
            return (out[r * c : (r + 1) * c] if in_place else send[:c]), out
        if self.coll == "reduce_scatter":
            whole = (full if in_place else send)[: c * self.n]
            return whole, (whole[r * c : (r + 1) * c] if in_place else full[:c])
        if self.coll == "alltoall":
            out = full[: c * self.n]
            return (out if in_place else send[: c * self.n]), out
        return (full[:c] if in_place else send[:c]), full[:c]  # sendrecv

    def call(self, lay: Layout, in_place: bool) -> Callable[[], None]:
        dist, root, op = self.dist, self.opts.root, self.redop
        inp, out = self.buffers(lay, in_place)
        if self.coll == "all_reduce":
            return lambda: dist.all_reduce(out, op=op)
        if self.coll == "reduce":
            return lambda: dist.reduce(out, dst=root, op=op)
        if self.coll == "broadcast":
            return lambda: dist.broadcast(out, src=root)
        if self.coll == "all_gather":
            return lambda: dist.all_gather_into_tensor(out, inp)
        if self.coll == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(out, inp, op=op)
        if self.coll == "alltoall":
            return lambda: dist.all_to_all_single(out, inp)
        nxt, prv = (self.rank + 1) % self.n, (self.rank - 1) % self.n

        def sendrecv() -> None:
            ops = [dist.P2POp(dist.isend, inp, nxt), dist.P2POp(dist.irecv, out, prv)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return sendrecv

    # -- the check ---------------------------------------------------------------------------

    def load_inputs(self, lay: Layout, in_place: bool, rep: int) -> None:
        """Fill the buffers for the check, as nccl-tests' ``InitData`` (receive side zeroed)."""
        inp, out = self.buffers(lay, in_place)
        out.zero_()
        if self.coll == "broadcast" and self.rank != self.opts.root:
            return
        if self.coll in ("all_reduce", "reduce", "broadcast") and not in_place:
            self.data.fill(self.send_full[: lay.count], self.rank, rep)
            inp.copy_(self.send_full[: lay.count])  # untimed: the copy "out-of-place" stands for
        else:
            self.data.fill(inp, self.rank, rep)

    def count_wrong(self, lay: Layout, in_place: bool, rep: int) -> int:
        return self.data.count_wrong(self.buffers(lay, in_place)[1], lay, rep)

    def reset(self, lay: Layout, in_place: bool) -> None:
        """Zero the buffers a timed span uses, so repeated in-place sums cannot overflow."""
        for tensor in self.buffers(lay, in_place):
            tensor.zero_()

    def corrupt(self, lay: Layout, in_place: bool) -> None:
        _, out = self.buffers(lay, in_place)
        k = min(self.opts.corrupt_elements, out.numel())
        out[:k] = out[:k] * 2 + 3  # differs from x for every value the patterns produce

    # -- timing ---------------------------------------------------------------------------

    def timed_span(self, run: Callable[[], None], delay_s: float) -> tuple[float, float]:
        """(time per collective, host time per collective outside the calls), microseconds."""
        torch, iters, ctx = self.torch, self.opts.iters, self.ctx
        ctx.barrier()
        if ctx.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        inside = 0.0
        t0 = time.perf_counter()
        for _ in range(iters):
            if delay_s:
                time.sleep(delay_s)
            a = time.perf_counter()
            run()
            inside += time.perf_counter() - a
        t_host = time.perf_counter()
        if ctx.is_cuda:
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) / 1e3
        else:
            ctx.synchronize()
            elapsed_s = time.perf_counter() - t0
        lag_s = max(t_host - t0 - inside, 0.0)
        return elapsed_s / iters * 1e6, lag_s / iters * 1e6

    def probe(self) -> None:
        """Run each call once on a tiny buffer: a backend without the op or dtype becomes a skip."""
        lay = layout(self.coll, min(self.opts.min_bytes, 16 * self.n * self.elt), self.elt, self.n)
        try:
            for in_place in (False, True):
                self.call(lay, in_place)()
            self.ctx.synchronize()
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            if not any(marker in str(exc).lower() for marker in _UNSUPPORTED_MARKERS):
                raise  # a real failure (a peer died, a bad buffer) must not turn into a skip
            raise WorkloadSkip(
                f"the {self.ctx.backend} backend cannot run {self.coll} with dtype {self.opts.dtype}"
                f" and op {self.opts.op}: {type(exc).__name__}: {first_line}"
            ) from exc


def _measure(bench: _Bench, lay: Layout, in_place: bool, index: int, delay: float) -> dict[str, Any]:
    """One size and placement: the untimed sync call, ``repeat`` timed spans, then the check."""
    ctx, opts = bench.ctx, bench.opts
    run = bench.call(lay, in_place)
    bench.reset(lay, in_place)
    run()  # nccl-tests' untimed "sync" collective before each timed span
    ctx.synchronize()
    times, lags = [], []
    for _ in range(opts.repeat):
        t_us, lag_us = bench.timed_span(run, delay)
        times.append(t_us)
        lags.append(lag_us)
    wrong: int | None = None
    if opts.check and (not in_place or reports_in_place_errors(opts.collective)):
        rep = 2 * index + int(in_place) + 1
        bench.load_inputs(lay, in_place, rep)
        ctx.barrier()
        run()
        ctx.synchronize()
        if opts.corrupt_rank == ctx.rank:
            bench.corrupt(lay, in_place)
        wrong = bench.count_wrong(lay, in_place, rep)
    return {"times_us": times, "lag_us": lags, "wrong": wrong}


def sweep(ctx: RankContext) -> dict[str, Any]:
    """Sweep one collective over sizes; return this rank's times per point (see module doc)."""
    opts = SweepOptions.from_dict(ctx.options, ctx.world_size)
    if opts.collective == "sendrecv" and ctx.world_size < 2:
        raise WorkloadSkip("sendrecv needs at least 2 ranks (each sends to the next)")
    bench = _Bench(ctx, opts)
    bench.probe()
    sizes = sweep_sizes(opts.min_bytes, opts.max_bytes, opts.factor, opts.step_bytes)
    placements = (False, True) if opts.in_place else (False,)
    is_reducing = opts.collective in REDUCING or opts.collective == "sendrecv"  # nccl-tests prints sum
    table = Table(ctx, opts.collective, NCCL_TYPE_NAMES[opts.dtype], opts.op if is_reducing else "none",
                  opts.root if opts.collective in ROOTED else -1)  # fmt: skip
    table.header(opts.min_bytes, opts.max_bytes, opts.factor, opts.step_bytes, opts.warmup, opts.iters,
                 opts.check, opts.in_place)  # fmt: skip

    for size in (sizes[-1], sizes[0]):  # nccl-tests warms up at the largest, then the smallest size
        run = bench.call(layout(opts.collective, size, bench.elt, ctx.world_size), False)
        for _ in range(opts.warmup):
            run()
        ctx.synchronize()

    delay = opts.inject_delay_s if opts.inject_rank == ctx.rank else 0.0
    points: list[dict[str, Any]] = []
    for index, size in enumerate(sizes):
        lay = layout(opts.collective, size, bench.elt, ctx.world_size)
        point: dict[str, Any] = {"size_bytes": lay.size_bytes, "count": lay.count}
        for in_place in placements:
            point["in_place" if in_place else "out_of_place"] = _measure(bench, lay, in_place, index, delay)
        points.append(point)
        table.row(lay, [point[p] for p in ("out_of_place", "in_place") if p in point], bench.n)
    table.footer()
    if ctx.is_cuda:
        flush_c_stdio()  # NCCL's INFO lines (plans/nvlink.NCCL_LOG) must reach the rank log
    return {
        "collective": opts.collective,
        "dtype": opts.dtype,
        "op": table.redop,
        "root": table.root,
        "nranks": ctx.world_size,
        "backend": ctx.backend,
        "timer": "cuda_events" if ctx.is_cuda else "perf_counter",
        "warmup": opts.warmup,
        "iters": opts.iters,
        "repeat": opts.repeat,
        "points": points,
        "host": ctx.host,
        "rank": ctx.rank,
    }


def sweep_many(ctx: RankContext) -> dict[str, Any]:
    """Several sweeps in one job: ``options = {"sweeps": [<options of sweep>, ...]}``.

    Returns ``{"sweeps": [...]}`` with, per entry and in order, :func:`sweep`'s value or
    ``{"collective": ..., "skipped": reason}`` where the backend lacks that op or dtype (every
    rank decides that alike, before any communication, so the ranks stay in step).
    """
    entries = ctx.options.get("sweeps")
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f"sweep_many needs options {{'sweeps': [<sweep options>, ...]}}, got {ctx.options!r}"
        )
    out: list[dict[str, Any]] = []
    for options in entries:
        try:
            out.append(sweep(replace(ctx, options=dict(options))))
        except WorkloadSkip as exc:
            out.append({"collective": options.get("collective"), "skipped": str(exc), "rank": ctx.rank})
    return {"sweeps": out, "rank": ctx.rank, "host": ctx.host, "nranks": ctx.world_size}
