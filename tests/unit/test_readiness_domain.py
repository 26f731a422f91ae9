"""The NVLink domain judged (`readiness.nvlink_domain`, checks/readiness_domain.py) on real fabric
readings (tests/data/readiness/README.md): a GB200 GPU's nvidia-smi -q Fabric section (ClusterUUID
dc6e40c4..., CliqueId 2; kubernetes-sigs/dra-driver-nvidia-gpu#626), two GPUs of another GB200 tray
as gpud read them through NVML (9c6f5af3..., clique 4026; leptonai/gpud#1106), a failed registration
(all-zero UUID; Azure/azhpc-images#506) and the real H200 VM (Fabric State N/A).

Nodes are built by printing a real Fabric section under one ``GPU <bus id>`` line per GPU (the bus
ids are GB200's PCI domains as its XID lines show them); where a test mixes two real readings on
one node, or puts gpud's NVML values into nvidia-smi's layout, it says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.checks.fail_closed import coverage
from pytest_gpucluster.checks.fail_closed_owners import OWNERS
from pytest_gpucluster.checks.readiness import REMEDIES, readiness_checks
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.cluster.readiness import node_readiness
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema_readiness import ReadinessSection
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import Measurement

DATA = Path(__file__).parents[1] / "data" / "readiness"
GB200_626 = (DATA / "smi_q_fabric_gb200_clique2_dra626.txt").read_text()
AZURE_506 = "".join(
    f"    {line}\n"
    for line in (DATA / "smi_q_fabric_insufficient_resources_azhpc506.txt").read_text().splitlines()
)
BUSES = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def _gpud_block(record: dict) -> str:
    """gpud's NVML fabric record in nvidia-smi -q's Fabric layout (the values unchanged)."""
    return (
        "    Fabric\n"
        f"        State                             : {record['state']}\n"
        f"        Status                            : {record['status']}\n"
        f"        CliqueId                          : {record['clique_id']}\n"
        f"        ClusterUUID                       : {record['cluster_uuid']}\n"
    )


GPUD_1106 = [
    _gpud_block(r) for r in json.loads((DATA / "fabric_states_gb200_tray_gpud1106.json").read_text())
]


def _node(host: str, blocks: list[str]) -> NodeFacts:
    text = "".join(f"GPU {bus}\n{block}" for bus, block in zip(BUSES, blocks, strict=False))
    return NodeFacts(host=host, readiness=node_readiness({"smi_q": {"returncode": 0, "text": text}}))


def _profile(scope: str):
    model = load_profile("gb200").model
    return model.model_copy(update={"readiness": model.readiness.model_copy(update={"nvlink_domain": scope})})


def _domain(checks) -> dict[str, tuple[str, str]]:
    return {c.labels["host"]: (c.verdict, c.hint) for c in checks if c.metric == "readiness.nvlink_domain"}


def test_the_real_readings_carry_their_domain():
    [gb200] = node_readiness({"smi_q": {"returncode": 0, "text": GB200_626}}).gpus
    assert (gb200.fabric_state, gb200.fabric_status, gb200.clique_id, gb200.cluster_uuid) == (
        "completed", "Success", "2", "dc6e40c4-d722-4357-9ba6-5291dd461278"
    )  # fmt: skip
    tray = _node("tray-b", GPUD_1106).readiness.gpus
    assert {(g.cluster_uuid, g.clique_id) for g in tray} == {("9c6f5af3-53bf-49b5-a436-b66766c413c3", "4026")}
    [failed] = node_readiness({"smi_q": {"returncode": 0, "text": AZURE_506}}).gpus
    assert (failed.fabric_status, failed.cluster_uuid) == (
        "Insufficient Resources",
        "00000000-0000-0000-0000-000000000000",
    )


def test_a_tray_whose_gpus_share_one_domain_passes_and_one_gpu_in_another_fails_with_fix_node_setup():
    """node scope (the gb200 part profile): four GPUs printing the #626 section pass; the same tray
    with its last GPU carrying gpud's tray's UUID (two real readings mixed on one node) fails."""
    gb200 = load_profile("gb200").model
    assert gb200.readiness.nvlink_domain == "node"
    good = _domain(readiness_checks(ClusterFacts((_node("tray-a", [GB200_626] * 4),), "t"), gb200))
    assert (
        good["tray-a"][0] == "pass"
        and "all 4 GPUs in one NVLink domain (ClusterUUID dc6e40c4" in good["tray-a"][1]
    )
    mixed = _node("tray-a", [GB200_626] * 3 + [GPUD_1106[0]])
    checks = readiness_checks(ClusterFacts((mixed,), "t"), gb200)
    verdict, hint = _domain(checks)["tray-a"]
    assert verdict == "fail" and "different NVLink domains" in hint
    assert "GPU 0,1,2: ClusterUUID dc6e40c4-d722-4357-9ba6-5291dd461278, CliqueId 2" in hint
    assert "GPU 3: ClusterUUID 9c6f5af3-53bf-49b5-a436-b66766c413c3, CliqueId 4026" in hint
    measured = [
        Measurement.of(c, test_id="acceptance/test_inventory.py::test_node_readiness", time=0.0)
        for c in checks
    ]
    [finding] = [f for f in findings_of(measured, hosts=["tray-a"]) if f.metric == "readiness.nvlink_domain"]
    assert (finding.reason, finding.action, finding.host) == ("node setup", "fix node setup", "tray-a")
    assert finding.fix == REMEDIES["readiness.nvlink_domain"].fix


def test_across_nodes_a_tray_in_another_domain_fails_only_where_the_profile_spans_the_domain_over_nodes():
    nodes = (_node("tray-a", [GB200_626] * 4), _node("tray-b", [GB200_626] * 4), _node("tray-c", GPUD_1106))
    per_node = _domain(readiness_checks(ClusterFacts(nodes, "t"), _profile("node")))
    assert {h: v for h, (v, _) in per_node.items()} == {"tray-a": "pass", "tray-b": "pass", "tray-c": "pass"}
    spanning = _domain(readiness_checks(ClusterFacts(nodes, "t"), _profile("cluster")))
    assert [h for h, (v, _) in spanning.items() if v == "fail"] == ["tray-c"]
    assert "while 8 of 10 GPUs of the run are in ClusterUUID dc6e40c4" in spanning["tray-c"][1]
    assert "as the other nodes" in spanning["tray-a"][1]


def test_a_zero_uuid_is_no_multi_node_domain_and_pcie_nodes_need_none():
    """Azure's failed registration: within its node no disagreement (the fabric state check fails it:
    status Insufficient Resources); in a domain spanning nodes it is outside the domain. The real H200
    VM (Fabric State N/A) needs no domain: passed under its key, so fail-closed counts the answer."""
    zero = _node("az-1", [AZURE_506] * 2)
    alone = readiness_checks(ClusterFacts((zero,), "t"), _profile("node"))
    assert _domain(alone)["az-1"][0] == "pass" and "no multi-node domain" in _domain(alone)["az-1"][1]
    assert not [c for c in alone if c.failed]  # gb200 sets no fabric_manager: nothing else judges it here
    fm = _profile("node")
    fm = fm.model_copy(update={"readiness": fm.readiness.model_copy(update={"fabric_manager": True})})
    failed = sorted({c.metric for c in readiness_checks(ClusterFacts((zero,), "t"), fm) if c.failed})
    assert failed == ["readiness.fabric_manager", "readiness.gpu_fabric_state"]  # Insufficient Resources
    spanning = _domain(
        readiness_checks(ClusterFacts((zero, _node("tray-a", [GB200_626] * 4)), "t"), _profile("cluster"))
    )
    assert spanning["az-1"][0] == "fail" and spanning["tray-a"][0] == "pass"

    smi = (DATA / "h200_vm_2026_11_28" / "smi-q.txt").read_text().splitlines()
    vm = NodeFacts(
        host="h200-vm",
        readiness=node_readiness({"smi_q": {"returncode": 0, "text": "\n".join(smi[1:-1]) + "\n"}}),
    )
    h200 = load_profile("h200-sxm").model
    assert h200.readiness.nvlink_domain == "node"
    checks = readiness_checks(ClusterFacts((vm,), "t"), h200)
    verdict, hint = _domain(checks)["h200-vm"]
    assert verdict == "pass" and "no GPU of 1 reports an NVLink fabric" in hint and "not needed" in hint
    measured = [
        Measurement.of(c, test_id="acceptance/test_inventory.py::test_node_readiness", time=0.0)
        for c in checks
    ]
    assert not [c for c in coverage(h200, measured, []).checks if "nvlink_domain" in c.metric]


def test_a_node_whose_gpus_were_not_read_is_not_measured_and_the_key_has_its_owner():
    unread = NodeFacts(
        host="tray-x",
        readiness=node_readiness(
            {"smi_q": {"returncode": 127, "text": "", "why": "'nvidia-smi' is not on PATH"}}
        ),
    )
    [check] = [
        c
        for c in readiness_checks(ClusterFacts((unread,), "t"), _profile("node"))
        if c.metric == "readiness.nvlink_domain"
    ]
    assert check.problem == "not measured" and check.failed
    assert "readiness.nvlink_domain" in OWNERS
    with pytest.raises(ValueError, match="nvlink_domain"):
        ReadinessSection.model_validate({"nvlink_domain": "rack"})
