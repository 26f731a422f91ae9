"""The real acceptance suite under pytest-xdist (-n 2): each before/after pair (fabric ports, ECC/XID
counters) runs in one worker (acceptance/conftest.py switches --dist load to loadgroup), so the
after test measures instead of skipping; the reading goes through the results directory
(results/handoff.py). Without its before test in the run, the after test fails NOT MEASURED saying
so instead of a silent skip (shown here by deselecting the before test). The pairwise burn-in's
join with the fabric before-scan across workers: tests/integration/test_fabric_join_xdist.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, results

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "pytest", "acceptance/test_fabric.py",
            "-n", "2", "-p", "no:cacheprovider", "--hw=cpu-local",
            f"--results-dir={out}", "-q", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    found = sorted(out.rglob("results.json"))
    return done, json.loads(found[-1].read_text()) if found else {}


def test_before_and_after_run_in_one_worker_under_n_2(tmp_path):
    done, data = _run(tmp_path, "-k", "fabric_before or fabric_after")
    outcomes = {o["test_id"].split("@")[0]: o for o in data.get("outcomes", [])}
    after = outcomes.get("acceptance/test_fabric.py::test_fabric_after")
    assert after is not None, done.stdout[-2000:] + done.stderr[-2000:]
    assert after["outcome"] == "passed", after
    assert any(m["metric"].startswith("fabric.") for m in data["measurements"])


def test_an_after_test_without_its_before_reading_fails_not_measured_never_skips(
    pytester, tmp_path, monkeypatch
):
    files = {"test_fabric": REPO / "acceptance" / "test_fabric.py"}
    run = acceptance_run(pytester, monkeypatch, tmp_path, files, "--hw=cpu-local",
                         conftest=REPO / "acceptance" / "conftest.py")  # fmt: skip
    result = run("test_fabric.py", "-k", "fabric_after", "--tb=no")
    outcomes = {o["test_id"]: o for o in results(tmp_path)["outcomes"]}
    after = outcomes["test_fabric.py::test_fabric_after"]
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert after["outcome"] == "failed" and "NOT MEASURED: no before-reading" in after["message"]
    assert "test_fabric_before is not among this run's tests (deselected" in after["message"]
