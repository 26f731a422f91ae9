"""The regression gate wired into pytest: ``--baseline`` gates each test's values as they are
recorded (in every xdist worker too), the profile's ``regression:`` tolerances and
``--max-regression`` reach it, ``--regression-gate warn`` only warns, and the run's settings are
stored for ``gpucluster compare``. (The gate on the real suite: tests/integration/test_regression_gate.py.)"""

from __future__ import annotations

import json

import pytest
from recorded_warnings import warnings_of

PROFILE = """\
name: gated
description: cpu-local with a regression section
extends: cpu-local
regression:
  tolerances:
    - {metric: "demo.busbw", tolerance: 10%, source: "the test's own"}
    - {metric: "demo.noisy", tolerance: off, source: "the test's own"}
"""

SOURCE = """
import os

VALUE = float(os.environ["DEMO_BUSBW"])


def test_one(results):
    Check = type_of_check()
    results.check_all([Check("demo.busbw", VALUE, "B/s", 1.0, labels={"size_bytes": 1}),
                       Check("demo.noisy", VALUE, "B/s", 1.0, labels={"size_bytes": 1})])


def test_two(results):
    again = lambda suspects: [type(s)(s.metric, float(os.environ["DEMO_AGAIN"]), s.unit, s.threshold,
                                     labels=s.labels) for s in suspects]
    results.check_all([type_of_check()("demo.busbw", VALUE, "B/s", 1.0, labels={"size_bytes": 2})], remeasure=again)


def test_three(results):
    results.check("demo.other", float(os.environ["DEMO_OTHER"]), 1.0, unit="B/s")  # no profile rule


def type_of_check():
    from pytest_gpucluster.results.model import Check
    return Check
"""


@pytest.fixture
def gate(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gated.yaml").write_text(PROFILE)
    pytester.makepyfile(test_demo=SOURCE)

    def run(name, busbw, again=None, *args, other=100.0, subprocess=False):
        monkeypatch.setenv("DEMO_BUSBW", str(busbw))
        monkeypatch.setenv("DEMO_AGAIN", str(again if again is not None else busbw))
        monkeypatch.setenv("DEMO_OTHER", str(other))
        argv = (
            "--hw=gated",
            f"--thresholds-dir={tmp_path / 'profiles'}",
            f"--results-dir={tmp_path / name}",
            *args,
        )
        result = pytester.runpytest_subprocess(*argv) if subprocess else pytester.runpytest_inprocess(*argv)
        return result, json.loads((tmp_path / name / "results.json").read_text())

    return run


def test_a_drop_beyond_the_profiles_tolerance_fails_and_an_off_metric_never_does(gate, tmp_path):
    first, _ = gate("first", 100.0)
    first.assert_outcomes(passed=3)
    baseline = f"--baseline={tmp_path / 'first' / 'results.json'}"
    same, data = gate("same", 95.0, None, baseline)  # 5% down: inside the profile's 10%
    same.assert_outcomes(passed=3)
    assert data["regression"]["tolerances"]["rules"][0] == {
        "pattern": "demo.busbw",
        "tolerance": 0.1,
        "source": "profile gated: regression.tolerances[0]",
    }
    slow, data = gate("slow", 50.0, 97.0, baseline)
    slow.assert_outcomes(passed=2, failed=1)  # test_two's confirmation (97) cleared it
    slow.stdout.fnmatch_lines(
        ["*RegressionFailure: REGRESSION demo.busbw (size_bytes=1): baseline 1e-07 GB/s*, measured 5e-08 GB/s: 50.0% below*",
         "*not confirmed: this test cannot re-measure*"]
    )  # fmt: skip
    outcomes = {o["test_id"].split("::")[-1]: o for o in data["outcomes"]}
    assert outcomes["test_one"]["category"] == "performance"
    assert "demo.noisy" not in outcomes["test_one"]["message"]  # off: compared, shown, never failed on
    changes = {(c["metric"], c["labels"].get("size_bytes")): c for c in data["baseline"]["changes"]}
    assert changes[("demo.noisy", 1)]["status"] == "info"
    assert changes[("demo.busbw", 2)]["first"] == 50.0 and changes[("demo.busbw", 2)]["new"] == 97.0
    assert not any(o["test_id"] == "gpucluster::baseline" for o in data["outcomes"])  # the tests said it


def test_max_regression_is_the_default_for_what_the_profile_does_not_name(gate, tmp_path):
    gate("first", 100.0)
    baseline = f"--baseline={tmp_path / 'first' / 'results.json'}"
    strict, _ = gate("strict", 100.0, None, baseline, other=50.0)
    strict.assert_outcomes(passed=2, failed=1)  # demo.other: -50% against the default 5%
    strict.stdout.fnmatch_lines(
        ["*REGRESSION demo.other*allowed 5% (tolerance from --max-regression, default)*"]
    )
    loose, data = gate("loose", 50.0, 50.0, baseline, "--max-regression=60%", other=50.0)
    loose.assert_outcomes(passed=1, failed=2)  # demo.other passes under 60%; demo.busbw keeps its 10%
    assert data["regression"]["tolerances"]["default"] == pytest.approx(0.6)
    assert data["regression"]["tolerances"]["source"] == "--max-regression, command line"


def test_warn_mode_reports_and_passes(gate, tmp_path):
    gate("first", 100.0)
    baseline = f"--baseline={tmp_path / 'first' / 'results.json'}"
    warned, data = gate("warned", 50.0, 50.0, baseline, "--regression-gate=warn")
    warned.assert_outcomes(passed=3)
    regressions = warnings_of(warned)
    assert [w.split(":")[0] for w in regressions] == ["REGRESSION demo.busbw (size_bytes=1)",
                                                       "REGRESSION demo.busbw (size_bytes=2)"], regressions  # fmt: skip
    warned.stdout.fnmatch_lines(["*WARNING: 2 regression(s), not failing (--regression-gate warn)*"])
    assert data["regression"]["mode"] == "warn"


def test_every_xdist_worker_gates_its_own_tests(gate, tmp_path):
    pytest.importorskip("xdist")
    gate("first", 100.0)
    baseline = f"--baseline={tmp_path / 'first' / 'results.json'}"
    result, data = gate("workers", 50.0, 50.0, baseline, "-n", "2", subprocess=True)
    result.assert_outcomes(passed=1, failed=2)
    categories = {o["test_id"].split("::")[-1]: o["category"] for o in data["outcomes"]}
    assert categories == {"test_one": "performance", "test_two": "performance", "test_three": "pass"}
    assert [m["attempt"] for m in data["measurements"] if m.get("attempt")] == [2]  # test_two confirmed
    assert all("REGRESSION demo.busbw" in o["message"] for o in data["outcomes"] if o["category"] != "pass")


def test_a_bad_gate_mode_is_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x(results):\n    pass\n")
    result = pytester.runpytest_inprocess("--regression-gate=maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--regression-gate: expected 'fail' or 'warn', got 'maybe' (from command line)*"]
    )
