"""nccl-tests' size semantics and the parent-side sweep summary, against hand-computed values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_gpucluster.maths.sweep import (
    Layout,
    avg_busbw,
    canonical_dtype,
    layout,
    parse_size,
    summarize_sweep,
    sweep_sizes,
)
from pytest_gpucluster.workloads.collectives import SweepOptions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (8, 8),
        ("8", 8),
        ("64K", 65536),
        ("256M", 256 << 20),
        ("4G", 4 << 30),
        ("1MiB", 1 << 20),
        ("0.5k", 512),
    ],
)
def test_parse_size_reads_nccl_tests_spellings(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "12Q", "-1", True, -5])
def test_parse_size_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_sweep_sizes_match_nccl_tests_b_e_f():
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(8, 100, 4) == [8, 32]  # stops before passing -e, like nccl-tests
    assert sweep_sizes(1 << 20, 3 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20]  # -f 1 -i 1M
    assert len(sweep_sizes(8, 8 << 30, 2)) == 31
    with pytest.raises(ValueError):
        sweep_sizes(0, 64, 2)
    with pytest.raises(ValueError):
        sweep_sizes(64, 8, 2)


@pytest.mark.parametrize(
    ("collective", "size", "elt", "n", "expected"),
    [
        # count = size / typesize; buffers are the count itself
        ("all_reduce", 1 << 20, 4, 8, Layout(262144, 262144, 262144, 1 << 20)),
        ("broadcast", 10, 4, 2, Layout(2, 2, 2, 8)),  # rounded down to whole elements
        ("sendrecv", 4096, 2, 16, Layout(2048, 2048, 2048, 4096)),
        # all_gather: per-rank count aligned to 16 B, size = the gathered whole
        ("all_gather", 1000, 4, 2, Layout(124, 124, 248, 992)),
        ("all_gather", 1 << 20, 2, 8, Layout(65536, 65536, 524288, 1 << 20)),
        # reduce_scatter: the input is the whole, the output one chunk
        ("reduce_scatter", 1000, 4, 2, Layout(124, 248, 124, 992)),
        ("reduce_scatter", 96, 1, 3, Layout(32, 96, 32, 96)),  # int8: 16-element alignment
        ("reduce_scatter", 8, 4, 2, Layout(0, 0, 0, 0)),  # below the alignment: nothing moves
        # alltoall: both buffers are n chunks
        ("alltoall", 1000, 4, 2, Layout(124, 248, 248, 992)),
    ],
)
def test_layout_follows_nccl_tests_get_coll_byte_count(collective, size, elt, n, expected):
    assert layout(collective, size, elt, n) == expected


def test_canonical_dtype_accepts_nccl_and_short_names():
    assert [canonical_dtype(x) for x in ("float", "bf16", "half", "double", "torch.int8")] == [
        "float32",
        "bfloat16",
        "float16",
        "float64",
        "int8",
    ]
    with pytest.raises(ValueError, match="supported"):
        canonical_dtype("complex64")


def _rank_value(rank, points, collective="all_reduce", nranks=2):
    return {"rank": rank, "nranks": nranks, "collective": collective, "points": points}


def _cell(times, lags=None, wrong=0):
    return {"times_us": times, "lag_us": lags or [1.0] * len(times), "wrong": wrong}


def test_summarize_sweep_averages_ranks_like_nccl_tests_then_takes_the_median_repeat():
    size = 1 << 20
    rank0 = _rank_value(
        0, [{"size_bytes": size, "count": size // 4, "out_of_place": _cell([100.0, 300.0, 200.0])}]
    )
    rank1 = _rank_value(
        1,
        [
            {
                "size_bytes": size,
                "count": size // 4,
                "out_of_place": _cell([300.0, 500.0, 400.0], [50.0] * 3, wrong=2),
            }
        ],
    )
    [point] = summarize_sweep([rank1, rank0])  # any order
    assert point.repeat_time_us == (200.0, 400.0, 300.0)  # per repeat: mean over ranks
    assert point.time_us == 300.0
    assert point.algbw_gbs == pytest.approx(size / 300e-6 / 1e9)
    assert point.busbw_gbs == pytest.approx(point.algbw_gbs * 2 * (2 - 1) / 2)
    assert point.wrong == 2
    assert point.slowest_rank == 1 and point.per_rank_lag_us == (1.0, 50.0)
    assert point.per_rank_time_us == (200.0, 400.0)
    assert point.busbw_spread.n == 3 and point.busbw_spread.median == pytest.approx(point.busbw_gbs)
    assert not point.in_place and point.placement == "out_of_place"

    [worst] = summarize_sweep([rank0, rank1], aggregate="max")  # nccl-tests -a 3
    assert worst.time_us == 400.0
    [first] = summarize_sweep([rank0, rank1], aggregate="rank0")  # -a 0
    assert first.time_us == 200.0


def test_summarize_sweep_keeps_na_and_placements_and_averages_busbw_over_all_cells():
    points = [
        {"size_bytes": 64, "count": 16, "out_of_place": _cell([1.0]), "in_place": _cell([2.0], wrong=None)},
        {"size_bytes": 128, "count": 32, "out_of_place": _cell([1.0]), "in_place": _cell([2.0], wrong=None)},
    ]
    summary = summarize_sweep([_rank_value(r, points, "alltoall") for r in range(2)])
    assert [(p.size_bytes, p.in_place, p.wrong) for p in summary] == [
        (64, False, 0),
        (64, True, None),
        (128, False, 0),
        (128, True, None),
    ]
    assert avg_busbw(summary) == pytest.approx(sum(p.busbw_gbs for p in summary) / 4)
    assert summary[0].busbw_gbs == pytest.approx(64 / 1e-6 / 1e9 * 0.5)  # alltoall (n-1)/n


def test_summarize_sweep_refuses_mismatched_ranks():
    point = [{"size_bytes": 8, "count": 2, "out_of_place": _cell([1.0])}]
    with pytest.raises(ValueError, match=r"ranks 0\.\.1"):
        summarize_sweep([_rank_value(0, point), _rank_value(0, point)])
    with pytest.raises(ValueError, match="did not run the same sweep"):
        summarize_sweep([_rank_value(0, point), _rank_value(1, point, "broadcast")])
    with pytest.raises(ValueError, match="aggregate"):
        summarize_sweep([_rank_value(0, point, nranks=1)], aggregate="mean")


def test_sweep_options_validate_before_any_torch_import():
    opts = SweepOptions.from_dict({"collective": "reduce", "max_bytes": "64M", "dtype": "bf16", "root": 1}, 2)
    assert (opts.max_bytes, opts.dtype, opts.root, opts.iters) == (64 << 20, "bfloat16", 1, 20)
    with pytest.raises(ValueError, match="unknown sweep option"):
        SweepOptions.from_dict({"colective": "all_reduce"}, 2)
    with pytest.raises(ValueError, match="root 2"):
        SweepOptions.from_dict({"root": 2}, 2)
    with pytest.raises(ValueError, match="unknown collective"):
        SweepOptions.from_dict({"collective": "allreduce"}, 2)
    with pytest.raises(ValueError, match="op"):
        SweepOptions.from_dict({"op": "mean"}, 2)


def test_parent_side_imports_no_torch():
    code = (
        "import sys; import pytest_gpucluster.workloads.collectives, pytest_gpucluster.workloads.shm_allreduce;"
        " sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
