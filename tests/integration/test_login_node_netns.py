"""From a login node: ``pytest acceptance/ --hw=dgx-h100-ib --hostfile <nodes>`` judges the nodes.

Three network-namespace nodes stand in for three DGX H100 nodes; pytest runs in a fourth, the
controller namespace, which plays the login node: it has no GPU facts at all (its nvidia-smi
cannot reach a driver). Each node's GPU seam replays a real recorded ``nvidia-smi`` table and its
sysfs a real H100 node's InfiniBand ports (`recorded_nodes`); one node is short of a GPU and has
a port DOWN, another has a port at half rate. The session must

- run the per-node probe through the launcher (torchrun agents reached by the remote-exec
  prefix) and record it in results.json;
- judge capability marks on the nodes (the GPU tests skip naming a node: its torch, a CPU build,
  cannot use the GPUs nvidia-smi lists), never on the controller;
- fail the inventory naming the degraded nodes, and pass the healthy one's checks;
- carry variables set only on the controller (``LD_LIBRARY_PATH=/opt/x``, ``FI_PROVIDER=efa``) into
  the ranks on every node (the probe rank reports what it received).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from netns_bed import netns_bed_or_skip
from recorded_nodes import H100_TABLE, RecordedNodes, without_gpu

REPO = Path(__file__).parents[2]
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")


def _outcome(results: dict, name: str) -> dict:
    return next(o for o in results["outcomes"] if o["test_id"].endswith(name))


def test_a_login_node_probes_the_nodes_judges_marks_there_and_names_the_degraded_node(tmp_path):
    with netns_bed_or_skip(3, controller=True) as bed:
        healthy, short, slow = bed.names
        nodes = RecordedNodes(tmp_path / "recorded")
        table = H100_TABLE.read_text()
        nodes.add(healthy, table)
        nodes.add(short, without_gpu(table, 7))
        nodes.port(short, "mlx5_5", "state", "1: DOWN\n")
        nodes.port(short, "mlx5_5", "phys_state", "2: Polling\n")
        nodes.add(slow, table)
        nodes.port(slow, "mlx5_7", "rate", "200 Gb/sec (2X NDR)\n")
        hostfile = tmp_path / "hosts"
        hostfile.write_text(bed.hostfile_text(slots=8))
        results = tmp_path / "results"
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
        env |= {
            **nodes.env(env["PATH"]),
            "LD_LIBRARY_PATH": "/opt/x",
            "FI_PROVIDER": "efa",
        }
        pytest_argv = [
            sys.executable, "-m", "pytest", "acceptance/", "--hw=dgx-h100-ib", f"--hostfile={hostfile}",
            f"--remote-exec={shlex.join(bed.remote_exec_template)}", f"--results-dir={results}",
            "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
        ]  # fmt: skip
        assert bed.controller is not None
        done = subprocess.run(
            bed.exec_argv(bed.controller, pytest_argv), cwd=REPO, env=env, capture_output=True,
            text=True, timeout=600, check=False,
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == 1, output[-5000:]  # inventory failures, nothing else broken
        data = json.loads((results / "results.json").read_text())

    # The probe ran through the launcher, one job per node, on the three nodes (not on the controller).
    probed = data["nodes"]
    assert probed["source"].startswith("probe jobs, one per node, in parallel"), probed["source"]
    assert [n["host"] for n in probed["nodes"]] == [healthy, short, slow]
    assert [len(n["gpus"]) for n in probed["nodes"]] == [8, 7, 8]
    for node in probed["nodes"]:
        assert node["gpu_source"] == "nvidia-smi" and node["driver"] == "565.57.01"
        # Set only on the controller, seen inside the rank on every node.
        assert node["env"]["LD_LIBRARY_PATH"] == "/opt/x" and node["env"]["FI_PROVIDER"] == "efa", node["env"]
    assert f"gpucluster:   {short}: 7 x NVIDIA H100 80GB HBM3 (nvidia-smi, driver 565.57.01)" in output

    # The inventory names the degraded nodes; the healthy node's checks pass.
    count = _outcome(data, "test_gpu_count")
    assert count["outcome"] == "failed" and f"node {short}: 7 GPUs, profile wants 8" in count["message"]
    ports = _outcome(data, "test_fabric_ports")["message"]
    assert f"node {short}: mlx5_5 port 1 is DOWN (physical state Polling" in ports
    assert f"node {slow}: mlx5_7 port 1 runs at 200 Gb/sec (2X NDR)" in ports
    assert healthy not in ports
    by_host = {
        (m["metric"], m["labels"].get("host")): m["verdict"]
        for m in data["measurements"]
        if m["metric"] in ("inventory.gpus_per_node", "fabric.active_ports")
    }
    assert by_host[("inventory.gpus_per_node", healthy)] == "pass"
    assert by_host[("fabric.active_ports", healthy)] == "pass"
    assert by_host[("fabric.active_ports", short)] == "fail"

    # Capability marks were judged on the nodes: GPU tests skip naming a node, not the controller.
    skipped = [o["message"] for o in data["outcomes"] if o["outcome"] == "skipped"]
    on_nodes = [
        m
        for m in skipped
        if f"needs cuda: nodes {healthy}, {short}, {slow}: lists GPUs (nvidia-smi), but its torch" in m
    ]
    assert on_nodes, skipped
    assert not any(bed.controller.name in m for m in skipped), skipped
