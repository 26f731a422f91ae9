"""One collective, two ways (two environments, or two transports), and the ratio between them.

The NVLink speedup test asks "how much faster is the fast path than the slow one?" in two
settings, both read here with the same arithmetic:

- on GPUs, the same NCCL all_reduce sweep run twice: with the default environment and with
  ``NCCL_P2P_DISABLE=1`` (two jobs, each read by :func:`sweep_busbw`, joined by :func:`pair`);
- on CPUs, DeepSpeed's shared-memory all_reduce against gloo's, timed side by side in one job
  (:func:`shm_vs_gloo`).

Every side is kept as the bus bandwidth (bytes/s) of each timed repeat per message size, so
the ratio of the medians (of the best repeats for the CPU shm path, `shm_vs_gloo`) is the headline
number and the paired per-repeat ratios show the noise. Pure: no torch, no pytest, no launching (``plans/nvlink.py`` says what runs).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.maths.metrics import bus_factor
from pytest_gpucluster.maths.sweep import Point
from pytest_gpucluster.results.model import Spread

__all__ = ["Comparison", "RatioPoint", "pair", "shm_vs_gloo", "size_text", "spread_of", "sweep_busbw"]

BusbwByRepeat = Mapping[int, Sequence[float]]
"""Message size (bytes) -> bus bandwidth (bytes/s) of each timed repeat."""


def spread_of(values: Sequence[float]) -> Spread | None:
    """Median, range and MAD of repeated measurements; None for fewer than two."""
    return Spread.of(values) if len(values) >= 2 else None


@dataclass(frozen=True, slots=True)
class RatioPoint:
    """One message size: each side's busbw per repeat, and fast over slow."""

    size_bytes: int
    fast: tuple[float, ...]
    slow: tuple[float, ...]
    best: bool = False
    """Each side's best repeat stands for it instead of its median: for a path that other work can
    only slow, never speed up, and that a busy machine slows by whole time slices (the CPU shm
    op spins while its peer is off-core; `shm_vs_gloo` says why)."""

    def _side(self, repeats: tuple[float, ...]) -> float:
        return max(repeats) if self.best else statistics.median(repeats)

    @property
    def fast_busbw(self) -> float:
        return self._side(self.fast)

    @property
    def slow_busbw(self) -> float:
        return self._side(self.slow)

    @property
    def ratio(self) -> float:
        """Fast side's busbw over the slow side's, each its median (its best with ``best``); inf if
        the slow side measured 0."""
        slow = self.slow_busbw
        return self.fast_busbw / slow if slow > 0 else float("inf")

    @property
    def repeat_ratios(self) -> tuple[float, ...]:
        """Repeat i of one side over repeat i of the other: the two ran back to back, so drift cancels."""
        return tuple(f / s for f, s in zip(self.fast, self.slow, strict=False) if s > 0)

    def ratio_spread(self) -> Spread | None:
        return spread_of(self.repeat_ratios)

    def fast_spread(self) -> Spread | None:
        return spread_of(self.fast)

    def slow_spread(self) -> Spread | None:
        return spread_of(self.slow)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two ways of running one collective, per size. ``fast`` and ``slow`` name the sides
    ("shm", "NCCL_P2P_DISABLE=1"); ``origin`` says which jobs measured them."""

    fast: str
    slow: str
    points: tuple[RatioPoint, ...]
    origin: str = ""

    @property
    def pair(self) -> str:
        """The label both sides go by in results: ``"shm/gloo"``."""
        return f"{self.fast}/{self.slow}"

    def at(self, size_bytes: int) -> RatioPoint:
        for point in self.points:
            if point.size_bytes == size_bytes:
                return point
        have = ", ".join(size_text(p.size_bytes) for p in self.points) or "none"
        raise ValueError(
            f"the {self.pair} comparison has no point at {size_text(size_bytes)} (it has {have})"
        )

    def table(self) -> str:
        """A few lines a person reads: size, each side's busbw, the ratio and its repeat range."""
        head = f"{'size':>9s}  {self.fast + ' GB/s':>16s}  {self.slow + ' GB/s':>22s}  {'ratio':>6s}  repeats"
        lines = [head]
        for p in self.points:
            ratios = p.repeat_ratios
            span = f"{min(ratios):.2f}..{max(ratios):.2f}" if ratios else "-"
            lines.append(
                f"{size_text(p.size_bytes):>9s}  {p.fast_busbw / 1e9:16.3f}  {p.slow_busbw / 1e9:22.3f}"
                f"  {p.ratio:6.2f}  {span}"
            )
        return "\n".join(lines)


