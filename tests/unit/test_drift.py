"""Version drift on recorded per-node fingerprints: profile pins and bounds, and agreement between nodes.

Two recorded sources: the health job's rank values on this project's CI VM (tests/data/burnin,
SOURCES.md), and per-host NCCL / CUDA driver / net plugin versions read with the real NCCL log
parser from recorded ``NCCL_DEBUG=INFO`` logs of real nodes (tests/data/nccl_logs, SOURCES.md).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drift import (
    check_agreement,
    check_pins,
    nccl_log_fingerprints,
    node_fingerprints,
    parse_pin,
)
from pytest_gpucluster.parsers.nccl_log import parse_nccl_log

DATA = Path(__file__).parents[1] / "data"
# dgxh100-3 and dgxh100-4 ran NCCL 2.19.3+cuda12.3 on CUDA driver 12.0 (one job, nccl-tests#185);
# ip-10-36-29-253 ran NCCL 2.21.5+cuda12.8 on driver 12.4 (aws-ofi-nccl#889).
SAME_JOB = "roce_2.19.3_nccl_tests185.log"
OTHER_NCCL = "efa_cloudwatch_2.21.5_ofi889.log"
WITH_PLUGIN = "efa_libfabric_aws_ofi_2.27.3.log"


def _logs(*names: str):
    return [(name, parse_nccl_log((DATA / "nccl_logs" / name).read_text())) for name in names]


def _vm_values() -> list[dict]:
    return json.loads((DATA / "burnin" / "cpu_vm_health_2ranks.json").read_text())


@pytest.mark.parametrize(
    ("pin", "value", "ok"),
    [
        ("2.21.5", "2.21.5", True),
        ("2.21.5", "2.21.4", False),
        ("2.21.5", "2.21.5+cuda12.4", True),  # a local suffix is ignored, as PEP 440 does
        ("==2.13.0", "2.13.0+cpu", True),
        (">=550", "550.54.15", True),
        (">=550", "535.104.05", False),
        (">=2.18,<2.23", "2.21.5", True),
        (">=2.18,<2.23", "2.23.4", False),
        ("2.21.*", "2.21.5", True),
        ("2.21.*", "2.22.3", False),
        ("!=2.19.3", "2.19.3", False),
        ("aws-ofi-nccl", "aws-ofi-nccl", True),  # not a version: an exact string
        ("aws-ofi-nccl", "nccl-rdma-sharp-plugins", False),
        (">=12.0", "not-a-version", False),
    ],
)
def test_pins_and_bounds(pin, value, ok):
    assert parse_pin("x", pin).allows(value) is ok


@pytest.mark.parametrize("bad", ["", ">=>2", "==2.21.5 garbage"])
def test_a_pin_that_is_not_a_version_spec_names_the_key(bad):
    with pytest.raises(BurninError, match=r"versions\.nccl"):
        parse_pin("nccl", bad)


def test_recorded_logs_give_one_fingerprint_per_host():
    fingerprints, within = nccl_log_fingerprints(_logs(SAME_JOB, OTHER_NCCL, WITH_PLUGIN))
    assert within == []
    assert fingerprints == {
        "dgxh100-3": {"nccl": "2.19.3", "nccl_cuda": "12.3", "cuda_driver": "12.0"},
        "dgxh100-4": {"nccl": "2.19.3", "nccl_cuda": "12.3", "cuda_driver": "12.0"},
        "ip-10-36-29-253": {"nccl": "2.21.5", "nccl_cuda": "12.8", "cuda_driver": "12.4"},
        "llama-3-8b-node-0-0": {
            "nccl": "2.27.3",
            "nccl_cuda": "12.9",
            "cuda_driver": "13.0",
            "net_plugin": "aws-ofi-nccl",
            "net_plugin_version": "1.16.2",
        },
    }


def test_nodes_of_one_job_agree():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB))
    assert check_agreement(fingerprints) == []
    assert check_pins(fingerprints, {"nccl": "2.19.3", "cuda_driver": ">=12.0"}) == []


def test_a_node_with_a_different_nccl_version_is_named():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB, OTHER_NCCL))
    findings = {f.name: f for f in check_agreement(fingerprints)}
    assert set(findings) == {"nccl", "nccl_cuda", "cuda_driver"}
    nccl = findings["nccl"]
    assert nccl.nodes == ("ip-10-36-29-253",) and nccl.value == "2.21.5" and nccl.expected == "2.19.3"
    assert nccl.message == (
        "node ip-10-36-29-253 has nccl 2.21.5 where most nodes (2 of 3) have 2.19.3 "
        "(2.19.3 on dgxh100-3, dgxh100-4; 2.21.5 on ip-10-36-29-253)"
    )
    [suspect] = nccl.suspects()
    assert (suspect.node, suspect.check) == ("ip-10-36-29-253", "drift")
    assert suspect.evidence == {"name": "nccl", "value": "2.21.5", "expected": "2.19.3"}


def test_pins_name_every_node_that_misses_them():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB, OTHER_NCCL))
    [exact] = check_pins(fingerprints, {"nccl": "2.19.3"})
    assert exact.nodes == ("ip-10-36-29-253",)
    assert exact.message == "node ip-10-36-29-253 has nccl 2.21.5; the profile requires nccl 2.19.3"
    [bound] = check_pins(fingerprints, {"nccl": ">=2.21"})
    assert bound.nodes == ("dgxh100-3", "dgxh100-4")
    assert bound.message == "nodes dgxh100-3, dgxh100-4 have nccl 2.19.3; the profile requires nccl >=2.21"


def test_a_pin_on_a_missing_version_names_the_nodes_without_it():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB, WITH_PLUGIN))
    [finding] = check_pins(fingerprints, {"net_plugin_version": ">=1.11"})
    assert finding.nodes == ("dgxh100-3", "dgxh100-4") and finding.value is None
    assert "report no net_plugin_version version" in finding.message


def test_a_pin_nobody_reports_is_a_finding_not_silence():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB))
    [finding] = check_pins(fingerprints, {"ncll": "2.19.3"})
    assert finding.kind == "unknown"
    assert "no node reports a version named 'ncll'" in finding.message
    assert "(reported: cuda_driver, nccl, nccl_cuda)" in finding.message


def test_an_even_split_names_every_group():
    fingerprints = {
        "a": {"nccl": "2.19.3"},
        "b": {"nccl": "2.19.3"},
        "c": {"nccl": "2.21.5"},
        "d": {"nccl": "2.21.5"},
    }
    findings = check_agreement(fingerprints)
    assert sorted(f.nodes for f in findings) == [("a", "b"), ("c", "d")]
    assert all("no majority" in f.message for f in findings)


def test_agreement_can_ignore_names():
    fingerprints, _ = nccl_log_fingerprints(_logs(SAME_JOB, OTHER_NCCL))
    assert {f.name for f in check_agreement(fingerprints, ignore=["nccl_cuda", "cuda_driver"])} == {"nccl"}


def test_the_ranks_of_a_recorded_node_fold_into_one_fingerprint():
    fingerprints, within = node_fingerprints(_vm_values())
    assert within == []
    assert list(fingerprints) == ["vm"]
    assert fingerprints["vm"]["torch"] == "2.13.0+cpu"
    assert fingerprints["vm"]["nccl"] is None  # a CPU build of torch: no NCCL
    assert check_pins(fingerprints, {"torch": ">=2.3", "python": ">=3.10"}) == []
    [old] = check_pins(fingerprints, {"torch": "2.12.0"})
    assert old.message == "node vm has torch 2.13.0+cpu; the profile requires torch 2.12.0"


def test_ranks_of_one_node_that_disagree_are_named():
    values = copy.deepcopy(_vm_values())
    values[1]["versions"]["torch"] = "2.12.1+cpu"  # as if rank 1 ran from another environment
    fingerprints, within = node_fingerprints(values)
    [finding] = within
    assert finding.kind == "within-node" and finding.nodes == ("vm",)
    assert finding.message == "the ranks of vm disagree on torch: 2.13.0+cpu on rank 0; 2.12.1+cpu on rank 1"
    assert "torch" not in fingerprints["vm"]


def test_a_cpu_node_joining_gpu_nodes_is_named_for_every_missing_version():
    vm, _ = node_fingerprints(_vm_values())
    gpu, _ = nccl_log_fingerprints(_logs(SAME_JOB))
    findings = check_agreement(
        {**gpu, "vm": {"nccl": vm["vm"]["nccl"], "cuda_driver": vm["vm"]["cuda_driver"]}}
    )
    # nccl_cuda is absent from vm's fingerprint: a missing name counts as "none" too.
    by_name = {f.name: f for f in findings}
    assert {name: f.nodes for name, f in by_name.items()} == {
        "cuda_driver": ("vm",),
        "nccl": ("vm",),
        "nccl_cuda": ("vm",),
    }
    assert by_name["nccl"].message.startswith("node vm has nccl none where most nodes (2 of 3) have 2.19.3")
