"""Straggler detection: median-relative, per rank and per host, on recorded sweeps and health jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.stragglers import (
    Sample,
    find_stragglers,
    reference_of,
    sweep_samples,
    value_samples,
    worst_per_host,
)

DATA = Path(__file__).parents[1] / "data" / "burnin"


def _load(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text())


def _times(*values: float, host: str = "n") -> list[Sample]:
    return [Sample(f"rank {i}", v, f"{host}{i // 2}", i) for i, v in enumerate(values)]


def test_one_slow_rank_of_eight_is_named_with_its_host():
    verdict = find_stragglers(_times(1.0, 1.02, 0.98, 1.01, 1.0, 1.6, 0.99, 1.03), tolerance=0.25)
    assert [s.sample.key for s in verdict.stragglers] == ["rank 5"]
    st = verdict.stragglers[0]
    assert st.sample.host == "n2"
    assert st.reference == pytest.approx(1.0)
    assert st.excess == pytest.approx(0.6)
    text = st.sentence("matmul time", "s", 0.25)
    assert text == "rank 5 on n2: matmul time 1.6 s, the median of its peers 1 s (60% slower, tolerance 25%)"


def test_within_tolerance_nobody_is_named():
    assert find_stragglers(_times(1.0, 1.2, 0.9, 1.1), tolerance=0.25).ok


def test_two_ranks_compare_the_slow_one_with_the_fast_one_not_their_average():
    # With the plain median (1.5) the slow rank would be only 33% above it; against the fast
    # rank it is 100% slower, and the fast rank is never named.
    verdict = find_stragglers(_times(1.0, 2.0), tolerance=0.5)
    assert [s.sample.rank for s in verdict.stragglers] == [1]
    assert verdict.reference == 1.0
    assert verdict.stragglers[0].excess == pytest.approx(1.0)


def test_min_excess_keeps_microsecond_noise_out():
    # 4 us vs 9 us of host time per iteration is 125% "slower" and means nothing.
    samples = _times(4e-6, 9e-6)
    assert not find_stragglers(samples, tolerance=0.25).ok
    assert find_stragglers(samples, tolerance=0.25, min_excess=1e-3).ok


def test_rates_use_the_same_tolerance_in_time():
    # busbw 50 against a median of 100: the same work takes twice as long (100% slower).
    samples = [Sample(f"n{i}", v, f"n{i}") for i, v in enumerate([100.0, 98.0, 50.0, 101.0])]
    at_90 = find_stragglers(samples, tolerance=0.9, higher_is_better=True)
    assert [s.sample.key for s in at_90.stragglers] == ["n2"]
    assert at_90.reference == 100.0  # median_high of 4 rates
    assert at_90.stragglers[0].excess == pytest.approx(1.0)
    assert find_stragglers(samples, tolerance=1.0, higher_is_better=True).ok


def test_reference_is_the_healthier_middle_value():
    assert reference_of([3.0, 1.0, 2.0, 4.0]) == 2.0
    assert reference_of([3.0, 1.0, 2.0, 4.0], higher_is_better=True) == 3.0
    assert reference_of([5.0, 1.0, 3.0]) == 3.0


def test_one_sample_has_no_peers():
    verdict = find_stragglers(_times(9.0), tolerance=0.1)
    assert verdict.ok and verdict.reference is None


@pytest.mark.parametrize(
    ("values", "tolerance", "message"),
    [
        ((1.0, float("nan")), 0.1, "impossible measurement nan"),
        ((1.0, -2.0), 0.1, "negative"),
        ((1.0, 2.0), -0.1, ">= 0"),
    ],
)
def test_bad_input_is_refused(values, tolerance, message):
    with pytest.raises(BurninError, match=message):
        find_stragglers(_times(*values), tolerance=tolerance)


def test_worst_rank_per_host_compares_nodes():
    samples = _times(1.0, 1.1, 1.0, 3.0, 1.05, 0.95)  # hosts n0, n0, n1, n1, n2, n2
    per_host = worst_per_host(samples)
    assert [(s.key, s.value, s.rank) for s in per_host] == [("n0", 1.1, 1), ("n1", 3.0, 3), ("n2", 1.05, 4)]
    assert [s.sample.key for s in find_stragglers(per_host, tolerance=0.5).stragglers] == ["n1"]


def test_recorded_sweep_with_an_injected_slow_rank_names_that_rank_and_host():
    # Recorded: collectives.sweep on 2 local ranks with inject_delay_s=0.02 on rank 1 (SOURCES.md).
    values = _load("sweep_all_reduce_2ranks_inject_rank1_20ms.json")
    samples = sweep_samples(values)
    assert [s.key for s in samples] == ["rank 0", "rank 1"]
    assert samples[1].value == pytest.approx(0.020, abs=0.003)  # the 20 ms sleep, per iteration
    assert samples[0].value < 1e-3
    verdict = find_stragglers(samples, tolerance=1.0, min_excess=1e-3)
    assert [(s.sample.rank, s.sample.host) for s in verdict.stragglers] == [(1, "vm")]
    suspect = verdict.stragglers[0].suspect("time outside the collective per iteration", "s", 1.0)
    assert suspect.node == "vm" and suspect.rank == 1 and suspect.check == "straggler"
    assert suspect.reason.startswith("rank 1 on vm: time outside the collective per iteration 20")


def test_recorded_clean_sweep_has_no_straggler():
    verdict = find_stragglers(
        sweep_samples(_load("sweep_all_reduce_2ranks_clean.json")), tolerance=1.0, min_excess=1e-3
    )
    assert verdict.ok and len(verdict.samples) == 2


def test_value_samples_read_a_path_and_skip_ranks_without_it():
    values = _load("cpu_vm_health_2ranks.json")
    samples = value_samples(values, "cpu", "matmul_s")
    assert [(s.rank, s.host) for s in samples] == [(0, "vm"), (1, "vm")]
    assert all(0 < s.value < 1 for s in samples)
    assert value_samples(values, "gpu", "matmul_s") == []  # a CPU machine: the GPU part was skipped
