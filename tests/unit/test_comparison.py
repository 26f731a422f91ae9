"""checks/comparison.py: pairing two sides per size, reading the shm-vs-gloo job and a collective
sweep; and plans/nvlink.py's sweep spans and the two sides of the GPU speedup."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from pytest_gpucluster.checks.comparison import (
    Comparison,
    RatioPoint,
    pair,
    shm_vs_gloo,
    spread_of,
    sweep_busbw,
)
from pytest_gpucluster.maths.sweep import summarize_sweep
from pytest_gpucluster.plans.nvlink import NCCL_LOG, NVLINK_OFF, speedup_parts, sweep_span
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.workloads.shm_allreduce import summarize_compare

MIB = 1 << 20


# --------------------------------------------------------------------------------------------
# pairing and ratios
# --------------------------------------------------------------------------------------------


def test_ratio_is_of_medians_and_repeat_ratios_are_paired():
    point = RatioPoint(MIB, fast=(6e9, 2e9, 4e9), slow=(1e9, 2e9, 1e9))
    assert (point.fast_busbw, point.slow_busbw) == (4e9, 1e9)
    assert point.ratio == pytest.approx(4.0)
    assert point.repeat_ratios == (6.0, 1.0, 4.0)
    spread = point.ratio_spread()
    assert (spread.median, spread.min, spread.max, spread.n) == (4.0, 1.0, 6.0, 3)
    assert spread.mad == pytest.approx(2.0)
    assert spread.values == (6.0, 1.0, 4.0)


def test_a_slow_side_of_zero_gives_an_infinite_ratio_not_a_crash():
    point = RatioPoint(MIB, fast=(1e9,), slow=(0.0,))
    assert point.ratio == float("inf")
    assert point.repeat_ratios == ()
    assert point.ratio_spread() is None


def test_spread_needs_two_values():
    assert spread_of([3.0]) is None
    assert spread_of([1.0, 3.0]).median == 2.0


def test_pair_keeps_common_sizes_in_order_and_names_the_pair():
    comparison = pair(
        {MIB: [3e9], 16 * MIB: [2e9], 64 * MIB: [1e9]},
        {16 * MIB: [1e9], MIB: [1e9]},
        fast_name="shm",
        slow_name="gloo",
    )
    assert comparison.pair == "shm/gloo"
    assert [p.size_bytes for p in comparison.points] == [MIB, 16 * MIB]
    assert comparison.at(16 * MIB).ratio == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"no point at 64 MiB \(it has 1 MiB, 16 MiB\)"):
        comparison.at(64 * MIB)


def test_pair_at_a_size_one_side_lacks_names_side_and_sizes():
    with pytest.raises(ValueError, match=r"gloo has no measurement at 16 MiB \(it has 1 MiB\)"):
        pair(
            {MIB: [2e9], 16 * MIB: [2e9]},
            {MIB: [1e9]},
            fast_name="shm",
            slow_name="gloo",
            sizes=[MIB, 16 * MIB],
        )
    with pytest.raises(ValueError, match="no common message size"):
        pair({MIB: [2e9]}, {2 * MIB: [1e9]}, fast_name="a", slow_name="b")


def test_table_lists_every_size_with_both_sides_ratio_and_repeat_range():
    comparison = Comparison(
        "shm", "gloo", (RatioPoint(MIB, (6e9, 5e9), (1e9, 1e9)), RatioPoint(1000, (2e9,), (1e9,)))
    )
    lines = comparison.table().splitlines()
    assert lines[0].split() == ["size", "shm", "GB/s", "gloo", "GB/s", "ratio", "repeats"]
    assert lines[1].split() == ["1", "MiB", "5.500", "1.000", "5.50", "5.00..6.00"]
    assert lines[2].split() == ["1000", "B", "2.000", "1.000", "2.00", "2.00..2.00"]


# --------------------------------------------------------------------------------------------
# sweep spans
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "options", "visited"),
    [
        ([16 * MIB], {"min_bytes": 16 * MIB, "max_bytes": 16 * MIB, "factor": 2}, [16 * MIB]),
        ([16 * MIB, MIB], {"min_bytes": MIB, "max_bytes": 16 * MIB, "factor": 16}, [MIB, 16 * MIB]),
        (
            [MIB, 4 * MIB, 16 * MIB],
            {"min_bytes": MIB, "max_bytes": 16 * MIB, "factor": 4},
            [MIB, 4 * MIB, 16 * MIB],
        ),
        (
            [MIB, 2 * MIB, 16 * MIB],
            {"min_bytes": MIB, "max_bytes": 16 * MIB, "factor": 2},
            [MIB << k for k in range(5)],
        ),
    ],
)
def test_sweep_span_visits_every_size(sizes, options, visited):
    assert sweep_span(sizes) == (options, visited)


def test_sweep_span_refuses_sizes_a_doubling_sweep_cannot_reach():
    with pytest.raises(
        ValueError, match=r"message sizes 3 MiB are not a power-of-two multiple of the smallest, 1 MiB"
    ):
        sweep_span([MIB, 3 * MIB, 4 * MIB])
    assert sweep_span([MIB, 3 * MIB])[1] == [MIB, 3 * MIB]  # a factor of 3 reaches both
    with pytest.raises(ValueError, match="at least one positive"):
        sweep_span([])


# --------------------------------------------------------------------------------------------
# reading jobs
# --------------------------------------------------------------------------------------------


def shm_rank(rank: int, points: list[tuple[int, list[float], list[float]]], wrong: int = 0) -> dict[str, Any]:
    """One rank's value of ``shm_allreduce:compare``: (size, gloo_us per repeat, shm_us per repeat)."""
    return {
        "rank": rank,
        "nranks": 2,
        "host": "node0",
        "dtype": "float32",
        "points": [
            {"size_bytes": s, "count": s // 4, "gloo_us": g, "shm_us": m, "speedup": 0.0, "shm_wrong": wrong}
            for s, g, m in points
        ],
    }


def test_shm_vs_gloo_averages_ranks_per_repeat_and_agrees_with_the_workloads_summary():
    values = [
        shm_rank(1, [(MIB, [1000.0, 1100.0, 900.0], [200.0, 250.0, 150.0])]),
        shm_rank(0, [(MIB, [1000.0, 900.0, 1100.0], [200.0, 150.0, 250.0])]),
    ]
    comparison = shm_vs_gloo(values)
    assert (comparison.fast, comparison.slow) == ("shm", "gloo")
    point = comparison.at(MIB)
    # Per repeat, the ranks average to 1000 us (gloo) and 200 us (shm); 2 ranks: busbw = algbw.
    assert point.slow == pytest.approx((MIB / 1000e-6,) * 3)
    assert point.fast == pytest.approx((MIB / 200e-6,) * 3)
    assert point.ratio == pytest.approx(5.0)
    [summary] = summarize_compare(values)
    assert point.ratio == pytest.approx(summary["speedup"])
    assert "2 ranks on node0" in comparison.origin


def test_shm_vs_gloo_takes_each_sides_best_repeat_so_preempted_repeats_do_not_move_it():
    """The shape of a healthy run on a busy 2-vCPU machine (kept run gn3/run3: median over median
    1.57x, best over best 6.8x): half the shm repeats lost a time slice while the op spun."""
    gloo = [1000.0, 1100.0, 1000.0, 1200.0, 1000.0]
    shm = [200.0, 2000.0, 180.0, 2500.0, 2200.0]  # three repeats preempted, 10x slower
    values = [shm_rank(r, [(MIB, gloo, shm)]) for r in (0, 1)]
    point = shm_vs_gloo(values).at(MIB)
    assert point.ratio == pytest.approx(1000.0 / 180.0)  # best gloo over best shm time
    assert statistics.median(point.fast) / statistics.median(point.slow) < 1  # the median would fail it
    assert "best repeat" in shm_vs_gloo(values).origin
    # A shm path as slow as gloo is as slow at its best: the ratio reads 1, and fails any floor above it.
    slow_shm = [shm_rank(r, [(MIB, gloo, [1000.0, 1300.0, 1050.0, 1100.0, 1000.0])]) for r in (0, 1)]
    assert shm_vs_gloo(slow_shm).at(MIB).ratio == pytest.approx(1.0)


def test_shm_vs_gloo_uses_the_all_reduce_bus_factor():
    four = [shm_rank(r, [(MIB, [1000.0], [500.0])]) | {"nranks": 4} for r in range(4)]
    point = shm_vs_gloo(four).at(MIB)
    assert point.slow == pytest.approx((MIB / 1000e-6 * 1.5,))  # 2(n-1)/n at n=4


def test_shm_vs_gloo_refuses_a_fast_path_that_sums_wrongly():
    values = [shm_rank(0, [(MIB, [1000.0], [10.0])], wrong=7), shm_rank(1, [(MIB, [1000.0], [10.0])])]
    with pytest.raises(ValueError, match="summed 7 element"):
        shm_vs_gloo(values)


def sweep_rank(rank: int, size: int, times_us: list[float], nranks: int = 2) -> dict[str, Any]:
    """One rank's value of ``collectives:sweep`` at one size, out of place only."""
    cell = {"times_us": times_us, "lag_us": [0.0] * len(times_us), "wrong": 0}
    return {
        "collective": "all_reduce",
        "nranks": nranks,
        "rank": rank,
        "points": [{"size_bytes": size, "count": size // 4, "out_of_place": cell}],
    }


def test_sweep_busbw_gives_each_repeats_busbw_in_bytes_per_second():
    points = summarize_sweep([sweep_rank(r, 16 * MIB, [1000.0, 2000.0], nranks=4) for r in range(4)])
    busbw = sweep_busbw(points)
    assert list(busbw) == [16 * MIB]
    assert busbw[16 * MIB] == pytest.approx((16 * MIB / 1e-3 * 1.5, 16 * MIB / 2e-3 * 1.5))
    assert sweep_busbw(points, in_place=True) == {}


def test_the_gpu_speedup_is_one_sweep_under_two_environments():
    profile = load_profile("dgx-h100-ib").model
    fast, slow = speedup_parts(profile)
    assert fast.options == slow.options and fast.workload == slow.workload
    assert (fast.env, slow.env) == (NCCL_LOG, {**NCCL_LOG, **NVLINK_OFF}) and fast.key != slow.key
    sizes = sorted(int(s) for s in profile.nvlink.speedup_sizes)
    assert set(sizes) <= set(sweep_span(sizes)[1])
    assert fast.options["min_bytes"] == sizes[0] and fast.options["max_bytes"] == sizes[-1]
