"""Two results files compared: direction, tolerance, matching on metric+scope+labels, missing
metrics, fingerprint diff, a changed machine, unreadable files, and `gpucluster compare` exit codes.
The gate's rule itself (noise, hosts, confirmations) is tests/unit/test_gate_rule.py."""

import dataclasses
import json
import math

import pytest

from pytest_gpucluster import cli
from pytest_gpucluster.results.baseline import (
    BaselineComparison,
    ResultsFileError,
    RunResults,
    compare_runs,
    direction_of,
    read_results,
)
from pytest_gpucluster.results.comparison_text import comparison_lines, regression_sentence
from pytest_gpucluster.results.gate import ToleranceRule, Tolerances
from pytest_gpucluster.results.model import SCHEMA_VERSION, Measurement

GB = 1e9


def m(metric, value, unit="B/s", threshold=0.0, comparison=">=", scope="intra-node", **labels):
    """A gated measurement by default (a threshold of 0); ``threshold=None`` records it as info."""
    if threshold == 0.0 and comparison == "<=":
        threshold = 1e30
    return Measurement(
        test_id="t::x",
        metric=metric,
        value=value,
        unit=unit,
        threshold=threshold,
        comparison=comparison,
        scope=scope,
        labels=labels,
    )


FINGERPRINT = {
    "hosts": ["node1", "node2"],
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_count": 8,
    "platform": "Linux-5.15",
    "versions": {"nccl": "2.21.5", "driver": "550.54.15", "torch": "2.3.0", "cuda": "12.4"},
    "environment": {"NCCL_IB_HCA": "mlx5_0"},
}


def run(measurements, source="run.json", **fingerprint):
    return RunResults(
        source=source,
        measurements=tuple(measurements),
        outcomes=(),
        fingerprint={**FINGERPRINT, **fingerprint},
        profile={"name": "h100-ib", "sha256": "a" * 64},
    )


@pytest.mark.parametrize(
    ("measurement", "direction"),
    [
        (m("x", 1.0, unit="GPUs", threshold=1.0), "higher"),  # a floor says higher is better
        (m("x", 1.0, unit="B/s", threshold=1.0, comparison="<="), "lower"),  # a ceiling wins over the unit
        (m("collectives.all_reduce.busbw", 1.0, unit="B/s", threshold=None), "higher"),
        (m("sft.tflops", 1.0, unit="FLOP/s", threshold=None), "higher"),
        (m("sft.tokens", 1.0, unit="tokens/s", threshold=None), "higher"),
        (m("sft.mfu", 0.4, unit="fraction", threshold=None), "higher"),
        (m("sft.step_time", 1.0, unit="s", threshold=None), "lower"),
        (m("sft.peak_memory", 1.0, unit="B", threshold=None), "lower"),
        (m("inventory.gpus", 8, unit="GPUs", threshold=8, comparison="=="), None),
        (m("inventory.cuda", 1, unit="bool", threshold=None), None),
    ],
)
def test_direction_from_comparison_then_unit(measurement, direction):
    assert direction_of(measurement)[0] == direction


def test_busbw_drop_beyond_tolerance_is_a_regression_with_old_new_and_change():
    old = run([m("collectives.all_reduce.busbw", 200 * GB, size_bytes=2**30)], "old.json")
    new = run([m("collectives.all_reduce.busbw", 180 * GB, size_bytes=2**30)], "new.json")
    c = compare_runs(old, new, 0.05)
    assert [ch.status for ch in c.changes] == ["regression"]
    ch = c.regressions[0]
    assert (ch.old, ch.new) == (200 * GB, 180 * GB)
    assert ch.change == pytest.approx(-0.10)
    assert c.fails
    message = regression_sentence(ch)
    assert message.startswith(
        "collectives.all_reduce.busbw [intra-node] (size_bytes=1073741824): baseline 200 GB/s"
    )
    assert (
        "measured 180 GB/s: 10.0% below the baseline's low end (median change -10.0%), allowed 5%" in message
    )
    assert "(tolerance from --max-regression); compared same point" in message


