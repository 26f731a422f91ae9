"""checks/burnin/dcgm.py on real ``dcgmi diag`` runs (tests/data/dcgm, SOURCES.md there).

JSON of three real runs — DCGM 3.1.0 on 8 healthy GPUs, DCGM 4.2.3 level 1 on a GB10 whose
``software`` test failed GPU 0, DCGM 4.5.2 level 2 on the same GB10 (memory and pcie pass, software
fails) — plus NVIDIA's NVVS 1.3 fixture (one result for 4 GPUs, three named) and text tables.
Variants (a Warn, a runtime error) are built in the test from a real file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.checks.burnin.dcgm import diag_checks, missing_check, node_reports
from pytest_gpucluster.parsers.dcgm_diag import parse_dcgm_diag

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm"
PASS_31 = "diag_3.1.0_8gpu_pass_nulls_banner_dcgm_repo.json"
FAIL_423 = "diag_4.2.3_gb10_software_fail.json"
LEVEL2_452 = "diag_4.5.2_gb10_level2_memory_pcie_pass_software_fail_glimmer.json"


def report(name: str):
    return parse_dcgm_diag((DATA / name).read_text(encoding="utf-8"), name)


def failed(verdict) -> list[tuple[str, str, str]]:
    return [(c.labels["node"], c.labels["gpu"], c.labels["test"]) for c in verdict.checks if c.failed]


def test_a_healthy_8gpu_run_is_one_passing_check_per_gpu_and_test():
    verdict = diag_checks("dgx-03", report(PASS_31), level=3)
    assert not failed(verdict) and not verdict.suspects and not verdict.warnings
    gpus = {c.labels["gpu"] for c in verdict.checks}
    assert gpus == {str(i) for i in range(8)}
    assert {c.labels["status"] for c in verdict.checks} == {"Pass"}
    assert all(c.threshold == 0.0 and c.comparison == "<=" for c in verdict.checks)
    tests = {c.labels["test"] for c in verdict.checks}
    assert {"Denylist", "software"} <= tests and len(tests) == 10
    pairs = [(c.labels["gpu"], c.labels["test"]) for c in verdict.checks]
    assert len(pairs) == len(set(pairs)) == 10 * 8  # every GPU once per test, gpu_ids lists split


@pytest.mark.parametrize("name", [FAIL_423, LEVEL2_452])
def test_a_failing_gpu_of_a_real_run_is_named_with_the_test_and_dcgms_reason(name):
    verdict = diag_checks("spark-1", report(name), level=2)
    assert failed(verdict) == [("spark-1", "0", "software")]
    (fail,) = [c for c in verdict.checks if c.failed]
    assert fail.hint.startswith(
        "dcgmi diag -r 2 on node spark-1: test 'software' (Deployment) Fail on GPU 0:"
    )
    assert "Persistence mode for GPU 0 is disabled" in fail.hint and "DCGM error id 29" in fail.hint
    (suspect,) = verdict.suspects
    assert (suspect.kind, suspect.node, suspect.gpu, suspect.check) == ("gpu", "spark-1", "GPU 0", "dcgm")
    assert suspect.drainable


def test_the_level2_run_passes_its_memory_and_pcie_tests():
    verdict = diag_checks("spark-1", report(LEVEL2_452), level=2)
    statuses = {(c.labels["test"], c.labels["status"]) for c in verdict.checks}
    assert statuses == {("software", "Fail"), ("memory", "Pass"), ("pcie", "Pass")}


def test_one_result_for_several_gpus_fails_only_the_gpus_its_warnings_name():
    """NVVS 1.3 (DCGM 2.x): sm_stress FAIL for gpu_ids 0,1,2,3; the warnings name GPUs 0, 2 and 3."""
    verdict = diag_checks("n2", report("diag_nvvs1.3_4gpu_sm_stress_fail_vendor_fixture.json"), level=3)
    assert failed(verdict) == [("n2", "0", "sm_stress"), ("n2", "2", "sm_stress"), ("n2", "3", "sm_stress")]
    gpu1 = next(c for c in verdict.checks if c.labels["test"] == "sm_stress" and c.labels["gpu"] == "1")
    assert gpu1.labels["status"] == "Fail (blamed on GPU 0, 2, 3)" and gpu1.threshold is None


def test_text_tables_give_the_same_checks():
    verdict = diag_checks(
        "bad-node", report("diag_text_3.x_8gpu_gpu0_memory_fail_excerpt_mlengineering.txt"), 3
    )
    assert failed(verdict) == [("bad-node", "0", "GPU Memory")]
    whole = diag_checks("b200", report("diag_text_4.4.1_b200x8_pcie_fail_slurm_issue253.txt"), 3)
    assert failed(whole) == [("b200", "all", "pcie")]  # a test failure DCGM blames on no GPU
    assert [s.kind for s in whole.suspects] == ["node"]


def test_a_warn_is_recorded_and_warned_not_failed():
    text = (
        (DATA / LEVEL2_452).read_text(encoding="utf-8").replace('"status" : "Pass"', '"status" : "Warn"', 1)
    )
    verdict = diag_checks("spark-1", parse_dcgm_diag(text, "variant"), level=2)
    warn = next(c for c in verdict.checks if c.labels["status"] == "Warn")
    assert warn.threshold is None and not warn.failed and warn.labels["test"] == "memory"
    assert verdict.warnings == (warn.hint,) and "Allocated 112427837082 bytes" in warn.hint


def test_a_runtime_error_fails_the_node():
    text = json.dumps(
        {"DCGM GPU Diagnostic": {"runtime_error": "Unable to set up the GPUs for the diagnostic"}}
    )
    verdict = diag_checks("n5", parse_dcgm_diag(text, "variant"), level=2)
    assert failed(verdict) == [("n5", "all", "(runtime)")]
    assert "could not run its tests: Unable to set up" in verdict.checks[0].hint


def test_node_reports_tell_missing_broken_and_parsed_nodes_apart():
    values = [
        {"host": "a", "available": True, "returncode": 226, "stdout": (DATA / FAIL_423).read_text(), "stderr": ""},
        {"host": "b", "available": False, "reason": "'dcgmi' is not on PATH on b (DCGM is not installed there)"},
        {"host": "c", "available": True, "returncode": 255, "stdout": "", "stderr": "Error: unable to establish a connection to the specified host: localhost"},
        {"host": "d", "available": True, "error": "'dcgmi diag -r 3 -j' did not finish within 600 s", "returncode": None},
    ]  # fmt: skip
    found = node_reports(values)
    assert [n for n, _ in found.reports] == ["a"]
    assert found.missing == (("b", values[1]["reason"]),)
    broken = {c.labels["node"]: c for c in found.broken}
    assert set(broken) == {"c", "d"} and all(c.failed for c in broken.values())
    assert "unable to establish a connection" in broken["c"].hint and "nv-hostengine" in broken["c"].hint
    assert "did not finish within 600 s" in broken["d"].hint
    gap = missing_check("b", values[1]["reason"])
    assert gap.failed and "node b's GPUs were not diagnosed" in gap.hint
