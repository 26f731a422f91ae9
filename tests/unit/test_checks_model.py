"""results.model.Check and ThresholdRef, and Recorder.check_all: every check recorded, one failure
listing all that failed, unmeasured thresholds told apart from slow values."""

from __future__ import annotations

import json
import math

import pytest

from pytest_gpucluster.results.model import SCHEMA_VERSION, Check, Measurement, Spread, ThresholdRef
from pytest_gpucluster.results.recorder import NotMeasured, Recorder, ThresholdFailure
from pytest_gpucluster.results.text import failure_message

BUSBW = ThresholdRef("cpu-local", ("collectives", "checks", 0, "min_busbw"))


def test_a_ref_reads_as_the_profile_key_and_round_trips():
    assert BUSBW.key == "collectives.checks[0].min_busbw"
    assert str(BUSBW) == "profile cpu-local: collectives.checks[0].min_busbw"
    assert ThresholdRef("p", ("nccl", "net_plugin", "min_version")).key == "nccl.net_plugin.min_version"
    assert ThresholdRef.from_json(json.loads(json.dumps(BUSBW.to_json()))) == BUSBW


@pytest.mark.parametrize("path", [(), (0, "min_busbw"), ("sft", 1.5), ("sft", True)])
def test_a_ref_path_is_names_and_list_indices_starting_with_a_section(path):
    with pytest.raises(ValueError, match="key path"):
        ThresholdRef("p", path)


def test_verdicts():
    assert Check("x", 2.0, "B/s", 1.0).verdict == "pass"
    assert Check("x", 0.5, "B/s", 1.0).failed
    assert Check("x", 0.5, "s", 1.0, "<=").verdict == "pass"
    assert Check("x", 0.5, "s").verdict == "info"
    unmeasured = Check("x", math.nan, "fraction", 0.4)
    assert unmeasured.failed and not unmeasured.measured
    with pytest.raises(ValueError, match="comparison must be one of"):
        Check("x", 1.0, "x", 1.0, ">")  # type: ignore[arg-type]


def test_spread_of_keeps_the_values_in_order():
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (spread.median, spread.min, spread.max, spread.mad, spread.n) == (2.5, 1.0, 10.0, 1.0, 4)
    assert spread.values == (3.0, 1.0, 2.0, 10.0)
    with pytest.raises(ValueError, match="at least one value"):
        Spread.of([])


def test_failure_message_says_value_threshold_key_noise_and_hint():
    check = Check(
        "collectives.all_reduce.busbw", 0.2e9, "B/s", 0.3e9, ">=", BUSBW, "intra-node",
        {"size_bytes": 16 << 20}, Spread.of([0.1e9, 0.2e9, 0.25e9]), "look at rank 1",
    )  # fmt: skip
    assert failure_message(check) == (
        "collectives.all_reduce.busbw [intra-node] (size_bytes=16777216): measured 0.2 GB/s, expected at least "
        "0.3 GB/s (threshold from profile cpu-local: collectives.checks[0].min_busbw); median of 3, "
        "range 0.1 GB/s..0.25 GB/s. look at rank 1"
    )


def test_check_all_records_every_check_then_fails_once_with_every_miss(tmp_path):
    recorder = Recorder(tmp_path / "results.json")
    recorder.current_test = "t.py::t"
    checks = [
        Check("a", 1.0, "x", 2.0, hint="first miss"),
        Check("b", 5.0, "x", 2.0),
        Check("c", 3.0, "x"),
        Check("d", 9.0, "s", 1.0, "<=", hint="second miss"),
        Check("e", math.nan, "fraction", 0.4, hint="MFU was not measured"),
    ]
    with pytest.raises(ThresholdFailure) as failed:
        recorder.check_all(checks, footer="a table both misses share")
    lines = str(failed.value).splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [
        "a",
        "d",
        "NOT MEASURED",
    ]  # misses, then the unmeasured
    assert lines[2].startswith("NOT MEASURED: e: measured n/a")
    assert lines[-1] == "a table both misses share"
    assert [m.metric for m in recorder.measurements] == ["a", "b", "c", "d", "e"]
    assert all(m.test_id == "t.py::t" and isinstance(m, Check) for m in recorder.measurements)
    data = json.loads(recorder.path.read_text())
    assert [m["verdict"] for m in data["measurements"]] == ["fail", "pass", "info", "fail", "fail"]
    assert data["measurements"][4]["value"] is None and data["schema_version"] == SCHEMA_VERSION


