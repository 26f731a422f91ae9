"""The rank side of the readiness probe (`workloads.readiness_probe`): what it cannot read is
said, never reported as healthy or as absent."""

from __future__ import annotations

from pytest_gpucluster.checks.readiness import readiness_checks
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.cluster.readiness import node_readiness
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.workloads.readiness_probe import read_readiness


def test_a_node_whose_sysfs_and_procfs_cannot_be_read_is_not_measured_not_healthy(tmp_path):
    raw = read_readiness(
        sysfs_root=str(tmp_path / "no-sys"), proc_root=str(tmp_path / "no-proc"), smi="no-such-smi"
    )
    ready = node_readiness(raw)
    assert (ready.peermem, ready.iommu, ready.memlock, ready.gpus) == (None, None, None, ())
    assert {"gpus", "pci", "peermem", "memlock", "stuck"} <= set(ready.why)
    checks = readiness_checks(
        ClusterFacts((NodeFacts(host="n1", readiness=ready),), "t"), load_profile("dgx-h100-ib").model
    )
    judged = [
        c for c in checks if c.metric != "readiness.sxid_fatal"
    ]  # this machine's own kernel log is read
    assert len(judged) == 12 and all(c.failed and c.problem == "not measured" for c in judged)
    assert {c.metric for c in judged} >= {"readiness.gpudirect_rdma", "readiness.memlock", "readiness.iommu",
                                          "readiness.acs", "readiness.persistence_mode", "readiness.pcie_width",
                                          "readiness.nvlink_domain"}  # fmt: skip
    [gdr] = [c for c in judged if c.metric == "readiness.gpudirect_rdma"]
    assert f"{tmp_path / 'no-sys' / 'module'} is not readable" in gdr.hint
