"""The preflight on recorded nodes: this machine plays a node whose GPUs are a real recorded
``nvidia-smi`` (8 x H200, or one H200 passed through to a VM) and whose interfaces are a recorded
sysfs with ``eth0`` only (`recorded_nodes`); `cuda_torch_standin` makes the probe's torch able to
use them. pytest runs the real suite, ``acceptance/``, in a subprocess:

- ``--hw=auto`` picks the H200 *part* profile, with no site's NCCL environment, and the dry run
  plans 8 ranks; on the 1-GPU node it is shaped to one GPU and plans single-GPU jobs;
- ``--hw=h200-spectrumx`` (a site profile asking for ``bond0`` and ``=mlx5_0,mlx5_1``) stops before
  any job is launched, listing every finding with what the node has; the dry run shows the same;
- ``--nproc-per-node 2`` on the 1-GPU node is refused before any launch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from recorded_nodes import ETH0_SYSFS, H200_1GPU_TABLE, H200_TABLE, RecordedNodes

REPO = Path(__file__).parents[2]
HERE = Path(__file__).parent
PLAN = re.compile(r"\[dry run\]\s+(?P<part>[a-z][\w.-]+)\s+(?P<nodes>\d+) x (?P<ranks>\d+)\s")
"""A job row of the dry run's plan table: ``[dry run]   burnin-health   1 x 8   quick ...``."""


def _run(
    tmp_path: Path, table: Path, *args: str, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    nodes = RecordedNodes(tmp_path / "recorded")
    nodes.add(socket.gethostname(), table.read_text(), sysfs=ETH0_SYSFS)
    results = tmp_path / "results"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "NCCL_", "PYTEST_"))
    }
    env |= {
        **nodes.env(env["PATH"]),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]),
        **(extra_env or {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/", *args, f"--results-dir={results}",
         "-p", "cuda_torch_standin", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-s"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done, results


def _header(results: Path) -> dict:
    return json.loads((results / "results.json").read_text())


def test_auto_on_eight_h200_with_eth0_only_picks_the_part_profile_and_no_site_environment(tmp_path):
    # The recorded node has three python3 processes on GPU 0 (the inventory fails on those, rightly)
    done, results = _run(tmp_path, H200_TABLE, "--hw=auto", "--gpucluster-dry-run", "-k", "not foreign")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    data = _header(results)
    assert data["profile"]["name"] == "h200-sxm"
    assert (
        data["profile"]["reason"]
        == "auto: GPU 'NVIDIA H200' is h200-sxm (H200 SXM): its part profile h200-sxm"
    )
    assert "NCCL_SOCKET_IFNAME" not in data["nccl_env"] and "NCCL_IB_HCA" not in data["nccl_env"]
    assert data["preflight"]["findings"] == [] and "[dry run] preflight:" not in out
    plans = [m.groupdict() for line in out.splitlines() if (m := PLAN.search(line))]
    assert plans and {p["ranks"] for p in plans if p["part"].startswith("burnin-health")} <= {"8"}
    assert "NCCL_SOCKET_IFNAME" not in out


def test_a_site_profile_asking_for_bond0_stops_before_any_launch_naming_every_finding(tmp_path):
    done, results = _run(tmp_path, H200_TABLE, "--hw=h200-spectrumx")
    out = done.stdout + done.stderr
    host = socket.gethostname()
    assert done.returncode == 1, out[-4000:]
    findings = [
        f"{host}: NCCL_SOCKET_IFNAME=bond0 matches no interface (has eth0, lo); NCCL's bootstrap fails at "
        "init on every job (profile h200-spectrumx: nccl_env)",
        f"{host}: NCCL_IB_HCA==mlx5_0,mlx5_1 names mlx5_0, which this node does not have (has no RDMA device",
        f"{host}: NCCL_IB_HCA==mlx5_0,mlx5_1 names mlx5_1, which this node does not have",
    ]
    for finding in findings:
        assert f"gpucluster preflight: ERROR {finding}" in out, out[-4000:]
    assert "3 finding(s) on 1 node(s)" in out and "stopping before any job is launched" in out
    data = _header(results)
    assert [f["requirement"] for f in data["preflight"]["findings"]] == [
        "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_HCA"
    ]  # fmt: skip
    assert [o["test_id"] for o in data["outcomes"]] == ["gpucluster::preflight"]
    assert data["outcomes"][0]["outcome"] == "failed" and "nothing launched" in data["outcomes"][0]["message"]
    assert not (results / "jobs").exists()  # not one job, not even started

    # The dry run shows the same findings and carries on (its inventory fails too: 1 node of 8, no RoCE)
    dry, _ = _run(tmp_path / "dry", H200_TABLE, "--hw=h200-spectrumx", "--gpucluster-dry-run")
    assert f"[dry run] preflight: ERROR {findings[0]}" in dry.stdout
    assert "a run would stop here" in dry.stdout


def test_auto_on_a_one_gpu_h200_plans_single_gpu_jobs_with_h200_floors(tmp_path):
    # NVIDIA's images set NCCL_VERSION (the H200 run's said 2.28.3 while torch loaded 2.28.9)
    image = {"NCCL_VERSION": "2.28.3"}
    done, results = _run(
        tmp_path, H200_1GPU_TABLE, "--hw=auto", "--gpucluster-dry-run", "-W", "error", extra_env=image
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "not an NCCL environment variable" not in out  # no warning about the image's variable
    assert (
        f"[dry run] preflight: INFO {socket.gethostname()}: torch loaded NCCL 2.28.9; the environment's "
        "NCCL_VERSION=2.28.3 (set by the container image, not read by NCCL) names a different release"
    ) in out
    data = _header(results)
    assert data["profile"]["reason"].endswith(
        "its part profile h200-sxm; shaped to the probed nodes: 1 node(s) x 1 GPU(s) (the part profile says 1 x 8)"
    )
    assert [f["severity"] for f in data["preflight"]["findings"]] == ["info"]
    plans = [m.groupdict() for line in out.splitlines() if (m := PLAN.search(line))]
    assert plans and {p["ranks"] for p in plans} == {"1"} and {p["nodes"] for p in plans} == {"1"}, plans


def test_two_ranks_on_a_one_gpu_node_are_refused_before_launch(tmp_path):
    done, results = _run(tmp_path, H200_1GPU_TABLE, "--hw=auto", "--nproc-per-node=2")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    host = socket.gethostname()
    assert (
        f"gpucluster preflight: ERROR {host}: 2 ranks per node asked (--nproc-per-node from command line), "
        "1 GPU present" in out
    ), out[-4000:]
    assert not (results / "jobs").exists()
