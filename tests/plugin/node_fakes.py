"""Nodes as a plugin test describes them: a `MachineInfo` turned into what the per-node probe
would have reported for that machine, so capability marks (judged on the nodes' facts, never on
the controller) see the GPUs, NCCL, NVML and NVLink the test claims."""

from __future__ import annotations

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts, GpuFact, NodeFacts
from pytest_gpucluster.profiles.detect import MachineInfo


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
    )
    return ClusterFacts((node,), f"the test's description of {machine.hostname}")


def use_machine(monkeypatch: pytest.MonkeyPatch, machine: MachineInfo) -> None:
    """The session's machine and every node's probe are ``machine`` (``facts_of`` it)."""
    facts = facts_of(machine)
    monkeypatch.setattr("pytest_gpucluster.session.start.detect_machine", lambda: machine)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_here", lambda options: facts)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_cluster", lambda *a, **k: facts)
    monkeypatch.setattr("pytest_gpucluster.cluster.probe.probe_each", lambda *a, **k: facts)
