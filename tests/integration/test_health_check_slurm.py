"""``gpucluster health-check`` as Slurm runs it (HealthCheckProgram / prolog: ``SLURMD_NODENAME``
set, this node alone), against the real local Slurm of test_slurm.py's ``slurm_cluster``:

- a healthy node: the quick tier's real jobs pass (under a copy of cpu-local whose floors a loaded
  test machine meets, `open_gates`: the plumbing is under test here, not the floors), exit 0, the
  node stays up;
- a node missing a GPU: a stand-in ``nvidia-smi`` replays a real 8 x H200 table with GPU 3 cut
  out (`recorded_nodes.without_gpu`), the probe's torch made CUDA-capable (``cuda_torch_standin``):
  the preflight stops the run, the check exits 1 with one line naming the 7 GPUs, and with
  ``--drain`` the node is drained in Slurm with that line as its reason.

Run under ``flock /work/slurm.lock`` beside other helpers (the fixture starts its own daemons).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from open_gates import open_gates_profile
from recorded_nodes import ETH0_SYSFS, H200_TABLE, RecordedNodes, without_gpu
from test_slurm import slurm_cluster  # noqa: F401 - the fixture

REPO = Path(__file__).parents[2]
HERE = Path(__file__).parent


def _health_check(node: str, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "PYTEST_"))}
    env |= {
        "SLURMD_NODENAME": node,  # as slurmd sets it for HealthCheckProgram and prologs
        "PATH": path,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest_gpucluster.cli", "health-check", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def _node(slurm_cluster) -> dict[str, str]:  # noqa: F811
    out = slurm_cluster.run("scontrol", "show", "node", slurm_cluster.node).stdout
    return dict(field.split("=", 1) for field in out.replace("\n", " ").split() if "=" in field)


def test_a_healthy_node_passes_and_a_node_missing_a_gpu_is_drained_with_the_reason(
    slurm_cluster,  # noqa: F811
    tmp_path,
):
    if shutil.which("scontrol", path=os.environ["PATH"]) is None:
        pytest.skip("scontrol is not installed here")
    node = slurm_cluster.node
    open_gates_profile(tmp_path / "profiles", "hc-node")
    healthy = _health_check(
        node, os.environ["PATH"], "--hw=hc-node", "--drain", "--", f"--thresholds-dir={tmp_path / 'profiles'}"
    )
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr[-3000:]
    [said] = healthy.stdout.strip().splitlines()
    assert re.fullmatch(rf"gpucluster health-check on {node}: quick tier passed \(\d+ test\(s\)\)", said), (
        said
    )
    assert "DRAIN" not in _node(slurm_cluster)["State"]

    recorded = RecordedNodes(tmp_path / "recorded")
    recorded.add(socket.gethostname(), without_gpu(H200_TABLE.read_text(), 3), sysfs=ETH0_SYSFS)
    sick_path = f"{recorded.bin}{os.pathsep}{os.environ['PATH']}"
    try:
        sick = _health_check(node, sick_path, "--hw=h200-sxm", "--drain", "--", "-p", "cuda_torch_standin")
        assert sick.returncode == 1, sick.stdout + sick.stderr[-3000:]
        [reason] = sick.stdout.strip().splitlines()
        assert reason.startswith(f"gpucluster health-check on {node}: preflight: ") and len(reason) <= 200, (
            reason
        )
        assert "7 GPUs present" in reason, reason
        drained = _node(slurm_cluster)
        assert "DRAIN" in drained["State"], drained
        shown = slurm_cluster.run("sinfo", "-h", "-R", "-o", "%E").stdout.strip()
        assert shown == reason[: len(shown)] and "7 GPUs present" in shown, (shown, reason)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
