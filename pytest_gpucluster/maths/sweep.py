"""nccl-tests' size semantics, and the parent-side summary of a collective sweep.

Pure standard library plus :mod:`pytest_gpucluster.maths.metrics` (itself stdlib-only), so both sides
use it: the rank-side sweep (``workloads.collectives``) to lay out its buffers, and the parent to
turn the per-rank values of a job into one :class:`Point` per size and placement with
:func:`summarize_sweep`. It never imports torch.

Semantics follow nccl-tests' ``src/*.cu`` (``*GetCollByteCount`` and ``*GetBw``):

- ``count = size // typesize``. For all_gather, reduce_scatter and alltoall the per-rank count
  is ``(count // nranks)`` rounded down to a multiple of 16 bytes, and the size printed (and
  used for algbw) is the whole buffer: ``per_rank_count * nranks * typesize``. The ``count``
  column is that per-rank count. For the other collectives size and count are the buffer.
- algbw = size / time; busbw = algbw * :func:`pytest_gpucluster.maths.metrics.bus_factor`.
- nccl-tests averages each rank's time per iteration over the ranks (``-a 1``, its default;
  ``-a 0/2/3`` use rank 0, the minimum or the maximum). :func:`summarize_sweep` does the same
  by default and takes the others as ``aggregate``.
- ``# Avg bus bandwidth`` is the mean busbw over every printed cell, out-of-place and
  in-place, of every size.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.maths.metrics import COLLECTIVES, Spread, bus_factor, summarize

__all__ = [
    "AGGREGATES",
    "DTYPE_SIZES",
    "NCCL_TYPE_NAMES",
    "Layout",
    "Point",
    "avg_busbw",
    "canonical_dtype",
    "layout",
    "parse_size",
    "reports_in_place_errors",
    "summarize_sweep",
    "sweep_sizes",
]

DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
}
"""The dtypes the sweep supports (torch names) and their sizes in bytes."""

_DTYPE_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "fp64": "float64",
    "int": "int32",
    "char": "int8",
}

NCCL_TYPE_NAMES: dict[str, str] = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
}
"""How nccl-tests spells each dtype in its ``type`` column."""

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce")
_PER_RANK_CHUNKED = ("all_gather", "reduce_scatter", "alltoall")

AGGREGATES = ("avg", "max", "min", "rank0")
"""How a point's per-rank times become one time: nccl-tests' ``-a 1`` (avg, its default),
``-a 3`` (max), ``-a 2`` (min) and ``-a 0`` (rank 0)."""


def canonical_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``...; ValueError names the supported dtypes."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_SIZES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(DTYPE_SIZES)}")
    return key


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or from nccl-tests' ``-b``/``-e`` spelling (``8``, ``64K``, ``256M``, ``4G``).

    Units are powers of 1024, as in nccl-tests' ``parsesize``; ``MiB``/``MB`` are read the same way.
    """
    if isinstance(value, bool):
        raise ValueError(f"a size must be a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"a size must be a non-negative number of bytes, got {value!r}")
        return int(value)
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"cannot read {value!r} as a size; use bytes or a K/M/G suffix such as 64M")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2, step_bytes: int = 1 << 20) -> list[int]:
    """The sizes nccl-tests visits for ``-b min -e max -f factor`` (or ``-i step`` when factor is 1)."""
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 <= min_bytes <= max_bytes, got min {min_bytes}, max {max_bytes}")
    if int(factor) != factor or factor < 1:
        raise ValueError(f"factor must be a positive integer, like nccl-tests -f; got {factor!r}")
    if factor > 1 and min_bytes == 0:
        raise ValueError("min_bytes 0 with a factor never grows; start at 1 byte or more")
    if factor == 1 and step_bytes <= 0:
        raise ValueError(f"step_bytes must be positive when factor is 1, got {step_bytes}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size = size * int(factor) if factor > 1 else size + step_bytes
    return sizes


@dataclass(frozen=True, slots=True)
class Layout:
    """One sweep point's buffers, in elements, as nccl-tests lays them out."""

    count: int
    """nccl-tests' ``count`` column: the count passed to the collective (per rank for the
    chunked collectives)."""
    send_count: int
    recv_count: int
    size_bytes: int
    """nccl-tests' ``size`` column: ``max(send, recv) * typesize``; algbw is size / time."""


def layout(collective: str, size_bytes: int, elt_size: int, nranks: int) -> Layout:
    """nccl-tests' ``setupArgs`` + ``*GetCollByteCount`` for one requested size."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    count = size_bytes // elt_size
    if collective in _PER_RANK_CHUNKED:
        align = max(16 // elt_size, 1)
        base = (count // nranks) // align * align
        if collective == "all_gather":
            send, recv = base, base * nranks
        elif collective == "reduce_scatter":
            send, recv = base * nranks, base
        else:  # alltoall
            send = recv = base * nranks
        return Layout(count=base, send_count=send, recv_count=recv, size_bytes=max(send, recv) * elt_size)
    return Layout(count=count, send_count=count, recv_count=count, size_bytes=count * elt_size)


def reports_in_place_errors(collective: str) -> bool:
    """nccl-tests prints ``N/A`` in the in-place ``#wrong`` of alltoall and sendrecv: in place,
    they overwrite their own input, so there is nothing to check."""
    return collective not in ("alltoall", "sendrecv")


# --------------------------------------------------------------------------------------------
# Parent side: per-rank values -> one Point per size and placement
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """One size and placement of a sweep, over all ranks and repeats."""

    collective: str
    size_bytes: int
    count: int
    in_place: bool
    nranks: int
    time_us: float
    """Median over repeats of the per-repeat time, which is the ranks' times aggregated
    (``aggregate``, nccl-tests' average by default)."""
    algbw_gbs: float
    busbw_gbs: float
    """From :attr:`time_us`: the number to gate on."""
    wrong: int | None
    """Wrong elements summed over ranks (as nccl-tests sums them); None where nccl-tests prints
    N/A or the check was off."""
    slowest_rank: int
    """The rank that held the others up the most: the largest median time outside the
    collective calls (``lag_us``). A straggler shows up there, not in the loop time, since a
    rank that waits for it inside the collective spends just as long in the loop."""
    per_rank_time_us: tuple[float, ...]
    """Each rank's median time per iteration, in rank order."""
    per_rank_lag_us: tuple[float, ...]
    """Each rank's median time per iteration spent outside the collective calls."""
    repeat_time_us: tuple[float, ...]
    """The aggregated time of each repeat."""
    busbw_spread: Spread
    """busbw over the repeats."""

    @property
    def placement(self) -> str:
        return "in_place" if self.in_place else "out_of_place"

    def repeat_busbw(self) -> tuple[float, ...]:
        """Bus bandwidth in bytes/s of each repeat with a time: size / time x the point's own bus
        factor (``busbw / algbw``, nccl-tests' for its rows), so every reader scales alike."""
        if not self.algbw_gbs:
            return ()
        factor = self.busbw_gbs / self.algbw_gbs
        return tuple(self.size_bytes / (t * 1e-6) * factor for t in self.repeat_time_us if t > 0)


def _aggregate(values: Sequence[float], how: str) -> float:
    if how == "avg":
        return sum(values) / len(values)
    if how == "max":
        return max(values)
    if how == "min":
        return min(values)
    return values[0]  # rank0


def summarize_sweep(rank_values: Sequence[dict[str, Any]], aggregate: str = "avg") -> list[Point]:
    """Turn the values the ranks of one sweep job returned into points, by size then placement.

    ``rank_values`` holds each rank's return value of ``workloads.collectives.sweep`` (any order;
    each names its rank). ``aggregate`` is how per-rank times combine (:data:`AGGREGATES`).
    """
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if not rank_values:
        raise ValueError("no rank values to summarize: the sweep job returned nothing")
    values = sorted(rank_values, key=lambda v: int(v["rank"]))
    nranks = int(values[0]["nranks"])
    ranks = [int(v["rank"]) for v in values]
    if ranks != list(range(nranks)):
        raise ValueError(f"expected the values of ranks 0..{nranks - 1}, got ranks {ranks}")
    collective = str(values[0]["collective"])
    npoints = len(values[0]["points"])
    for value in values:
        if value["collective"] != collective or len(value["points"]) != npoints:
            raise ValueError(
                f"rank {value['rank']} ran {value['collective']} with {len(value['points'])} points,"
                f" rank 0 ran {collective} with {npoints}: the ranks did not run the same sweep"
            )
    factor = bus_factor(collective, nranks)
    points: list[Point] = []
    for index in range(npoints):
        first = values[0]["points"][index]
        size, count = int(first["size_bytes"]), int(first["count"])
        for placement in ("out_of_place", "in_place"):
            if placement not in first:
                continue
            cells = [v["points"][index][placement] for v in values]
            times = [[float(t) for t in c["times_us"]] for c in cells]
            lags = [[float(t) for t in c.get("lag_us") or [0.0] * len(c["times_us"])] for c in cells]
            repeats = min(len(t) for t in times)
            if repeats == 0:
                raise ValueError(f"{placement} at {size} bytes has no timed repeat on some rank")
            repeat_time = tuple(_aggregate([t[j] for t in times], aggregate) for j in range(repeats))
            time_us = statistics.median(repeat_time)
            busbw_repeats = [size / (t * 1e-6) * factor / 1e9 for t in repeat_time]
            wrongs = [c.get("wrong") for c in cells]
            per_rank_time = tuple(statistics.median(t) for t in times)
            per_rank_lag = tuple(statistics.median(t) for t in lags)
            points.append(
                Point(
                    collective=collective,
                    size_bytes=size,
                    count=count,
                    in_place=placement == "in_place",
                    nranks=nranks,
                    time_us=time_us,
                    algbw_gbs=size / (time_us * 1e-6) / 1e9,
                    busbw_gbs=size / (time_us * 1e-6) * factor / 1e9,
                    wrong=None if any(w is None for w in wrongs) else sum(int(w) for w in wrongs),
                    slowest_rank=max(range(nranks), key=lambda r: (per_rank_lag[r], per_rank_time[r])),
                    per_rank_time_us=per_rank_time,
                    per_rank_lag_us=per_rank_lag,
                    repeat_time_us=repeat_time,
                    busbw_spread=summarize(busbw_repeats),
                )
            )
    return points


def avg_busbw(points: Sequence[Point]) -> float:
    """nccl-tests' ``# Avg bus bandwidth``: the mean busbw of every cell, both placements."""
    if not points:
        raise ValueError("no points to average")
    return sum(p.busbw_gbs for p in points) / len(points)
