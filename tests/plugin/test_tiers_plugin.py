"""Tiers as markers (pytester, and the real acceptance suite collected): ``-m quick`` selects the
quick tests, ``-m standard`` what a plain run does (the quick ones too, never the slow burn-in
parts), the run's tier and its durations are in the header and in results.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TIERED = """
import pytest

@pytest.mark.quick
def test_quick(results):
    results.record("demo.quick", 1.0, unit="s")

def test_plain(results):
    results.record("demo.plain", 1.0, unit="s")

@pytest.mark.burnin(slow=True)
def test_slow_burnin(results):
    results.record("demo.slow", 1.0, unit="s")
"""


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
    pytester.makepyfile(test_tiered=TIERED)

    def _run(*args):
        result = pytester.runpytest_inprocess(
            "--hw=cpu-local", f"--results-dir={tmp_path / 'res'}", "-v", *args
        )
        return result, json.loads((tmp_path / "res" / "results.json").read_text())

    return _run


def _ran(result) -> set[str]:
    return {
        line.split("::")[1].split()[0] for line in result.outlines if "::test_" in line and "PASSED" in line
    }


def test_quick_selects_the_quick_tests_and_says_its_durations(run):
    result, data = run("-m", "quick")
    assert _ran(result) == {"test_quick"}
    result.stdout.fnmatch_lines(["gpucluster: tier quick: sweeps: checked sizes only (built-in defaults)"])
    assert data["tier"]["name"] == "quick" and data["tier"]["sweep"] == "checked"


def test_standard_is_what_a_plain_run_selects(run):
    standard, data = run("-m", "standard")
    plain, plain_data = run()
    assert _ran(standard) == _ran(plain) == {"test_quick", "test_plain"}
    plain.stdout.fnmatch_lines(["gpucluster: 1 slow burn-in test(s) deselected (pairwise localization); *"])
    assert data["tier"]["name"] == plain_data["tier"]["name"] == "standard"


def test_burnin_takes_the_burnin_durations_and_the_slow_parts(run):
    result, data = run("-m", "burnin")
    assert _ran(result) == {"test_slow_burnin"}
    assert data["tier"]["name"] == "burnin" and data["tier"]["sweep"] == "grid"


def test_the_quick_tier_of_the_acceptance_suite():
    """What ``pytest acceptance/ -m quick`` runs: inventory, NCCL init, short health and numerics,
    the intra-node all_reduce; no other collective, no training, no soak, no inter-node scope."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--hw=cpu-local", "-m", "quick", "--confcutdir=acceptance"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    files = {line.split("::")[0].removeprefix("acceptance/") for line in ids}
    assert {"test_inventory.py", "test_burnin.py", "test_collectives.py", "test_nccl.py"} <= files
    assert not files & {"test_sft.py", "test_scaling.py", "test_fabric.py"}
    collectives = [line.split("::")[1] for line in ids if line.startswith("acceptance/test_collectives.py")]
    assert collectives == ["test_collective[all_reduce-intra-node]"]
    assert "acceptance/test_burnin.py::test_rank_health_cpu" in ids
    assert "acceptance/test_burnin.py::test_pairwise_localization" not in ids


def _acceptance(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/", "-p", "no:cacheprovider", "-p", "no:xdist", "-s",
         "--confcutdir=acceptance", "--gpucluster-dry-run", f"--results-dir={tmp_path / 'r'}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_dry_run_of_8_gpu_nodes_is_a_table_with_a_total_and_no_environment(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu{i:02d} slots=8\n" for i in range(1, 9)))
    done = _acceptance(tmp_path, "--hw=h200-spectrumx", f"--hostfile={hosts}", "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = done.stdout
    assert (
        "[dry run] plan for 8 node(s) (hostfile " in out and "from profile h200-spectrumx's node shape" in out
    )
    header = next(line for line in out.splitlines() if "NODES x RANKS" in line)
    assert header.split()[2:] == ["JOB", "NODES", "x", "RANKS", "TIER", "ESTIMATED", "RUN", "DEADLINE"]
    rows = {
        line.split()[2]: line.split() for line in out.splitlines() if line.strip().startswith("[dry run]   ")
    }
    assert rows["burnin-health"][3:6] == ["8", "x", "8"] and rows["burnin-health"][6] == "quick"
    assert rows["collectives-all_reduce-inter-node"][3:7] == ["2", "x", "8", "standard"]
    assert "[dry run]   estimated total: " in out and "[dry run]   by tier (" in out
    assert "GPUCLUSTER_JOB_ID=" not in out  # the environment only with -v
    plan = json.loads((tmp_path / "r" / "results.json").read_text())["plan"]
    assert plan["total_s"] > 0 and plan["tiers"]["quick"] < plan["tiers"]["standard"] == plan["total_s"]
    assert {j["name"] for j in plan["jobs"]} >= {"node-probe", "burnin-health", "burnin-counters-before"}


def test_a_laptop_plans_from_the_profile_and_a_budget_refuses_naming_the_costliest(tmp_path):
    """No GPU here, no hostfile: the quick tier of an 8-GPU profile is still planned (from its node
    shape), and a 1-minute budget refuses it before any launch."""
    done = _acceptance(tmp_path, "--hw=h200-spectrumx", "-m", "quick", "--gpucluster-budget=1m")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-3000:] + done.stderr[-2000:]
    assert "this machine has no GPU to probe for profile h200-spectrumx" in done.stdout
    assert "[dry run]   burnin-health " in done.stdout
    said = done.stderr.strip().splitlines()[-1]
    assert "exceeds --gpucluster-budget 60 s (from command line)" in said, said
    assert "Costliest: burnin-health + collectives-all_reduce-intra-node " in said, said  # one launch


ONE_JOB = """
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part


@job_part
def noop_job(session, params):
    return Part("noop", "pytest_gpucluster.workloads.basic:noop", timeout_s=120, estimate_s=30.0, startup_s=20.0)


def test_noop(noop_job, results):
    results.record("demo.ran", 1.0, unit="x")
"""


def test_results_json_keeps_the_plan_and_each_jobs_real_time_beside_its_estimate(
    pytester, tmp_path, monkeypatch
):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
    pytester.makepyfile(test_one_job=ONE_JOB)
    result = pytester.runpytest_inprocess("--hw=cpu-local", f"--results-dir={tmp_path / 'res'}")
    result.assert_outcomes(passed=1)
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    [planned] = data["plan"]["jobs"]
    assert (planned["name"], planned["estimate_s"], planned["tier"]) == ("noop", 30.0, "standard")
    [ran] = data["jobs"]
    assert ran["parts"] == ["noop"] and ran["status"] == "ok" and ran["job_id"].startswith("noop-")
    assert (ran["estimate_s"], ran["deadline_s"]) == (30.0, 120.0)
    assert 0 < ran["actual_s"] < 120
