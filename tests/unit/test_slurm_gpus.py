"""`cluster.slurm_gpus` (the GPUs --hw=auto's probe asks Slurm for, and its no-GPU error), the rank's
``MASTER_ADDR`` from ``SLURM_STEP_NODELIST`` (`workloads._runtime`), and the XID listener step's argv
(`launch.xid_step`). The real runs are in tests/integration/test_slurm_nodes.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.cluster.slurm_gpus import gres_gpu_count, no_gpu_error, node_gres, probe_gpu_request
from pytest_gpucluster.launch.xid_step import XidListenerStep
from pytest_gpucluster.workloads._runtime import MASTER_FROM_ENV, RankIdentity, slurm_step_first_node

# `scontrol show node -o gmp27804c0n0` on the local Slurm 22.05.8 of tests/integration/slurm_netns.py
SHOW_NODE = (
    "NodeName=gmp27804c0n0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=8 CPUEfctv=8 CPUTot=8 CPULoad=3.90 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=10.77.0.1 NodeHostName=gmp27804c0n0 "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v769 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=19356 "
    "Sockets=8 Boards=1 State=ALLOCATED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=debug  BootTime=2026-11-28T14:14:36 SlurmdStartTime=2026-11-28T14:23:47"
)


@pytest.mark.parametrize(
    ("gres", "count"),
    [("gpu:8", 8), ("gpu:h200:8(S:0-1)", 8), ("gpu:a100:4,gpu:h100:4", 8), ("gpu:h100:8(S:0,1),nic:2", 8),
     ("gpu", 1), ("(null)", 0), ("nic:2", 0), ("", 0)],
)  # fmt: skip
def test_gres_gpu_count(gres, count):
    assert gres_gpu_count(gres) == count


def _runner(stdout: str, code: int = 0):
    calls = []

    def run(argv):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, code, stdout, "")

    return run, calls


def test_the_probe_asks_for_the_fewest_gpus_the_nodes_gres_lists():
    text = (
        SHOW_NODE
        + "\n"
        + SHOW_NODE.replace("gmp27804c0n0", "n1").replace("Gres=gpu:8", "Gres=gpu:h200:7(S:0)")
    )
    assert node_gres(text) == {"gmp27804c0n0": "gpu:8", "n1": "gpu:h200:7(S:0)"}
    run, calls = _runner(text)
    request = probe_gpu_request(["gmp27804c0n0", "n1"], (), {}, scontrol=sys.executable, run=run)
    assert request.args == ("--gres=gpu:7",)  # one --gres for every node: the node with 7 is named later
    assert calls == [[sys.executable, "show", "node", "-o", "gmp27804c0n0,n1"]]
    assert "gmp27804c0n0 Gres=gpu:8, n1 Gres=gpu:h200:7(S:0)" in request.how


def test_the_allocations_gpus_and_a_sites_own_request_come_first():
    run, calls = _runner(SHOW_NODE)
    granted = probe_gpu_request(["a"], (), {"SLURM_GPUS_ON_NODE": "4"}, scontrol=sys.executable, run=run)
    assert granted.args == ("--gres=gpu:4",)
    site = probe_gpu_request(
        ["a"], ("--partition=gpu", "--gpus-per-node=2"), {}, scontrol=sys.executable, run=run
    )
    assert site.args == () and "--gpus-per-node=2" in site.how
    assert calls == []


def test_nodes_without_gpu_gres_get_no_request():
    run, _ = _runner(SHOW_NODE.replace("Gres=gpu:8", "Gres=(null)"))
    request = probe_gpu_request(["gmp27804c0n0"], (), {}, scontrol=sys.executable, run=run)
    assert request.args == () and "lists no gpu Gres" in request.how


def _facts(*nodes: NodeFacts) -> ClusterFacts:
    return ClusterFacts(nodes, "probe job node-probe-1 (/r/jobs/node-probe-1)")


def test_two_slurm_nodes_without_a_gpu_are_an_error_naming_the_probe_and_its_request():
    facts = _facts(
        NodeFacts(host="n0", gpu_problem="no nvidia-smi"), NodeFacts(host="n1", gpu_problem="no nvidia-smi")
    )
    said = no_gpu_error(facts, ["--partition=gpu", "--gres=gpu:8"])
    assert said is not None and said.startswith("--hw=auto found no GPU on any of the 2 Slurm nodes n0, n1: ")
    assert (
        "(probe job node-probe-1 (/r/jobs/node-probe-1)) ran one task per node through srun --gres=gpu:8"
        in said
    )
    assert "nodes n0, n1: lists no GPU (no nvidia-smi)" in said and "--hw=cpu-local" in said
    assert no_gpu_error(_facts(NodeFacts(host="n0")), []) is None  # one node may be a CPU machine


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("n[0-2]", "n0"), ("gpu-[07-09,12]-ib,login1", "gpu-07-ib"), ("rack[2-3]_blade[4,1]", "rack2_blade4"),
     ("b2,a1", "b2"), ("node5", "node5")],
)  # fmt: skip
def test_the_steps_first_node(nodelist, first):
    assert slurm_step_first_node(nodelist) == first


def test_a_tasks_mode_rank_takes_master_addr_from_its_steps_first_node(monkeypatch):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
    for key, value in {**env, "MASTER_ADDR": "n1", MASTER_FROM_ENV: "SLURM_STEP_NODELIST"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n[0-1]")
    RankIdentity.from_environ().export()
    assert os.environ["MASTER_ADDR"] == "n0"  # where Slurm put task 0, not the first host given


def test_the_listener_step_overlaps_the_allocation_with_the_nodes_gpus():
    step = XidListenerStep(
        ["n0", "n1"], "/tmp/w", 86400, "/r/xid-watch.log", name="xid-watch-w", gpu_args=["--gpus-per-node=8"],
        python="/py",
    )  # fmt: skip
    assert step.argv() == [
        "srun", "--overlap", "--job-name=xid-watch-w", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=n0,n1", "--kill-on-bad-exit=0", "--export=ALL", "--gpus-per-node=8",
        "/py", "-m", "pytest_gpucluster.workloads.xid_watch", "/tmp/w", "--max-s", "86400", "--held",
    ]  # fmt: skip
    assert step.env()["GPUCLUSTER_JOB_ID"] == "xid-watch-w"
