"""A job that fails fails its test, and a job that skips skips it — even when the test never looks at
the result (real 2-rank torchrun jobs, run through pytester in a subprocess)."""

from __future__ import annotations

import socket

import pytest

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

CARELESS_TESTS = """
def test_ignores_the_result(cluster):
    cluster.run("pytest_gpucluster.workloads.basic:fail_on_rank", options={"rank": 1}, timeout=120)

def test_a_job_every_rank_skips(cluster):
    cluster.run(
        "pytest_gpucluster.workloads.basic:skip_everywhere",
        options={"reason": "no NVML on this node"},
        timeout=120,
    )

def test_check_false_returns_the_result(cluster):
    job = cluster.run(
        "pytest_gpucluster.workloads.basic:fail_on_rank", options={"rank": 1}, timeout=120, check=False
    )
    assert [r.status for r in job.ranks] == ["ok", "error"]
"""


def test_a_raising_rank_fails_the_test_that_ignored_the_result(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
    pytester.makepyfile(test_careless=CARELESS_TESTS)
    result = pytester.runpytest_subprocess("-rs", "--hw=cpu-local", f"--results-dir={tmp_path / 'res'}")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    host = socket.gethostname()
    result.stdout.fnmatch_lines(
        [
            "*test_ignores_the_result*",
            f"*rank 1 on {host} raised RuntimeError: injected failure on rank 1*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["SKIPPED*test_careless.py:*: job *skipped on ranks 0, 1: no NVML on this node"]
    )
    result.stdout.fnmatch_lines(
        [
            "INFRASTRUCTURE ERRORS*: 1",
            f"  test_careless.py::test_ignores_the_result: *JobFailed: job fail-on-rank-* failed (1 of 2 ranks failed); first: rank 1 on {host} raised RuntimeError: injected failure on rank 1",
        ]
    )
    assert "result.py" not in result.stdout.str()  # the launcher's frames are hidden