def test_within_tolerance_and_exactly_at_tolerance_pass():
    old = run([m("a.busbw", 100.0, size_bytes=1), m("b.busbw", 100.0, size_bytes=1)])
    new = run([m("a.busbw", 96.0, size_bytes=1), m("b.busbw", 95.0, size_bytes=1)])
    c = compare_runs(old, new, 0.05)
    assert {ch.metric: ch.status for ch in c.changes} == {"a.busbw": "ok", "b.busbw": "ok"}
    assert not c.fails


def test_ceiling_metric_regresses_when_it_grows_and_improves_when_it_shrinks():
    old = run(
        [m("sft.step_time", 1.0, "s", 2.0, "<=", case="a"), m("sft.step_time", 1.0, "s", 2.0, "<=", case="b")]
    )
    new = run(
        [m("sft.step_time", 1.2, "s", 2.0, "<=", case="a"), m("sft.step_time", 0.5, "s", 2.0, "<=", case="b")]
    )
    c = compare_runs(old, new, 0.05)
    status = {ch.labels["case"]: ch.status for ch in c.changes}
    assert status == {"a": "regression", "b": "improved"}
    assert c.changes[0].status == "regression"  # regressions are listed first


def test_higher_bandwidth_is_an_improvement_not_a_regression():
    c = compare_runs(run([m("x.busbw", 100.0)]), run([m("x.busbw", 200.0)]), 0.05)
    assert c.changes[0].status == "improved"
    assert not c.fails


def test_matching_is_on_metric_scope_and_labels_not_test_id():
    old = run(
        [m("x.busbw", 100.0, size_bytes=1024), m("x.busbw", 100.0, scope="inter-node", size_bytes=1024)]
    )
    renamed = dataclasses.replace(m("x.busbw", 50.0, size_bytes=1024), test_id="renamed::t")
    new = run([renamed, m("x.busbw", 100.0, size_bytes=2048)])
    c = compare_runs(old, new, 0.05)
    assert [(ch.scope, ch.status) for ch in c.changes] == [("intra-node", "regression")]
    assert c.only_in_baseline == ("x.busbw|inter-node|size_bytes=1024",)
    assert c.only_in_current == ("x.busbw|intra-node|size_bytes=2048",)
    text = "\n".join(comparison_lines(c))
    assert "missing from this run (1): x.busbw|inter-node|size_bytes=1024" in text
    assert "not in the baseline (1): x.busbw|intra-node|size_bytes=2048" in text


def test_unknown_unit_or_no_threshold_is_compared_but_not_gated_and_nan_is_reported():
    old = run(
        [
            m("inventory.gpus", 8, unit="GPUs", threshold=None),
            m("x.busbw", 100.0),
            m("y.busbw", 100.0, threshold=None),
        ]
    )
    new = run(
        [
            m("inventory.gpus", 4, unit="GPUs", threshold=None),
            m("x.busbw", math.nan),
            m("y.busbw", 10.0, threshold=None),
        ]
    )
    c = compare_runs(old, new, 0.05)
    status = {ch.metric: ch.status for ch in c.changes}
    assert status == {"inventory.gpus": "info", "x.busbw": "no value", "y.busbw": "info"}
    assert {ch.metric: ch.change for ch in c.changes}["y.busbw"] == pytest.approx(-0.9)  # shown all the same
    assert not c.fails


def test_per_metric_override_by_glob():
    old = run([m("sft.tokens_per_s", 100.0, unit="tokens/s"), m("x.busbw", 100.0)])
    new = run([m("sft.tokens_per_s", 85.0, unit="tokens/s"), m("x.busbw", 85.0)])
    rules = (ToleranceRule("sft.*", 0.20, "profile p: regression.tolerances[0]"),)
    c = compare_runs(old, new, Tolerances(0.05, "--max-regression", rules))
    assert {ch.metric: ch.status for ch in c.changes} == {"sft.tokens_per_s": "ok", "x.busbw": "regression"}
    assert {ch.metric: ch.tolerance_source for ch in c.changes} == {
        "sft.tokens_per_s": "profile p: regression.tolerances[0]",
        "x.busbw": "--max-regression",
    }
    off = Tolerances(
        0.05, "--max-regression", (ToleranceRule("x.*", None, "profile p: regression.tolerances[0]"),)
    )
    (shown,) = [ch for ch in compare_runs(old, new, off).changes if ch.metric == "x.busbw"]
    assert shown.status == "info" and shown.tolerance is None


