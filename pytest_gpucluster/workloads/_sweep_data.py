"""The collective sweep's check data: deterministic inputs and the outputs they must produce.

nccl-tests ``-c`` fills every rank's input from (rank, repetition) and recomputes the expected
result on each rank. Here the inputs are small integers, chosen per dtype and reduction op so
that every partial result the backend can form is exact: sums stay below the dtype's largest
exact integer, products are of +-1, max/min and the non-reducing collectives use values below
97. So a float result either equals the expected value or is wrong; the small tolerance only
covers avg's final division. Rank side: the standard library and the torch module handed in.

Memory: filling and checking work through the buffer ``chunk`` elements at a time, so their
temporaries (int64 indices, the expected values in float64, the comparison) are a fixed few
tens of MiB whatever the size. Building them over the whole buffer at once cost ~12x the
buffer: at the 16 GiB all_reduce size every 8-GPU profile sweeps, that is over 200 GiB and the
sweep job dies (``benchmarks/check_memory.py`` measures the bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.maths.sweep import REDUCING, Layout

_EXACT_INT = {
    "float32": 2**24,
    "float64": 2**53,
    "bfloat16": 256,
    "float16": 2048,
    "int8": 127,
    "uint8": 255,
    "int32": 2**31 - 1,
    "int64": 2**62,
}
"""The largest integer each dtype holds exactly (or its maximum): the bound for sum inputs."""
_RTOL = {"float32": 1e-6, "float64": 1e-12, "bfloat16": 1e-2, "float16": 1e-3}
CHUNK_ELEMENTS = 1 << 20
"""Elements filled or compared at a time: ~8 temporaries of 8 bytes each, about 64 MiB at most."""


@dataclass(frozen=True)
class SweepData:
    """Inputs and expected outputs of one sweep on one rank."""

    torch: Any
    device: str
    collective: str
    op: str
    dtype: str
    rank: int
    nranks: int
    root: int
    chunk: int = CHUNK_ELEMENTS

    def pattern(self, src_rank: int, start: int, length: int, rep: int) -> Any:
        """Rank ``src_rank``'s input elements ``start..start+length`` as exact int64 values."""
        torch = self.torch
        k = torch.arange(start, start + length, dtype=torch.int64, device=self.device)
        mixed = k * 7 + (src_rank * 13 + rep * 31)
        if self.collective not in REDUCING or self.op in ("max", "min"):
            return mixed % 97
        if self.op == "prod":  # products of +-1 stay exact in every dtype
            return torch.ones_like(k) if self.dtype == "uint8" else 1 - 2 * ((k + src_rank + rep) % 2)
        bound = max(1, min(100, _EXACT_INT[self.dtype] // self.nranks))  # sum, avg
        return mixed % (bound + 1)

    def fill(self, tensor: Any, src_rank: int, rep: int) -> None:
        """Write rank ``src_rank``'s input pattern into ``tensor`` (1-D), chunk by chunk."""
        total = tensor.numel()
        for i in range(0, total, self.chunk):
            step = min(self.chunk, total - i)
            tensor[i : i + step].copy_(self.pattern(src_rank, i, step, rep))

    def reduced(self, start: int, length: int, rep: int) -> Any:
        """The reduction over all ranks of their inputs at ``start..start+length``."""
        acc = self.pattern(0, start, length, rep)
        for src in range(1, self.nranks):
            value = self.pattern(src, start, length, rep)
            if self.op in ("sum", "avg"):
                acc += value
            elif self.op == "prod":
                acc *= value
            elif self.op == "max":
                acc = self.torch.maximum(acc, value)
            else:
                acc = self.torch.minimum(acc, value)
        return acc.double() / self.nranks if self.op == "avg" else acc

    def segments(self, lay: Layout) -> list[tuple[int, int, int | None, int]]:
        """This rank's output as (offset, length, source rank or None for reduced, source start)."""
        c, r, n = lay.count, self.rank, self.nranks
        if self.collective == "all_gather":
            return [(j * c, c, j, 0) for j in range(n)]
        if self.collective == "alltoall":
            return [(p * c, c, p, r * c) for p in range(n)]
        if self.collective == "reduce_scatter":
            return [(0, c, None, r * c)]
        if self.collective == "broadcast":
            return [(0, c, self.root, 0)]
        if self.collective == "sendrecv":
            return [(0, c, (r - 1) % n, 0)]
        if self.collective == "reduce" and r != self.root:
            return []  # torch leaves a non-root buffer unspecified
        return [(0, c, None, 0)]

    def count_wrong(self, out: Any, lay: Layout, rep: int) -> int:
        """Elements of ``out`` that differ from what this rank must have received."""
        torch = self.torch
        rtol = _RTOL.get(self.dtype, 0.0)
        atol = 1.0 if (self.op == "avg" and self.dtype not in _RTOL) else 0.0  # integer avg rounds
        wrong = 0
        for offset, length, src, src_start in self.segments(lay):
            for i in range(0, length, self.chunk):
                step = min(self.chunk, length - i)
                if src is None:
                    expected = self.reduced(src_start + i, step, rep).double()
                else:
                    expected = self.pattern(src, src_start + i, step, rep).double()
                got = out[offset + i : offset + i + step].double()
                ok = (got - expected).abs() <= atol + rtol * expected.abs()  # NaN is never ok
                wrong += int(torch.count_nonzero(~ok).item())
        return wrong
