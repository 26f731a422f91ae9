"""The sweep's progress as nccl-tests prints it: the header, one row per size, the footer.

Rank 0 prints (through ``RankContext.progress``) while every rank takes part in the collectives the
table needs (the rank lines, each row's times averaged over the ranks): call every method on every
rank. Rank-side helper of ``workloads/collectives.py``: the standard library, torch (lazily) and the
pure table formatting of ``parsers.nccl_tests``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.maths.metrics import bus_factor
from pytest_gpucluster.maths.sweep import Layout
from pytest_gpucluster.parsers.nccl_tests import Measurement, Row, format_table
from pytest_gpucluster.workloads._runtime import RankContext

__all__ = ["Table"]


class Table:
    """One collective's table: nccl-tests' columns, redop and root as it prints them."""

    def __init__(self, ctx: RankContext, collective: str, type_name: str, redop: str, root: int) -> None:
        self.ctx, self.collective, self.type_name, self.redop, self.root = (
            ctx,
            collective,
            type_name,
            redop,
            root,
        )
        self.busbws: list[float] = []
        self.wrong = 0

    def header(
        self, min_bytes: int, max_bytes: int, factor: int, step_bytes: int, warmup: int, iters: int,
        check: bool, in_place: bool,
    ) -> None:  # fmt: skip
        ctx = self.ctx
        rank_lines = _gather_rank_lines(ctx)
        if ctx.rank != 0:
            return
        step = f"{factor}(factor)" if factor > 1 else f"{step_bytes}(bytes)"
        lines = [
            f"# Collective test starting: {self.collective}_perf (pytest-gpucluster, torch.distributed {ctx.backend})",
            f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {step}"
            f" warmup iters: {warmup} iters: {iters} agg iters: 1 validation: {int(check)} graph: 0",
            "#",
            "# Using devices",
            *rank_lines,
            "#",
        ]
        blank = Measurement(time_us=0.0, algbw_gbs=0.0, busbw_gbs=0.0, wrong=0)
        row = Row(0, 0, self.type_name, self.redop, self.root, blank, blank if in_place else None)
        for line in lines + _table_lines(row, True):
            ctx.progress(line)

    def row(self, lay: Layout, cells: Sequence[Mapping[str, Any]], nranks: int) -> None:
        """One size: each placement's cell (``times_us``, ``wrong``) averaged over the ranks."""
        shown = []
        for cell in cells:
            measured, bus = _table_cell(
                self.ctx, self.collective, nranks, lay.size_bytes, cell["times_us"], cell["wrong"]
            )
            shown.append(measured)
            self.busbws.append(bus)
            self.wrong += measured.wrong or 0
        if self.ctx.rank == 0:
            row = Row(
                lay.size_bytes,
                lay.count,
                self.type_name,
                self.redop,
                self.root,
                shown[0],
                shown[1] if len(shown) > 1 else None,
            )
            for line in _table_lines(row, False):
                self.ctx.progress(line)

    def footer(self) -> None:
        if self.ctx.rank == 0:
            self.ctx.progress(f"# Out of bounds values : {self.wrong} {'FAILED' if self.wrong else 'OK'}")
            self.ctx.progress(f"# Avg bus bandwidth    : {sum(self.busbws) / len(self.busbws):g} ")
            self.ctx.progress("#")


def _gather_rank_lines(ctx: RankContext) -> list[str]:
    """nccl-tests' ``#  Rank  N Group  0 Pid ... on HOST device D [bus] NAME`` lines, all ranks."""
    import torch
    import torch.distributed as dist

    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus, name = f"0x{getattr(props, 'pci_bus_id', 0):02x}", props.name
    else:
        bus, name = "cpu", f"{ctx.backend} on CPU"
    mine = f"#  Rank {ctx.rank:2d} Group  0 Pid {os.getpid():6d} on {ctx.host:>10s} device {ctx.local_rank:2d} [{bus}] {name}"
    lines: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(lines, mine)
    return [str(line) for line in lines]


def _table_cell(
    ctx: RankContext, collective: str, nranks: int, size: int, times: list[float], wrong: int | None
) -> tuple[Measurement, float]:
    """The printed cell: each repeat's time averaged over the ranks (nccl-tests' default ``-a 1``),
    the median over repeats, wrong elements summed over ranks; at nccl-tests' precision."""
    import torch
    import torch.distributed as dist

    payload = torch.tensor([*times, float(wrong or 0)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(payload)
    values = payload.tolist()
    time_us = statistics.median(v / nranks for v in values[:-1])
    alg = size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    bus = alg * bus_factor(collective, nranks)
    decimals = 0 if time_us >= 10000 else 1 if time_us >= 100 else 2
    cell = Measurement(
        time_us=round(time_us, decimals),
        algbw_gbs=round(alg, 2),
        busbw_gbs=round(bus, 2),
        wrong=None if wrong is None else int(values[-1]),
    )
    return cell, bus


def _table_lines(row: Row, header: bool) -> list[str]:
    """The header lines (``header``) or the row line of nccl-tests' layout, via ``format_table``."""
    lines = format_table([row]).splitlines()
    if header:
        return [
            line for line in lines if line.startswith("#") and "Avg bus bandwidth" not in line and line != "#"
        ]
    return [line for line in lines if not line.startswith("#")]
