"""The gate inside a run (results/regression.py through `Recorder.check_all`): a suspected regression
is measured again through the test's callback, both measurements are recorded, the test fails only
when the confirmation regresses too, and `compare_runs` on the written file says the same."""

import json
import warnings

import pytest

from pytest_gpucluster.errors import GpuClusterWarning
from pytest_gpucluster.results.baseline import RunResults, compare_runs, read_results
from pytest_gpucluster.results.gate import ToleranceRule, Tolerances
from pytest_gpucluster.results.model import Check, Measurement, Spread
from pytest_gpucluster.results.recorder import Recorder, RegressionFailure, ThresholdFailure
from pytest_gpucluster.results.regression import RegressionGate

GB = 1e9
HEADER = {"fingerprint": {"hosts": ["n1", "n2"], "versions": {"torch": "2.4.0"}}, "profile": {"name": "p"}}
TOLERANCES = Tolerances(0.05, "--max-regression, default", (ToleranceRule("*.latency", 0.2, "profile p: x"),))


def busbw(value, size=2**22, spread=None, **extra):
    return Check(
        "collectives.all_reduce.busbw", value, "B/s", 1.0, ">=", None, "inter-node",
        {"size_bytes": size, **extra}, None if spread is None else Spread.of(spread), "hint: all_reduce of 4 MiB",
    )  # fmt: skip


def baseline(*checks, hosts=("n1", "n2")):
    ms = tuple(Measurement.of(c, test_id="old::t", time=1.0) for c in checks)
    return RunResults("base.json", ms, (), {"hosts": list(hosts), "versions": {"torch": "2.3.0"}})


def recorder(tmp_path, base, mode="fail"):
    rec = Recorder(path=tmp_path / "results.json", header=dict(HEADER))
    rec.gate = RegressionGate.start(base, rec.header, TOLERANCES, mode)
    rec.current_test = "new::t"
    return rec


def agreement(rec):
    """The comparison of the written file with the baseline, as `gpucluster compare` makes it."""
    return compare_runs(rec.gate.baseline, read_results(rec.path), TOLERANCES)


def test_a_confirmed_regression_fails_naming_baseline_first_and_confirmation(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB, spread=[9.8 * GB, 10 * GB, 10.2 * GB])))
    asked = []

    def again(suspects):
        asked.extend(suspects)
        return [busbw(7.1 * GB), busbw(1.0, size=1)]  # extra checks are ignored

    with pytest.raises(RegressionFailure) as failure:
        rec.check_all([busbw(7 * GB)], remeasure=again)
    assert [c.value for c in asked] == [7 * GB]
    text = str(failure.value)
    assert text.splitlines()[0] == (
        "REGRESSION collectives.all_reduce.busbw [inter-node] (size_bytes=4194304): baseline 10 GB/s "
        "[9.8 GB/s..10.2 GB/s] (3 repeat(s) or run(s)), first 7 GB/s, confirmed 7.1 GB/s: 27.6% below the "
        "baseline's low end (median change -29.0%), allowed 5% (tolerance from --max-regression, default); "
        "compared same point. hint: all_reduce of 4 MiB"
    )
    assert "baseline base.json; what changed since: torch 2.3.0 -> 2.4.0" in text
    saved = json.loads(rec.path.read_text())["measurements"]
    assert [(x["value"], x.get("attempt", 1)) for x in saved] == [(7 * GB, 1), (7.1 * GB, 2)]
    (row,) = agreement(rec).regressions
    assert (row.first, row.new) == (7 * GB, 7.1 * GB)
    assert isinstance(failure.value, ThresholdFailure)  # a performance failure in the summary


def test_a_suspect_the_confirmation_clears_passes_and_both_are_kept(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB, spread=[9.8 * GB, 10 * GB])))
    recorded = rec.check_all([busbw(7 * GB)], remeasure=lambda suspects: [busbw(9.9 * GB)])
    assert [x.value for x in recorded] == [7 * GB]
    assert [(x.value, x.attempt) for x in rec.measurements] == [(7 * GB, 1), (9.9 * GB, 2)]
    comparison = agreement(rec)
    assert not comparison.regressions and comparison.changes[0].first == 7 * GB


def test_values_within_the_noise_are_never_measured_again(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB, spread=[9 * GB, 10 * GB])))

    def never(_):
        raise AssertionError("no suspect, no re-measurement")

    rec.check_all([busbw(8.8 * GB), busbw(0.1 * GB, size=1024)], remeasure=never)  # 1024: not in the baseline
    assert len(rec.measurements) == 2


def test_without_a_way_to_remeasure_the_first_measurement_counts_and_the_message_says_so(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB)))
    with pytest.raises(RegressionFailure, match="not confirmed: this test cannot re-measure"):
        rec.check_all([busbw(5 * GB)])
    assert agreement(rec).fails


def test_a_failing_remeasurement_keeps_the_regression_and_names_the_error(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB)))

    def broken(_):
        raise RuntimeError("the confirmation job could not start")

    with pytest.raises(
        RegressionFailure, match=r"the re-measurement failed \(RuntimeError: the confirmation job"
    ):
        rec.check_all([busbw(5 * GB)], remeasure=broken)


def test_warn_mode_warns_and_does_not_fail(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB)), mode="warn")
    with pytest.warns(GpuClusterWarning, match="REGRESSION collectives.all_reduce.busbw"):
        rec.check_all([busbw(5 * GB)], remeasure=lambda s: [busbw(5 * GB)])


def test_threshold_failures_and_regressions_are_reported_together(tmp_path):
    rec = recorder(tmp_path, baseline(busbw(10 * GB)))
    slow_floor = Check("x.busbw", 1.0, "B/s", 2.0, ">=", None, None, {}, None, "raise it")
    with pytest.raises(RegressionFailure) as failure:
        rec.check_all([busbw(5 * GB), slow_floor], remeasure=lambda s: [busbw(5 * GB)])
    text = str(failure.value)
    assert text.index("REGRESSION collectives.all_reduce.busbw") < text.index("x.busbw: measured 1e-09 GB/s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ThresholdFailure) as only:
            rec.check_all([slow_floor])
    assert not isinstance(only.value, RegressionFailure)


def test_on_other_hosts_the_whole_group_is_measured_again_and_judged_as_a_median(tmp_path):
    def rank(value, host, r):
        return Check("burnin.cpu_matmul", value, "FLOP/s", 1.0, ">=", None, None, {"host": host, "rank": r})

    base = baseline(rank(100.0, "a", 0), rank(100.0, "b", 1), hosts=("a", "b"))
    rec = recorder(tmp_path, base)  # this run is on n1, n2
    asked = []

    def again(suspects):
        asked.extend(c.labels["host"] for c in suspects)
        return [rank(99.0, "n1", 0), rank(101.0, "n2", 1)]

    rec.check_all([rank(50.0, "n1", 0), rank(60.0, "n2", 1)], remeasure=again)
    assert sorted(asked) == ["n1", "n2"]
    (row,) = agreement(rec).changes
    assert (row.basis, row.first, row.new, row.status) == ("median over hosts", 55.0, 100.0, "ok")