def size_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def pair(
    fast: BusbwByRepeat,
    slow: BusbwByRepeat,
    *,
    fast_name: str,
    slow_name: str,
    sizes: Iterable[int] | None = None,
    origin: str = "",
    best: bool = False,
) -> Comparison:
    """Join two sides measured at the same sizes (``sizes``: only these, in this order); ``best``:
    each side's best repeat stands for it (`RatioPoint.best`)."""
    wanted = sorted(set(fast) & set(slow)) if sizes is None else [int(s) for s in sizes]
    points = []
    for size in wanted:
        for name, side in ((fast_name, fast), (slow_name, slow)):
            if not side.get(size):
                have = ", ".join(size_text(s) for s in sorted(side)) or "none"
                raise ValueError(f"{name} has no measurement at {size_text(size)} (it has {have})")
        points.append(RatioPoint(size, tuple(map(float, fast[size])), tuple(map(float, slow[size])), best))
    if not points:
        raise ValueError(f"{fast_name} and {slow_name} were measured at no common message size")
    return Comparison(fast_name, slow_name, tuple(points), origin)


def sweep_busbw(points: Iterable[Point], in_place: bool = False) -> dict[int, tuple[float, ...]]:
    """Busbw (bytes/s) of each repeat per size, from a summarized collective sweep."""
    return {p.size_bytes: p.repeat_busbw() for p in points if p.in_place == in_place}


def shm_vs_gloo(rank_values: Sequence[Mapping[str, Any]], sizes: Iterable[int] | None = None) -> Comparison:
    """The comparison in the values of a ``shm_allreduce:compare`` job (fast: shm, slow: gloo).

    Per repeat, each side's time is averaged over the ranks (as ``summarize_compare`` does),
    then turned into all_reduce busbw: size / time x 2(n-1)/n. Each side's best repeat stands for
    it (``best``): the shm op spins while it waits for its peer, so on 2 vCPUs any third runnable
    process costs a repeat a whole time slice and the repeats split into fast ones and ones 10x
    slower. 18 healthy acceptance runs on the 2-core CI VM (benchmarks/gate_noise.py, kept runs):
    median over median 1.57-10.1x, best over best 4.1-6.8x (best shm 6.1-7.1 GB/s in every run). A
    shm path as slow as gloo is as slow at its best: the ratio still reads ~1.
    """
    if not rank_values:
        raise ValueError("the shm vs gloo job returned no rank values")
    values = sorted(rank_values, key=lambda v: int(v["rank"]))
    n = int(values[0]["nranks"])
    factor = bus_factor("all_reduce", n)
    sides: dict[str, dict[int, tuple[float, ...]]] = {"shm_us": {}, "gloo_us": {}}
    for index, first in enumerate(values[0]["points"]):
        size = int(first["size_bytes"])
        wrong = sum(int(v["points"][index].get("shm_wrong") or 0) for v in values)
        if wrong:
            raise ValueError(
                f"DeepSpeed's shm all_reduce summed {wrong} element(s) wrongly at {size_text(size)}: "
                "its speed means nothing until it is correct"
            )
        for key, side in sides.items():
            cells = [v["points"][index][key] for v in values]
            repeats = min(len(c) for c in cells)
            times = [statistics.fmean(float(c[j]) for c in cells) for j in range(repeats)]
            side[size] = tuple(size / (t * 1e-6) * factor for t in times if t > 0)
    host = values[0].get("host", "?")
    return pair(
        sides["shm_us"],
        sides["gloo_us"],
        fast_name="shm",
        slow_name="gloo",
        sizes=sizes,
        origin=f"one job of {n} ranks on {host}, shm and gloo interleaved repeat by repeat, each side's best repeat",
        best=True,
    )
