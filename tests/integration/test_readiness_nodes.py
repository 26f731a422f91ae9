"""Node readiness on recorded HGX H100 nodes: this machine plays one node at a time, whose GPUs
are a real recorded ``nvidia-smi`` (8 x H100), whose fabric ports are a real H100 node's sysfs and
whose readiness sources are a real HGX H100's ``nvidia-smi -q``, ``lspci -vvv``, PCIe sysfs and
Fabric Manager log (`recorded_nodes`, `readiness_standin`), read by the real probe through its
seams (programs on PATH, sysfs and procfs roots). The real suite, ``acceptance/``, runs in a
subprocess under the DGX H100 site profile (``--hw=dgx-h100-ib``):

- the healthy node: no preflight warning (the dry run's preflight is the real run's, so a real run
  shows it) and a real run's ``test_node_readiness`` passes;
- Fabric Manager down, ``nvidia_peermem`` absent, a pending row remap, ACS enabled on the GPU<->NIC
  path: each named with its node and fix by the dry run's preflight, and by a real run's inventory
  (the failed test's message, and results.json's finding with its reason class, rung and fix).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_nodes import H100_SYSFS, H100_TABLE, RecordedNodes

REPO = Path(__file__).parents[2]
HERE = Path(__file__).parent
HOST = socket.gethostname()

CASES = {
    # fault: (what the preflight and the failed test say, the finding's metric, reason, rung, fix)
    "fabric-manager-down": (
        f"{HOST}: 0 of 8 GPUs joined the NVLink fabric (others: in progress/N/A); nvidia-fabricmanager is inactive",
        "readiness.fabric_manager", "node setup", "fix node setup", "start nvidia-fabricmanager",
    ),
    "no-peermem": (
        f"{HOST}: nvidia_peermem not loaded, and no dma-buf path (the proprietary kernel module",
        "readiness.gpudirect_rdma", "node setup", "fix node setup", "load nvidia_peermem",
    ),
    "row-remap-pending": (
        f"{HOST}: GPU 3 (00000000:5d:00.0) row remap PENDING (4 uncorrectable-error rows remapped)",
        "readiness.row_remap_pending", "hardware", "reset GPU", "reset GPU to apply pending row remaps",
    ),
    "acs-enabled": (
        f"{HOST}: ACS redirection (ReqRedir+/CmpltRedir+) on 1 bridge(s) on the GPU<->NIC path: 0000:17:01.0",
        "readiness.acs", "node setup", "fix node setup", "disable ACS in BIOS",
    ),
}  # fmt: skip


def _run(tmp_path: Path, fault: str | None, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    nodes = RecordedNodes(tmp_path / "recorded")
    nodes.add(HOST, H100_TABLE.read_text(), sysfs=H100_SYSFS, fault=fault)  # type: ignore[arg-type]
    results = tmp_path / "results"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "NCCL_", "PYTEST_"))
    }
    env |= nodes.env(env["PATH"]) | {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/test_inventory.py", "--hw=dgx-h100-ib", *args,
         f"--results-dir={results}", f"--confcutdir={REPO / 'acceptance'}", "-p", "cuda_torch_standin", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-q", "-s", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:anyio"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done, results


@pytest.mark.parametrize("fault", [None, *CASES], ids=["healthy", *CASES])
def test_each_unready_node_is_named_with_its_fix_by_the_dry_run_and_by_the_inventory(tmp_path, fault):
    real, results = _run(tmp_path / "real", fault, "-k", "readiness")
    text = real.stdout + real.stderr
    data = json.loads((results / "results.json").read_text())
    readiness = [m for m in data["measurements"] if m["metric"].startswith("readiness.")]
    assert len(readiness) > 40, text[-3000:]  # every GPU, NIC and NVSwitch of the node judged
    if fault is None:
        # No dry run here: a dry run's preflight is the real run's (session/preflight.py, only the
        # line's head differs), so the real run's lines and recorded findings show the same silence.
        said = [
            line
            for line in text.splitlines()
            if "gpucluster preflight: WARNING" in line and "readiness." in line
        ]
        assert said == [], said
        assert not [f for f in data["preflight"]["findings"] if "readiness." in json.dumps(f)], data[
            "preflight"
        ]
        assert real.returncode == 0 and "1 passed" in text, text[-4000:]
        assert not [f for f in data.get("findings", []) if f["metric"].startswith("readiness.")]
        return
    dry, _ = _run(tmp_path / "dry", fault, "--gpucluster-dry-run", "-k", "not node_count")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 1, out[-4000:]  # the dry run judges the inventory too
    warnings = [
        line for line in out.splitlines() if "[dry run] preflight: WARNING" in line and "readiness." in line
    ]
    said, metric, reason, action, fix = CASES[fault]
    assert any(said in line and fix in line for line in warnings), "\n".join(warnings) or out[-3000:]
    assert real.returncode == 1 and "1 failed" in text, text[-4000:]
    assert f"gpucluster preflight: WARNING {said}" in text, text[-4000:]  # the real run's preflight too
    assert said in text and fix in text, text[-4000:]
    found = [f for f in data["findings"] if f["metric"] == metric]
    assert found and all(f["host"] == HOST for f in found), data["findings"]
    assert {(f["reason"], f["action"]) for f in found} == {(reason, action)}
    assert all(fix in f["fix"] for f in found)
    # only this fault: every other readiness value passed
    assert {m["metric"] for m in readiness if m["verdict"] == "fail"} <= {
        metric,
        "readiness.gpu_fabric_state",
    }
