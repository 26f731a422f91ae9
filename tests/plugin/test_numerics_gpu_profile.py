"""acceptance/test_numerics.py under a GPU profile on a machine without a GPU: every test skips,
naming the node and what it lacks (the module asks acceptance/conftest.py for CUDA on the nodes), and
the dry run plans the GPU job with cuBLAS's workspace setting and a deadline for five dtypes."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, results
from node_fakes import use_machine

from pytest_gpucluster.profiles.detect import MachineInfo

ACCEPTANCE = Path(__file__).resolve().parents[2] / "acceptance"
WHY = "no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*)"
NO_GPU = MachineInfo(hostname="testhost", cuda_available=False, reasons={"cuda": WHY, "nccl": WHY})
TESTS = (
    "test_numerics_agreement",
    "test_numerics_repeat_stability",
    "test_numerics_known_answer",
    "test_numerics_throughput",
    "test_injected_corruption_is_named",
)


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    use_machine(monkeypatch, NO_GPU)
    files = {"test_numerics": ACCEPTANCE / "test_numerics.py"}
    return acceptance_run(pytester, monkeypatch, tmp_path, files, conftest=ACCEPTANCE / "conftest.py")


def test_a_gpu_profile_on_a_machine_without_cuda_skips_every_numerics_test_saying_why(run, tmp_path):
    run("--hw=h200-sxm").assert_outcomes(skipped=5)
    outcomes = results(tmp_path)["outcomes"]
    skipped = {o["test_id"].rpartition("::")[2]: o["message"] for o in outcomes if o["outcome"] == "skipped"}
    assert sorted(skipped) == sorted(TESTS)
    assert all(f"needs cuda: node testhost: lists no GPU ({WHY})" in m for m in skipped.values()), skipped
    # a GPU profile's node without a GPU is not a capability the cluster lacks: its floors fail closed
    [closed] = [o for o in outcomes if o["test_id"] == "gpucluster::every-threshold-measured"]
    assert closed["category"] == "not measured" and "numerics.min_flops" in closed["message"]


def test_the_dry_run_plans_the_gpu_job_with_the_cublas_workspace_and_five_dtypes(run, monkeypatch):
    gpu = MachineInfo(
        hostname="testhost",
        cuda_available=True,
        gpu_names=("NVIDIA H200",) * 8,
        reasons={},
    )
    use_machine(monkeypatch, gpu)
    result = run("--hw=h200-sxm", "--gpucluster-dry-run", "-s", "-v")
    out = result.stdout.str()
    row = next((line for line in out.splitlines() if "numerics " in line and "1 x 8" in line), None)
    assert row is not None, out
    assert "60 s set-up x 5 dtypes" in out
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in out
