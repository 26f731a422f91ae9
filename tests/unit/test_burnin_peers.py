"""checks/burnin/peers: stragglers, the detector's self-test, the pairwise and version counts as checks."""

from __future__ import annotations

from pytest_gpucluster.burnin.drift import DriftFinding
from pytest_gpucluster.burnin.stragglers import Sample, find_stragglers
from pytest_gpucluster.checks.burnin.peers import (
    injected_straggler,
    slow_alone,
    straggler_checks,
    version_check,
)
from pytest_gpucluster.results.model import ThresholdRef

LAGS = [Sample("rank 0", 4e-6, "n0", 0), Sample("rank 1", 20e-3, "n0", 1)]


def test_every_sample_is_recorded_and_the_stragglers_counted_and_named():
    verdict = find_stragglers(LAGS, tolerance=2.0, min_excess=1e-3)
    checks, suspects = straggler_checks(verdict, "burnin.rank_collective_lag", "time outside", "s", part="x")
    assert [(c.metric, c.labels, c.verdict) for c in checks[:2]] == [
        ("burnin.rank_collective_lag", {"host": "n0", "rank": 0, "part": "x"}, "info"),
        ("burnin.rank_collective_lag", {"host": "n0", "rank": 1, "part": "x"}, "info"),
    ]
    count = checks[-1]
    assert (count.metric, count.value, count.unit, count.failed) == (
        "burnin.rank_collective_lag.stragglers",
        1.0,
        "ranks",
        True,
    )
    assert count.ref is None and "more than 200%" in count.hint and "rank 1 on n0" in count.hint
    assert [(s.node, s.rank, s.check) for s in suspects] == [("n0", 1, "straggler")]


def test_the_self_test_passes_only_when_the_slowed_rank_alone_is_named():
    verdict = find_stragglers(LAGS, tolerance=2.0, min_excess=1e-3)
    checks, problem = injected_straggler(verdict, 1, 0.02)
    assert problem is None
    assert [c.labels for c in checks] == [
        {"rank": 0, "host": "n0", "injected": False},
        {"rank": 1, "host": "n0", "injected": True},
    ]
    _, wrong = injected_straggler(verdict, 0, 0.02)
    assert wrong.startswith("rank 0 on n0 slept 20 ms before every call, and the detector named [(1, 'n0')]")


def test_a_node_slow_on_its_own_is_kept_out_of_the_pairs():
    assert slow_alone({"n0": 10e9, "n1": 10.2e9, "n2": 2e9}, tolerance=0.25) == {"n2"}
    assert slow_alone({"n0": 10e9}, tolerance=0.25) == set()


def test_version_findings_are_one_check_naming_the_pins():
    finding = DriftFinding(
        "nccl", ("n1",), "2.19.3", "2.21.5", "pin", "n1 runs NCCL 2.19.3, the profile pins 2.21.5"
    )
    check = version_check([finding], "h100", {"nccl": "2.21.5"})
    assert (check.value, check.failed, check.ref) == (1.0, True, ThresholdRef("h100", ("versions",)))
    assert check.hint.splitlines() == [
        "n1 runs NCCL 2.19.3, the profile pins 2.21.5",
        "Pins of profile h100: nccl 2.21.5.",
    ]
    assert version_check([], "cpu-local", {}).ref is None
