"""The DCGM job holds no CUDA context while ``dcgmi diag`` runs: its rank imports no torch and sets no
device, even under a CUDA (nccl) profile. Launched for real (torchrun, one local rank) with a stand-in
``dcgmi`` that prints a recorded real DCGM run. On this GPU-less machine a rank that picked a device
would fail ("found no CUDA device"), so the job passing is itself the proof that none was picked."""

from __future__ import annotations

import os
import stat

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.plans import burnin as plans

DCGM_RUN = "diag_4.5.2_gb10_level2_memory_pcie_pass_software_fail_glimmer.json"


def test_the_dcgm_job_of_a_cuda_profile_imports_no_torch_and_picks_no_gpu(tmp_path, monkeypatch):
    recorded = os.path.join(os.path.dirname(__file__), "..", "data", "dcgm", DCGM_RUN)
    dcgmi = tmp_path / "bin" / "dcgmi"
    dcgmi.parent.mkdir()
    dcgmi.write_text(f'#!/bin/sh\ncat "{recorded}"\nexit 226\n')
    dcgmi.chmod(dcgmi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{dcgmi.parent}{os.pathsep}{os.environ['PATH']}")
    spec = ClusterSpec.from_local(1, "nccl")
    cluster = Cluster(spec, get_launcher("torchrun"), tmp_path / "jobs")
    result = cluster.run(
        plans.DCGM, options=plans.dcgm_options(2, 60.0), nproc_per_node=1, timeout=120,
        init_process_group=False, pick_device=False, name="burnin-dcgm",
    )  # fmt: skip
    [value] = result.values
    assert value["available"] and value["returncode"] == 226 and '"DCGM Diagnostic"' in value["stdout"][:200]
    assert value["torch_in_rank"] is False
    assert result.ranks[0].gpu is None  # no device taken, no UUID recorded