def test_only_unmeasured_thresholds_fail_as_not_measured(tmp_path):
    recorder = Recorder(tmp_path / "results.json")
    with pytest.raises(NotMeasured, match="expected at least 40%") as failed:
        recorder.check_all([Check("a", 1.0, "x", 0.5), Check("sft.mfu", math.nan, "fraction", 0.4)])
    assert not isinstance(failed.value, ThresholdFailure)
    assert len(recorder.check_all([Check("a", 1.0, "x", 0.5)])) == 1  # all pass: no error


def test_a_measurement_is_a_check_with_its_test_and_time():
    check = Check("a", 1.0, "x", 0.5, ref=BUSBW, labels={"rank": 0}, hint="h")
    measurement = Measurement.of(check, test_id="t.py::t", time=12.5)
    assert isinstance(measurement, Check) and measurement.key == check.key
    assert Measurement.from_json(json.loads(json.dumps(measurement.to_json()))) == measurement


def test_record_and_check_keep_the_one_value_api_for_tests_of_ones_own(tmp_path):
    recorder = Recorder(tmp_path / "results.json")
    recorder.record("demo.value", 3.0, unit="x", labels={"k": 1})
    with pytest.raises(ThresholdFailure, match=r"demo\.busbw: measured 1 GB/s, expected at least 2 GB/s"):
        recorder.check("demo.busbw", 1e9, 2e9, unit="B/s")
    assert [m.verdict for m in recorder.measurements] == ["info", "fail"]


def test_a_check_that_could_not_be_judged_always_fails_and_says_why():
    broken = Check(
        "fabric.busbw", 9e12, "B/s", 1e9, problem="broken measurement", hint="above the PCIe ceiling"
    )
    assert broken.failed and broken.measured and not broken.judged  # the value passes its floor, still fails
    assert broken.verdict_label == "BROKEN MEASUREMENT"
    assert failure_message(broken).startswith("BROKEN MEASUREMENT: fabric.busbw: measured 9000 GB/s")
    absent = Check("sft.mfu", math.nan, "fraction", 0.4, hint="no rank reported it")
    assert absent.problem == "not measured" and absent.verdict_label == "NOT MEASURED"
    assert failure_message(absent).startswith("NOT MEASURED: sft.mfu: measured n/a, expected at least 40%")
    assert Check("x", math.nan, "s").verdict == "info"  # no threshold: nothing to judge, nothing missing
    with pytest.raises(ValueError, match="problem must be one of"):
        Check("x", 1.0, "s", 2.0, problem="flaky")  # type: ignore[arg-type]


def test_problems_round_trip_through_results_json_and_older_files_still_read(tmp_path):
    recorder = Recorder(tmp_path / "results.json")
    with pytest.raises(NotMeasured) as failed:
        recorder.check_all(
            [
                Check("a", 1.0, "x", 0.5),
                Check("b", 5.0, "x", 1.0, problem="broken measurement", hint="above ceiling"),
                Check("c", math.nan, "x", 1.0, ref=BUSBW),
            ]
        )
    assert [line.split(":")[0] for line in str(failed.value).splitlines()] == [
        "BROKEN MEASUREMENT",
        "NOT MEASURED",
    ]
    data = json.loads(recorder.path.read_text())
    rows = data["measurements"]
    assert [r.get("problem") for r in rows] == [None, "broken measurement", "not measured"]
    assert [r["verdict"] for r in rows] == ["pass", "fail", "fail"]
    back = [Measurement.from_json(r) for r in rows]
    assert back[:2] == recorder.measurements[:2]
    assert (back[2].key, back[2].ref, back[2].problem) == ("c||", BUSBW, "not measured")
    # a version-2 row (no "problem" key): a null value under a threshold still reads as not measured
    old = {k: v for k, v in rows[2].items() if k != "problem"}
    assert Measurement.from_json(old).problem == "not measured"
    with pytest.raises(ValueError, match="problem must be one of"):
        Measurement.from_json({**rows[1], "problem": "odd"})


def test_the_summary_shows_a_problem_in_the_verdict_column(tmp_path):
    from pytest_gpucluster.results.summary import measurement_rows

    rows = measurement_rows(
        [
            Measurement.of(Check("a", 1.0, "x", 0.5), test_id="t", time=0.0),
            Measurement.of(Check("b", math.nan, "x", 0.5), test_id="t", time=0.0),
        ]
    )
    assert [r[0] for r in rows] == ["NOT MEASURED", "PASS"]