def test_environment_diff_says_what_changed():
    old = run([m("x.busbw", 100.0)])
    new = run(
        [m("x.busbw", 100.0)],
        versions={"nccl": "2.23.4", "driver": "560.28.03", "torch": "2.3.0", "cuda": "12.4"},
        environment={"NCCL_IB_HCA": "mlx5_1", "NCCL_ALGO": "Ring"},
    )
    changed = [str(e) for e in compare_runs(old, new, 0.05).environment]
    assert "NCCL 2.21.5 -> 2.23.4" in changed
    assert "driver 550.54.15 -> 560.28.03" in changed
    assert "NCCL_IB_HCA mlx5_0 -> mlx5_1" in changed
    assert "NCCL_ALGO (unset) -> Ring" in changed
    assert not any(s.startswith(("torch", "CUDA")) for s in changed)  # unchanged ones are not listed


def test_a_changed_machine_is_said_and_the_gate_stays_on_unless_asked_to_warn():
    old = run([m("x.busbw", 100.0)])
    new = run([m("x.busbw", 50.0)], gpu_model="NVIDIA H200", hosts=["other1", "other2"])
    c = compare_runs(old, new, 0.05)
    assert c.regressions and c.fails
    assert c.machine_changed == (
        "GPU model NVIDIA H100 80GB HBM3 -> NVIDIA H200",
        "hosts node1,node2 -> other1,other2",
    )
    lines = comparison_lines(c)
    assert (
        "note: the machine changed (GPU model NVIDIA H100 80GB HBM3 -> NVIDIA H200; hosts node1,node2 -> "
        "other1,other2); the gate stays on" in lines
    )
    assert lines[-1].startswith(
        "FAILED: 1 measurement(s) regressed beyond their tolerance and the baseline's noise"
    )
    warned = compare_runs(old, new, 0.05, mode="warn")
    assert warned.regressions and not warned.fails
    assert comparison_lines(warned)[-1] == "WARNING: 1 regression(s), not failing (--regression-gate warn)"


def test_comparison_survives_json_round_trip():
    c = compare_runs(run([m("x.busbw", 100.0, size_bytes=8)]), run([m("x.busbw", 10.0, size_bytes=8)]), 0.05)
    again = BaselineComparison.from_json(json.loads(json.dumps(c.to_json())))
    assert again == c


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_read_results_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(ResultsFileError, match=r"cannot read results file .*missing.json: No such file"):
        read_results(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultsFileError, match=r"bad.json is not valid JSON \(line 1, column 2"):
        read_results(tmp_path / "bad.json")
    _write(tmp_path / "other.json", {"hello": 1})
    with pytest.raises(ResultsFileError, match=r"not a pytest-gpucluster results\.json"):
        read_results(tmp_path / "other.json")
    _write(tmp_path / "future.json", {"schema_version": SCHEMA_VERSION + 1, "measurements": []})
    with pytest.raises(
        ResultsFileError,
        match=f"schema_version {SCHEMA_VERSION + 1}; .* versions 1, 2, 3 .upgrade the plugin",
    ):
        read_results(tmp_path / "future.json")


