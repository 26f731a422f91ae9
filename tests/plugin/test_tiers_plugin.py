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
