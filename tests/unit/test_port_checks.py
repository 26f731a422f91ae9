"""checks/ports.py on a real H100 node's sysfs (tests/data/infiniband/sysfs_h100_9dev_attrs_gpud:
eight NDR InfiniBand ports and a RoCE bond), read by the same sysfs reader the probe uses.

The degraded nodes are that tree with one port's files changed to what a real kernel prints for a
port that lost its link (``1: DOWN`` / ``2: Polling``) or came up at half width (``200 Gb/sec (2X
NDR)``, the bond's own rate text in the same recording)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_gpucluster.checks.ports import PortExpectation, fabric_ports, port_changes, port_checks
from pytest_gpucluster.parsers.fabric_ports import parse_snapshot
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.text import failure_message
from pytest_gpucluster.workloads.fabric_probe import snapshot

TREE = Path(__file__).parents[1] / "data" / "infiniband" / "sysfs_h100_9dev_attrs_gpud"


def _ports(root: Path, node: str = "gpu-03"):
    return parse_snapshot(snapshot(root, node=node, interfaces=[])).ib_ports


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(TREE, root)
    return root


def _port_file(root: Path, device: str, name: str) -> Path:
    return root / "class" / "infiniband" / device / "ports" / "1" / name


@pytest.fixture(scope="module")
def dgx() -> PortExpectation:
    return PortExpectation.from_profile(load_profile("dgx-h100-ib").model)


def test_the_profile_names_eight_400g_infiniband_ports(dgx):
    assert (dgx.fabric, dgx.nics_per_node, dgx.line_rate_gbps) == ("ib", 8, 400.0)


def test_a_healthy_node_passes_and_the_roce_bond_is_not_an_infiniband_port(dgx):
    ports = _ports(TREE)
    assert len(ports) == 9
    assert [p.device for p in fabric_ports(ports, dgx)] == [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)]
    checks = port_checks("gpu-03", ports, dgx)
    assert [c for c in checks if c.failed] == []
    count = next(c for c in checks if c.metric == "fabric.active_ports")
    assert (count.value, count.threshold, count.ref.key) == (8, 8, "cluster.nics_per_node")
    assert {c.metric for c in checks} == {"fabric.active_ports", "fabric.port_active", "fabric.port_rate"}


def test_a_port_down_is_named_with_its_node_and_the_count_falls_short(tmp_path, dgx):
    root = _copy(tmp_path)
    _port_file(root, "mlx5_5", "state").write_text("1: DOWN\n")
    _port_file(root, "mlx5_5", "phys_state").write_text("2: Polling\n")
    failed = [c for c in port_checks("gpu-03", _ports(root), dgx) if c.failed]
    assert sorted(c.metric for c in failed) == ["fabric.active_ports", "fabric.port_active"]
    state = next(c for c in failed if c.metric == "fabric.port_active")
    assert state.labels == {"host": "gpu-03", "device": "mlx5_5", "port": "1"}
    assert "node gpu-03: mlx5_5 port 1 is DOWN (physical state Polling" in failure_message(state)
    count = next(c for c in failed if c.metric == "fabric.active_ports")
    assert count.value == 7 and "7 of 8 InfiniBand ports are ACTIVE" in count.hint


def test_a_port_at_half_rate_fails_its_rate_check_only(tmp_path, dgx):
    root = _copy(tmp_path)
    _port_file(root, "mlx5_7", "rate").write_text("200 Gb/sec (2X NDR)\n")
    failed = [c for c in port_checks("gpu-05", _ports(root, "gpu-05"), dgx) if c.failed]
    assert [(c.metric, c.labels["device"], c.value, c.threshold) for c in failed] == [
        ("fabric.port_rate", "mlx5_7", 200.0, 400.0)
    ]
    assert "node gpu-05: mlx5_7 port 1 runs at 200 Gb/sec (2X NDR), below the 400 Gb/s" in failed[0].hint
    assert failed[0].ref.key == "cluster.nic_line_rate"


def test_a_node_without_any_port_of_the_fabric_fails_saying_so(tmp_path, dgx):
    checks = port_checks("gpu-09", [], dgx)
    assert [c.metric for c in checks] == ["fabric.active_ports"]
    assert checks[0].failed and "has no InfiniBand port under /sys/class/infiniband" in checks[0].hint


def test_roce_profile_counts_the_ethernet_ports_and_no_fabric_means_no_checks():
    spectrum = PortExpectation.from_profile(load_profile("h200-spectrumx").model)
    assert spectrum.fabric == "roce" and spectrum.nics_per_node == 8
    assert [p.device for p in fabric_ports(_ports(TREE), spectrum)] == ["mlx5_bond_0"]
    assert (
        port_checks("n1", _ports(TREE), PortExpectation.from_profile(load_profile("cpu-local").model)) == []
    )


def test_port_changes_name_the_port_that_went_down_or_slower(tmp_path, dgx):
    before = _ports(TREE)
    root = _copy(tmp_path)
    _port_file(root, "mlx5_0", "state").write_text("1: DOWN\n")
    _port_file(root, "mlx5_1", "rate").write_text("200 Gb/sec (2X NDR)\n")
    failed = [c for c in port_changes("gpu-03", before, _ports(root), dgx) if c.failed]
    assert [(c.metric, c.labels["device"]) for c in failed] == [
        ("fabric.port_stayed_active", "mlx5_0"),
        ("fabric.port_rate_kept", "mlx5_1"),
    ]
    assert "mlx5_0 port 1 is DOWN" in failed[0].hint and "after the test" in failed[0].hint
    assert port_changes("gpu-03", before, before, dgx) and not any(
        c.failed for c in port_changes("gpu-03", before, before, dgx)
    )