# A measurement as schema version 1 wrote it (baselines users keep): a free-text source, a stored
# verdict, no ref, no hint.
VERSION_1 = {
    "schema_version": 1,
    "fingerprint": FINGERPRINT,
    "measurements": [
        {
            "test_id": "acceptance/test_collectives.py::test_collective[all_reduce-intra-node]",
            "metric": "collectives.all_reduce.busbw",
            "value": 1.2e9,
            "unit": "B/s",
            "threshold": 3e8,
            "comparison": ">=",
            "verdict": "pass",
            "scope": "intra-node",
            "labels": {"size_bytes": 16777216, "collective": "all_reduce", "placement": "out_of_place"},
            "spread": {
                "median": 1.2e9,
                "min": 1.1e9,
                "max": 1.3e9,
                "mad": 5e7,
                "n": 3,
                "values": [1.1e9, 1.2e9, 1.3e9],
            },
            "source": "profile cpu-local: collectives.checks[0].min_busbw, FEASIBILITY.md §5",
            "time": 1795459274.7,
        }
    ],
    "outcomes": [],
}


def test_version_1_files_still_read_and_compare_with_version_2(tmp_path):
    old = read_results(_write(tmp_path / "v1.json", VERSION_1))
    (measurement,) = old.measurements
    assert (measurement.value, measurement.threshold, measurement.verdict) == (1.2e9, 3e8, "pass")
    assert measurement.ref is None and measurement.spread.values == (1.1e9, 1.2e9, 1.3e9)
    now = run(
        [
            m(
                "collectives.all_reduce.busbw",
                0.8e9,
                threshold=3e8,
                size_bytes=16777216,
                collective="all_reduce",
                placement="out_of_place",
            )
        ]
    )
    (change,) = compare_runs(old, now, 0.05).changes
    # the median moved -33%; past the low end of the baseline's repeats (1.1 GB/s) it is -27.3%,
    # beyond both the 5% tolerance and the repeats' own 18% spread (1.1-1.3 GB/s)
    assert (change.status, round(change.change, 2), round(change.margin, 3)) == ("regression", -0.33, 0.273)
    assert round(change.spread, 3) == 0.182


def test_version_2_round_trips_ref_and_hint(tmp_path):
    from pytest_gpucluster.results.model import ThresholdRef

    ref = ThresholdRef("cpu-local", ("collectives", "checks", 0, "min_busbw"))
    written = Measurement(
        "collectives.all_reduce.busbw", 1e9, "B/s", 3e8, ">=", ref, "intra-node", hint="look at it"
    )
    data = {"schema_version": SCHEMA_VERSION, "measurements": [written.to_json()], "outcomes": []}
    (read,) = read_results(_write(tmp_path / "v2.json", data)).measurements
    assert read == written and str(read.ref) == "profile cpu-local: collectives.checks[0].min_busbw"


def _results_file(path, busbw):
    data = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": FINGERPRINT,
        "measurements": [m("collectives.all_gather.busbw", busbw, size_bytes=2**20).to_json()],
        "outcomes": [],
    }
    return _write(path, data)


def test_cli_compare_exit_codes(tmp_path, capsys):
    old = _results_file(tmp_path / "old.json", 100 * GB)
    same = _results_file(tmp_path / "same.json", 98 * GB)
    slow = _results_file(tmp_path / "slow.json", 88 * GB)
    assert cli.main(["compare", str(old), str(same)]) == 0
    assert (
        "no regression in 1 gated measurement(s); 0 more compared and shown, not gated"
        in capsys.readouterr().out
    )
    assert cli.main(["compare", str(old), str(slow)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION  collectives.all_gather.busbw [intra-node] (size_bytes=1048576)  100 GB/s" in out
    assert "-12.0%" in out
    assert cli.main(["compare", str(old), str(slow), "--max-regression", "15%"]) == 0
    assert cli.main(["compare", str(old), str(slow), "--max-regression", "0.15"]) == 0
    capsys.readouterr()
    assert cli.main(["compare", str(old), str(tmp_path / "nope.json")]) == 2
    assert "cannot read results file" in capsys.readouterr().err
    assert cli.main(["compare", str(old), str(slow), "--max-regression", "lots"]) == 2
    assert "--max-regression 'lots': expected a percentage such as 5%" in capsys.readouterr().err
