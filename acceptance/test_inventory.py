"""Inventory: every node is the node the profile describes, judged on what the per-node probe
found on it — never on the machine pytest runs on, which is usually a login node without GPUs.

Asking for an 8 x H200 profile on nodes without GPUs is a failed acceptance with the mismatch
spelled out per node ("node gpu-07: 7 GPUs, profile wants 8"; "node gpu-03: mlx5_2 port 1 is
DOWN"; "node gpu-05: driver 550.54.15 while the others run 565.57.01") — never a pass, and never
a silent skip of everything. The checks themselves live in ``checks/inventory.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gpucluster.checks import inventory
from pytest_gpucluster.checks.readiness import readiness_checks
from pytest_gpucluster.cluster.preflight import preflight_checks
from pytest_gpucluster.results.model import Check, ThresholdRef
from pytest_gpucluster.session.start import judge_nodes

QUICK = pytest.mark.quick
"""Read from the per-node probe, no job of their own: the quick tier's inventory (all but the node count,
which is the cluster's, not a node's: a one-node health check would fail it)."""


@QUICK
def test_preflight(gpucluster_session: Any, results: Any) -> None:
    """The preflight's verdict per node (`cluster.preflight`): the NCCL interfaces and HCAs, ranks per
    node and GPUs fit what the node has. An error stops a run before any test, so this shows the
    nodes that passed, or, in a dry run, every finding."""
    if gpucluster_session.preflight is None:  # an xdist worker: the same facts give the same findings
        judge_nodes(gpucluster_session)
    findings = gpucluster_session.preflight
    if findings is None:
        why = gpucluster_session.not_probed or "this session launches nothing (--train-log / --nccl-log)"
        pytest.skip(f"no preflight: {why}")
    hosts = gpucluster_session.recorder.header["preflight"]["nodes"]
    if not hosts:
        pytest.skip("no node was judged by the preflight (no node answered the probe)")
    results.check_all(preflight_checks(findings, hosts))


@QUICK
def test_nodes_probed(nodes: Any, results: Any) -> None:
    """Every node's probe rank answered (a node that did not is named with the job's reason)."""
    results.check_all(inventory.probe_checks(nodes))


@QUICK
def test_device_kind(hw: Any, nodes: Any, results: Any) -> None:
    results.check_all(inventory.cuda_checks(nodes, hw))


@QUICK
def test_gpu_count(hw: Any, nodes: Any, results: Any) -> None:
    if hw.cluster.device != "cuda":
        pytest.skip(f"profile {hw.name} is CPU-only (cluster.device=cpu): no GPUs to count")
    results.check_all(inventory.gpu_count_checks(nodes, hw))


@QUICK
def test_gpu_model(hw: Any, nodes: Any, results: Any) -> None:
    if hw.cluster.device != "cuda" or not hw.cluster.gpu_model:
        pytest.skip(f"profile {hw.name} names no GPU model (cluster.gpu_model)")
    results.check_all(inventory.gpu_model_checks(nodes, hw))


@QUICK
def test_gpu_memory(hw: Any, nodes: Any, results: Any) -> None:
    """Each GPU's total memory against cluster.gpu_memory (a MIG slice or another part reports far less)."""
    if hw.cluster.device != "cuda" or hw.cluster.gpu_memory is None:
        pytest.skip(f"profile {hw.name} sets no GPU memory (cluster.gpu_memory)")
    checks = inventory.gpu_memory_checks(nodes, hw)
    if not checks:
        pytest.fail("NOT MEASURED: no node listed a GPU to compare with cluster.gpu_memory", pytrace=False)
    results.check_all(checks)


@QUICK
def test_same_versions(nodes: Any, results: Any) -> None:
    """Driver, CUDA driver, NCCL and torch are the same on every node."""
    checks = inventory.version_checks(nodes)
    if not checks:
        pytest.skip("no node reported a driver, NCCL or torch version")
    results.check_all(checks)


@QUICK
def test_fabric_ports(hw: Any, nodes: Any, results: Any) -> None:
    """Every InfiniBand/RoCE/EFA port the profile's interconnects name is ACTIVE at the line rate."""
    checks = inventory.fabric_checks(nodes, hw)
    if not checks:
        pytest.skip(f"profile {hw.name} names no RDMA fabric (cluster.interconnects: ib, roce or efa)")
    results.check_all(checks)


@QUICK
def test_no_foreign_gpu_processes(nodes: Any, results: Any) -> None:
    """No GPU is held by a process outside this run, before anything is measured on it."""
    checks = inventory.foreign_process_checks(nodes)
    if not checks:
        pytest.skip("no node lists a GPU, so no GPU process to look for")
    results.check_all(checks)


@QUICK
def test_node_readiness(hw: Any, nodes: Any, results: Any) -> None:
    """Every node is ready before anything is measured on it (`checks.readiness`): Fabric Manager and
    the GPUs' NVLink fabric state, fatal NVSwitch SXids, GPUDirect RDMA (nvidia_peermem or dma-buf),
    memlock, ACS on the GPU<->NIC path, the IOMMU, pending/failed row remaps, retired pages,
    persistence mode, stuck processes, PCIe AER errors and link width at rest. Each failure names
    the node and its fix (docs/reference/readiness.md); a reading that needs root is NOT MEASURED."""
    checks = readiness_checks(nodes, hw)
    if not checks:
        pytest.skip(f"profile {hw.name} sets no readiness threshold (readiness:) or no node answered")
    results.check_all(checks)


def test_node_count(hw: Any, gpucluster_session: Any, results: Any) -> None:
    have = gpucluster_session.available_nodes
    hint = (
        f"the cluster under test has {have} node(s): {gpucluster_session.hosts}; pass --hostfile listing "
        f"{hw.cluster.nodes} nodes (or run inside a Slurm allocation with --launcher slurm)."
    )
    ref = ThresholdRef(hw.name, ("cluster", "nodes"))
    results.check_all([Check("inventory.nodes", have, "nodes", hw.cluster.nodes, ">=", ref, hint=hint)])


@QUICK
def test_backend_available(hw: Any, nodes: Any, results: Any) -> None:
    """NCCL profiles: every node's torch has NCCL. Gloo profiles: this torch has gloo."""
    checks = inventory.nccl_backend_checks(nodes, hw)
    if not checks:
        import torch.distributed as dist

        have = dist.is_available() and dist.is_gloo_available()
        ref = ThresholdRef(hw.name, ("cluster", "backend"))
        checks = [Check("inventory.backend_gloo", float(have), "bool", 1.0, "==", ref,
                        hint="this torch build has no gloo backend.")]  # fmt: skip
    results.check_all(checks)
