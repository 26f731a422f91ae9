"""The set-aside stage (`session.set_aside`): which nodes a session leaves out before its first job,
with what reason and action, and when it stops instead. Facts are built from real recorded
``nvidia-smi`` tables (tests/data/nvidia_smi) through the probe's own parser, and judged by the
real preflight against the shipped h200-sxm part profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts, node_facts
from pytest_gpucluster.cluster.preflight import preflight
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import SET_ASIDE_TEST_ID, Measurement
from pytest_gpucluster.session.set_aside import (
    NodeSplit,
    set_aside_checks,
    set_aside_outcome,
    split_nodes,
    stop_outcome,
)

SMI = Path(__file__).parents[1] / "data" / "nvidia_smi"
H200 = (SMI / "smi_h200x8_550.163.01_mir_hw2.txt").read_text()
HOSTS = ["gpu-001", "gpu-002", "gpu-003", "gpu-004"]


def _without_gpu(text: str, index: int) -> str:
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"|   {index}  NVIDIA"))
    return "".join(lines[:start] + lines[start + 4 :])


def _node(host: str, table: str = H200, **torch: object) -> NodeFacts:
    record = {
        "host": host,
        "gpu": {"source": "nvidia-smi", "text": table, "returncode": 0},
        "cuda_available": True,
        "nccl_available": True,
        "torch_cuda": "12.4",
        **torch,
    }
    return node_facts(record)


def _judge(nodes: list[NodeFacts], **kwargs: object) -> NodeSplit:
    profile = load_profile("h200-sxm").model
    facts = ClusterFacts(tuple(nodes), "probe jobs")
    findings = preflight(facts, profile, env={}, env_origin={}, ranks_per_node=8, ranks_origin="profile")
    return split_nodes([n.host for n in nodes], facts, findings, cuda=True, **kwargs)  # type: ignore[arg-type]


def test_a_node_at_seven_gpus_is_set_aside_with_its_gpus_named_and_the_others_kept():
    split = _judge([_node(h) for h in HOSTS[:3]] + [_node(HOSTS[3], _without_gpu(H200, 5))])
    assert split.usable == tuple(HOSTS[:3]) and split.stop is None
    (aside,) = split.set_aside
    assert (aside.host, aside.reason, aside.action) == ("gpu-004", "7 GPUs usable, 8 needed", "reset GPU")
    assert (
        split.line() == "measured on 3 of 4 nodes; set aside: gpu-004 (7 GPUs usable, 8 needed -> reset GPU)"
    )


def test_a_node_whose_cuda_sees_two_gpus_is_named_with_what_cuda_can_use():
    narrowed = _node(HOSTS[3], device_count=2, cuda_visible_devices="0,1")
    assert narrowed.usable_gpu_count == 2
    assert narrowed.cuda_view() == "CUDA can use 2 of 8 (CUDA_VISIBLE_DEVICES=0,1)"
    split = _judge([_node(h) for h in HOSTS[:3]] + [narrowed])
    (aside,) = split.set_aside
    assert aside.host == "gpu-004" and aside.reason == "2 GPUs usable, 8 needed", aside


def test_mig_enabled_where_the_profile_measures_nvlink_is_named():
    mig = _node(HOSTS[3], H200.replace("Disabled |", "Enabled |", 1), device_count=1)
    assert mig.mig_enabled == (0,)
    split = _judge([_node(h) for h in HOSTS[:3]] + [mig])
    (aside,) = split.set_aside
    assert aside.action == "reset GPU"
    assert (
        "1 GPUs usable, 8 needed" in aside.reason
        and "MIG is enabled on GPU 0: CUDA can use 1 of 8" in aside.reason
    )


def test_an_unanswered_probe_and_an_unreachable_node_are_set_aside_with_their_actions():
    reach = {h: {p: None for p in HOSTS if p != h} for h in HOSTS}
    for h in HOSTS[1:3]:
        reach[h]["gpu-004"] = "no answer from gpu-004 within 3 s"
    reach["gpu-004"] = {p: f"no answer from {p} within 3 s" for p in HOSTS[:3]}
    nodes = [NodeFacts(HOSTS[0], error="its probe rank did not answer: timed out after 180 s")]
    nodes += [_node(h, reach=reach[h]) for h in HOSTS[1:]]
    split = _judge(nodes)
    assert split.usable == ("gpu-002", "gpu-003")
    assert [(s.host, s.action) for s in split.set_aside] == [
        ("gpu-001", "drain node"),
        ("gpu-004", "reseat/replace cable or NIC"),
    ]
    assert split.set_aside[1].reason == (
        "unreachable: no TCP answer from 3 of the 3 peers it tried, nor from it to 2 of the 2 that tried it"
    )
    assert split.set_aside[0].reason == "not probed: its probe rank did not answer: timed out after 180 s"


def test_a_requirement_no_node_meets_stops_the_run_as_the_profile_s_fault():
    short = [_node(h, _without_gpu(H200, 7)) for h in HOSTS]
    split = _judge(short)
    assert split.set_aside == () and split.stop is not None and "nothing launched" in split.stop
    outcome = stop_outcome(split)
    assert outcome is not None and outcome.category == "infrastructure"


def test_strict_nodes_stops_on_one_bad_node():
    split = _judge([_node(h) for h in HOSTS[:3]] + [_node(HOSTS[3], _without_gpu(H200, 5))], strict=True)
    assert split.stop is not None and "gpu-004" in split.stop


def test_two_nodes_with_one_bad_stop_as_not_measured_naming_why():
    split = _judge([_node(HOSTS[0]), _node(HOSTS[1], _without_gpu(H200, 5))])
    assert split.stop_category == "not measured" and split.usable == ("gpu-001",)
    assert split.stop.startswith("NOT MEASURED: the multi-node checks need 2 nodes and 1 of 2 is usable")
    assert stop_outcome(split).category == "not measured"
    assert set_aside_outcome(split) is None  # the stop stands for everything


def test_the_set_aside_check_becomes_a_hardware_finding_with_the_stage_s_action():
    split = _judge([_node(h) for h in HOSTS[:3]] + [_node(HOSTS[3], _without_gpu(H200, 5))])
    measured = [Measurement.of(c, test_id=SET_ASIDE_TEST_ID, time=0.0) for c in set_aside_checks(split)]
    outcome = set_aside_outcome(split)
    assert outcome is not None and outcome.message == split.line()
    (finding,) = findings_of(measured, [outcome], HOSTS)
    assert (finding.host, finding.reason, finding.action) == ("gpu-004", "hardware", "reset GPU")
    assert finding.why == "set aside before the first job: 7 GPUs usable, 8 needed"


@pytest.mark.parametrize("excluded", [("gpu-004",)])
def test_excluded_nodes_are_named_on_the_results_line(excluded):
    split = _judge([_node(h) for h in HOSTS[:3]], excluded=excluded)
    assert split.line() == "measured on 3 of 4 nodes; excluded (--gpucluster-exclude): gpu-004"
    assert split.to_json()["excluded"] == ["gpu-004"]
