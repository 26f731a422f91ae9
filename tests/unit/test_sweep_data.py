"""The sweep's correctness check works chunk by chunk (memory bounded) and still counts every wrong
element. Stands for the GPU behaviour: at 16 GiB per buffer on an H100/H200 the fill and the check
must not allocate index tensors over the whole buffer (that OOMs the sweep job); the same code runs
on CUDA tensors, only the device differs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_gpucluster.maths.sweep import layout  # noqa: E402
from pytest_gpucluster.workloads._sweep_data import SweepData  # noqa: E402

CHUNK = 1000


def _data(
    collective: str, op: str = "sum", dtype: str = "float32", rank: int = 0, nranks: int = 4
) -> SweepData:
    return SweepData(torch, "cpu", collective, op, dtype, rank, nranks, root=0, chunk=CHUNK)


def _expected_output(data: SweepData, count: int, rep: int) -> torch.Tensor:
    """What this rank must hold, built in one piece (no chunks) from the same patterns."""
    lay = layout(data.collective, count * 4, 4, data.nranks)
    out = torch.zeros(max(lay.send_count, lay.recv_count), dtype=torch.float64)
    for offset, length, src, src_start in data.segments(lay):
        whole = SweepData(
            torch, "cpu", data.collective, data.op, data.dtype, data.rank, data.nranks, 0, chunk=1 << 30
        )
        values = (
            whole.reduced(src_start, length, rep)
            if src is None
            else whole.pattern(src, src_start, length, rep)
        )
        out[offset : offset + length] = values.double()
    return out.to(getattr(torch, data.dtype))


@pytest.mark.parametrize(
    ("collective", "op", "dtype"),
    [("all_reduce", "sum", "float32"), ("all_gather", "sum", "bfloat16"), ("reduce_scatter", "max", "float16"),
     ("alltoall", "sum", "float32"), ("all_reduce", "avg", "float64")],
)  # fmt: skip
def test_every_planted_wrong_element_is_counted_across_chunks(collective, op, dtype):
    data = _data(collective, op, dtype)
    count = 10 * CHUNK + 537  # not a multiple of the chunk: the last chunk is short
    lay = layout(collective, count * 4, 4, data.nranks)
    out = _expected_output(data, count, rep=3)
    assert data.count_wrong(out, lay, rep=3) == 0
    n = max(offset + length for offset, length, _, _ in data.segments(lay))  # this rank's output
    planted = {0, CHUNK - 1, CHUNK, n // 2, n // 2 + 1, n - 1}  # first, a boundary, middle, last
    for i in planted:
        out[i] = out[i] * 2 + 3
    assert data.count_wrong(out, lay, rep=3) == len(planted)


def test_a_nan_is_wrong():
    data = _data("all_reduce")
    lay = layout("all_reduce", 2500 * 4, 4, data.nranks)
    out = _expected_output(data, 2500, rep=0)
    out[2 * CHUNK + 7] = float("nan")
    assert data.count_wrong(out, lay, rep=0) == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_the_chunked_fill_writes_the_same_pattern_as_one_piece(dtype):
    data = _data("all_gather", dtype=dtype, rank=2)
    tensor = torch.empty(7 * CHUNK + 3, dtype=getattr(torch, dtype))
    data.fill(tensor, src_rank=2, rep=5)
    whole = data.pattern(2, 0, tensor.numel(), 5).to(tensor.dtype)
    assert torch.equal(tensor, whole)
