"""Fail closed on the real suite: acceptance/test_burnin.py's CPU health test launches its job for
real, which is cut off by --job-timeout before it measures anything; the profile's two CPU
health thresholds then fail as NOT MEASURED at the end of the session, naming the test that ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, results

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance"


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    files = {"test_burnin": ACCEPTANCE / "test_burnin.py"}
    return acceptance_run(
        pytester, monkeypatch, tmp_path, files, "--hw=cpu-local", conftest=ACCEPTANCE / "conftest.py"
    )


def test_thresholds_whose_test_ran_and_measured_nothing_fail_as_not_measured(run, tmp_path):
    result = run("test_burnin.py", "-k", "rank_health_cpu", "--job-timeout=1", "--tb=no")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = results(tmp_path)
    outcomes = {o["test_id"]: o for o in data["outcomes"]}
    assert outcomes["test_burnin.py::test_rank_health_cpu"]["category"] == "infrastructure"
    closed = outcomes["gpucluster::every-threshold-measured"]
    assert (closed["outcome"], closed["category"]) == ("failed", "not measured")
    rows = [m for m in data["measurements"] if m["test_id"] == "gpucluster::every-threshold-measured"]
    assert sorted(m["ref"]["key_path"][1] for m in rows) == ["min_cpu_matmul", "min_cpu_memory_bandwidth"]
    assert all(m["problem"] == "not measured" and m["value"] is None and m["verdict"] == "fail" for m in rows)
    assert data["thresholds"]["not_measured"] == ["burnin.min_cpu_matmul", "burnin.min_cpu_memory_bandwidth"]
    assert "sft.cases[0].max_step_time" in data["thresholds"]["not_run"]  # deselected: listed, not failed
    result.stdout.fnmatch_lines(
        [
            "NOT MEASURED (a threshold the profile sets had no value, or a broken measurement): 1",
            "*NOT MEASURED*profile.burnin.min_cpu_matmul*n/a*>= 0.028 TFLOP/s*",
            "thresholds not run in this selection: *",
            "NOT MEASURED: 2 threshold(s) the profile sets had no value: burnin.min_cpu_matmul, burnin.min_cpu_memory_bandwidth",
        ]
    )
