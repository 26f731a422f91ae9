"""A GPU lost during the run, through the real suite: acceptance/test_burnin.py's counter readings
(test_counters_before, test_counters_after) under ``--hw=auto``, in a pytest of their own.

This machine has no GPU, so its node is described to the stand-in NVML (`standin_pynvml`: two H200s
with their PCI addresses) and a rank's torch sees the same two GPUs (`cuda_torch_standin_ranks`);
everything else is the suite's own: the per-node probe reads NVML and picks the H200 profile, the
counter jobs' ranks (workloads/health.py) find their GPU in NVML by PCI bus id, the after test
compares the readings (checks/burnin/lost.py), and the run writes its findings and sign-off.

Planted: right after test_counters_before passes, GPU 1 falls off the bus (its NVML answers
``NVMLError_GpuIsLost``). The run must fail ``burnin.gpus_lost``, name this host and that GPU with
"reset GPU" and the RMA wording, and sign NOT FIT. Healthy: the same run with both GPUs read again
passes that check and signs FIT.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from standin_pynvml import env as nvml_env
from standin_pynvml import gpus, write_node

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
BUSES = ["00000000:18:00.0", "00000000:2A:00.0"]
LOST = BUSES[1]
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_", "NCCL_", "CUDA_VISIBLE")


def counter_run(tmp_path: Path, *, lose: str | None) -> tuple[dict, str]:
    """The real counter tests on this host's two stand-in GPUs; ``lose``: the bus id that falls
    off the bus after the before reading. Returns results.json and the run's output."""
    host = socket.gethostname()
    write_node(tmp_path / f"nvml-{host}.json", gpus(BUSES))
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    env |= nvml_env(tmp_path / "nvml-{host}.json", [HERE / "standin_site", HERE, REPO])
    env |= {"GPUCLUSTER_STANDIN_CUDA": "1", "GPUCLUSTER_STANDIN_CUDA_RANKS": "1"}
    if lose:
        env["GPUCLUSTER_STANDIN_LOSE"] = f"test_counters_before={lose}"
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/test_burnin.py", "-k", "counters_before or counters_after",
         "--hw=auto", f"--results-dir={results}", "-p", "cuda_torch_standin", "-p", "standin_pynvml",
         "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    path = results / "results.json"
    assert path.exists(), out[-4000:]
    return json.loads(path.read_text()), out


def _lost_measurement(data: dict) -> dict:
    [lost] = [m for m in data["measurements"] if m["metric"] == "burnin.gpus_lost"]
    return lost


@pytest.mark.parametrize("planted", [True, False], ids=["gpu-lost", "healthy"])
def test_a_gpu_lost_after_the_run_fails_with_reset_then_rma_and_a_healthy_run_passes(tmp_path, planted):
    data, out = counter_run(tmp_path, lose=LOST if planted else None)
    host = socket.gethostname()
    assert data["profile"]["name"] == "h200-sxm", out[-4000:]  # chosen from what NVML listed
    before = [
        json.loads(p.read_text())
        for p in (tmp_path / "results" / "jobs").glob("*counters-before*/rank-*.json")
    ]
    read_before = sorted(r["value"]["nvml"]["pci_bus_id"] for r in before if r["value"].get("nvml"))
    assert read_before == [b.lower() for b in BUSES], before  # both GPUs answered the first reading
    lost = _lost_measurement(data)
    findings = [f for f in data.get("findings", []) if f["metric"] == "burnin.gpus_lost"]
    if not planted:
        assert (lost["value"], lost["verdict"]) == (0.0, "pass"), out[-4000:]
        assert findings == [] and data["signoff"]["fit"] is True, out[-4000:]
        return
    assert (lost["value"], lost["verdict"]) == (1.0, "fail"), out[-4000:]
    [finding] = findings
    assert (finding["host"], finding["action"], finding["reason"]) == (host, "reset GPU", "hardware"), finding
    assert LOST.lower() in finding["gpu"] and BUSES[0].lower() not in finding["gpu"], finding
    assert "NVMLError_GpuIsLost" in finding["message"] and "RMA" in finding["message"], finding
    assert data["signoff"]["fit"] is False and f"{host} (reset GPU)" in data["signoff"]["why"], data[
        "signoff"
    ]
    suspects = json.loads((tmp_path / "results" / "suspects.json").read_text())["suspects"]
    assert [(s["node"], s["evidence"].get("pci")) for s in suspects] == [(host, LOST.lower())], suspects
