"""Nodes as a plugin test describes them: a `MachineInfo` turned into what the per-node probe
would have reported for that machine, so capability marks (judged on the nodes' facts, never on
the controller) see the GPUs, NCCL, NVML and NVLink the test claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts, GpuFact, NodeFacts
from pytest_gpucluster.cluster.readiness import NodeReadiness, node_readiness
from pytest_gpucluster.profiles.detect import MachineInfo

H100_QUERY = Path(__file__).parents[1] / "data" / "nvidia_smi" / "ecc_q_h100x8_first2_535.161.08_gpud.txt"
"""A real H100 node's ``nvidia-smi -q`` (gpud): Fabric State Completed, persistence on, no remap pending."""


def ready_node(gpus: int) -> NodeReadiness:
    """A ready node's readiness, read by the real parsers from what its probe would return: the
    recorded H100 GPU block once per GPU, nvidia_peermem loaded, memlock unlimited, IOMMU in
    passthrough, the fabric manager active, no stuck process and an empty kernel log."""
    text = H100_QUERY.read_text()
    head, _, rest = text.partition("\nGPU ")
    block = "GPU " + rest.split("\nGPU ")[-1]
    limits = "Max locked memory         unlimited            unlimited            bytes     \n"
    raw = {
        "smi_q": {"returncode": 0, "text": head + "\n" + "\n".join([block] * gpus)},
        "fabric_manager": {"service": {"returncode": 0, "text": "active\n", "state": "active"},
                           "log": {"why": "not read"}},
        "kernel_log": {"source": "journalctl -k", "lines": []},
        "modules": {"nvidia_peermem": True, "nvidia": True, "driver_version": None, "kernel": "5.15.0"},
        "memlock": {"limits": limits},
        "iommu": {"group_types": {"identity": 4}, "groups": 4, "cmdline": "iommu=pt"},
        "pci": {"devices": []},
        "lspci": {"returncode": 0, "text": ""},
        "dstate": {"stuck": {}},
    }  # fmt: skip
    return node_readiness(raw)


def facts_of(machine: MachineInfo) -> ClusterFacts:
    caps = machine.capabilities
    gpus = tuple(GpuFact(i, name, f"GPU-test-{i}", None, None) for i, name in enumerate(machine.gpu_names))
    source = ("nvml" if "nvml" in caps else "nvidia-smi") if gpus else None
    node = NodeFacts(
        host=machine.hostname,
        gpus=gpus,
        gpu_source=source,
        gpu_problem=None if gpus else machine.why_missing("cuda"),
        torch="2.13.0",
        cuda_available=("cuda" in caps) if gpus else None,
        nccl_available="nccl" in caps,
        nvlink_active="nvlink" in caps,
        processes_problem=None if "nvml" in caps else machine.why_missing("nvml"),
        cpus=machine.cpu_count,
        readiness=ready_node(len(gpus)) if gpus else None,
    )
    return ClusterFacts((node,), f"the test's description of {machine.hostname}")


def use_machine(monkeypatch: pytest.MonkeyPatch, machine: MachineInfo) -> None:
    """The session's machine and every node's probe are ``machine`` (``facts_of`` it)."""
    facts = facts_of(machine)
    monkeypatch.setattr("pytest_gpucluster.session.start.detect_machine", lambda: machine)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_here", lambda options: facts)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_cluster", lambda *a, **k: facts)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_each", lambda *a, **k: facts)
