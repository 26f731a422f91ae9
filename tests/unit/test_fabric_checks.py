"""checks/fabric.py: which ports count, and the verdict on counters between two readings.

Readings are real: a recorded H100 node's sysfs tree (tests/data/infiniband/sysfs_h100_gpud, read by
the same probe that runs on a node) and the ``tc -s -j qdisc`` output recorded on this VM before and
after a tbf queue dropped packets (tests/data/netdev). "After" readings are the same files with one
counter changed in the test, as SOURCES.md there describes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.fabric import NameSelection, counted_ports, counter_checks, moved_bytes
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, parse_snapshot
from pytest_gpucluster.profiles.schema import FabricSection
from pytest_gpucluster.workloads.fabric_probe import snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "infiniband" / "sysfs_h100_gpud"
TC_BEFORE = (DATA / "netdev" / "tc_s_j_qdisc_tbf_before_this_vm.json").read_text()
TC_AFTER = (DATA / "netdev" / "tc_s_j_qdisc_tbf_after_udp_blast_this_vm.json").read_text()
NOQUEUE = (DATA / "netdev" / "tc_s_j_qdisc_veth_default_noqueue_this_vm.json").read_text()


def h100(root: Path = H100, node: str = "gpu-a17") -> FabricSnapshot:
    return parse_snapshot(snapshot(root, node=node), f"{node} sysfs")


def grown_tree(tmp_path: Path, device: str, counter: str, value: str, group: str = "counters") -> Path:
    root = tmp_path / "sys"
    shutil.copytree(H100, root)
    (root / "class" / "infiniband" / device / "ports" / "1" / group / counter).write_text(value + "\n")
    return root


def netdev(name: str, operstate: str = "up", tc: str = NOQUEUE, **stats: int) -> dict[str, Any]:
    """One interface as fabric_probe reads it (attrs, statistics, the qdisc's tc JSON)."""
    counters = {"rx_bytes": 0, "tx_bytes": 0, "rx_errors": 0, "tx_dropped": 0, **stats}
    return {
        "attrs": {"operstate": operstate, "mtu": "1500"},
        "statistics": {k: str(v) for k, v in counters.items()},
        "errors": {"speed": "EINVAL: Invalid argument"},
        "qdisc": {"json": tc},
    }


def node(name: str, **interfaces: dict[str, Any]) -> FabricSnapshot:
    return parse_snapshot({"node": name, "infiniband": {}, "net": interfaces}, name)


SECTION = FabricSection()


@pytest.mark.parametrize(
    ("text", "name", "port", "selected"),
    [
        ("mlx5", "mlx5_10", None, True),  # a prefix, as NCCL reads it
        ("mlx5_1", "mlx5_10", None, True),  # ...which is why '=' exists
        ("=mlx5_1", "mlx5_10", None, False),
        ("=mlx5_1", "mlx5_1", 1, True),
        ("=mlx5_0:1,mlx5_3:1", "mlx5_0", 2, False),  # the port is part of the entry
        ("=mlx5_0:1,mlx5_3:1", "mlx5_3", 1, True),
        ("^mlx5_4", "mlx5_4", 1, False),
        ("^mlx5_4", "mlx5_0", 1, True),
        ("^=mlx5_1", "mlx5_10", 1, True),
        ("^docker,lo", "docker0", None, False),
        ("^docker,lo", "eth0", None, True),
        ("^docker,lo", "lo", None, False),
    ],
)
def test_nccl_name_lists_select_as_nccl_does(text, name, port, selected):
    assert NameSelection.parse(text).selects(name, port) is selected


def test_every_ib_port_counts_by_default_and_nccl_ib_hca_narrows_it():
    before = h100()
    ports, how = counted_ports(before, SECTION, {})
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_bond_0", 1)]
    assert "every IB device" in how
    ports, how = counted_ports(before, SECTION, {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_1"]
    # the profile's own selection wins over the session's NCCL_IB_HCA
    ports, _ = counted_ports(before, FabricSection(ib_devices="mlx5_bond"), {"NCCL_IB_HCA": "mlx5_0"})
    assert [p.device for p in ports] == ["mlx5_bond_0"]


def test_interfaces_count_as_nccl_picks_them_and_only_when_up():
    reading = node("n1", eth0=netdev("eth0"), docker0=netdev("docker0"), lo=netdev("lo", "unknown"),
                   eth3=netdev("eth3", "down"))  # fmt: skip
    ports, how = counted_ports(reading, SECTION, {})
    assert [p.name for p in ports] == ["eth0"]
    assert "'^docker,lo'" in how
    with_ib = node("n1", eth0=netdev("eth0"), ib0=netdev("ib0"), ib1=netdev("ib1", "down"))
    assert [p.name for p in counted_ports(with_ib, SECTION, {})[0]] == ["ib0"]  # NCCL prefers ib*
    assert [p.name for p in counted_ports(with_ib, SECTION, {"NCCL_SOCKET_IFNAME": "=eth0"})[0]] == ["eth0"]
    assert [p.name for p in counted_ports(with_ib, SECTION, {"GLOO_SOCKET_IFNAME": "eth"})[0]] == ["eth0"]


def test_a_receive_error_that_grew_fails_naming_node_device_port_and_counter(tmp_path):
    before = h100()
    after = h100(grown_tree(tmp_path, "mlx5_0", "port_rcv_errors", "21"))  # 14 in the recording
    verdict = counter_checks([before], [after], FabricSection(saturated="warn"), "my-pod", {})
    failed = [c for c in verdict.checks if c.failed]
    assert len(failed) == 1
    (grown,) = failed
    assert (grown.metric, grown.value, grown.threshold) == ("fabric.error_increase", 7.0, 0.0)
    assert grown.labels == {"node": "gpu-a17", "device": "mlx5_0", "port": 1, "counter": "port_rcv_errors"}
    assert str(grown.ref) == "profile my-pod: fabric.max_error_increase"
    assert (
        "node gpu-a17, device mlx5_0 port 1: error counter port_rcv_errors grew by 7 (14 -> 21)" in grown.hint
    )
    (suspect,) = verdict.suspects
    assert (suspect.node, suspect.check, suspect.kind) == ("gpu-a17", "fabric", "node")
    assert suspect.reason.startswith("mlx5_0/1: port_rcv_errors +7")
    # the other ports held: one passing row each, so every counted port is in results.json
    clean = [
        c for c in verdict.checks if c.labels.get("counter") == "all" and c.metric == "fabric.error_increase"
    ]
    assert {c.labels["device"] for c in clean} == {"mlx5_1", "mlx5_bond_0"}
    assert verdict.counted == {"gpu-a17": ("mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1")}


def test_an_allowance_per_counter_lets_a_few_symbol_errors_pass(tmp_path):
    before = h100()
    after = h100(grown_tree(tmp_path, "mlx5_1", "symbol_error", "3"))
    section = FabricSection(allowed_increase={"symbol_error": 5}, saturated="warn")
    verdict = counter_checks([before], [after], section, "p", {})
    (row,) = [c for c in verdict.checks if c.labels.get("counter") == "symbol_error"]
    assert (row.value, row.threshold, row.failed) == (3.0, 5.0, False)
    assert row.ref is not None and row.ref.key == "fabric.allowed_increase.symbol_error"
    strict = counter_checks([before], [after], FabricSection(saturated="warn"), "p", {})
    assert [c.labels["counter"] for c in strict.checks if c.failed] == ["symbol_error"]


def test_saturated_counters_fail_by_default_and_only_warn_when_the_profile_says_so():
    """The recorded node has link_downed at 255 (8 bits) on mlx5_1 and excessive_buffer_overrun_errors
    at 15 (4 bits) everywhere: growth there cannot be seen."""
    before = after = h100()
    verdict = counter_checks([before], [after], SECTION, "p", {})
    pinned = sorted((c.labels["device"], c.labels["counter"], c.value) for c in verdict.checks if c.failed)
    assert pinned == [
        ("mlx5_0", "excessive_buffer_overrun_errors", 15.0),
        ("mlx5_1", "excessive_buffer_overrun_errors", 15.0),
        ("mlx5_1", "link_downed", 255.0),
        ("mlx5_bond_0", "excessive_buffer_overrun_errors", 15.0),
    ]
    row = next(c for c in verdict.checks if c.labels.get("counter") == "link_downed")
    assert row.metric == "fabric.saturated_counter" and "perfquery -x -R" in row.hint
    assert str(row.ref) == "profile p: fabric.saturated"
    warned = counter_checks([before], [after], FabricSection(saturated="warn"), "p", {})
    assert not [c for c in warned.checks if c.failed] and not warned.suspects
    assert len(warned.warnings) == 4 and "link_downed is pinned at its maximum 255" in " ".join(
        warned.warnings
    )


def test_a_counter_that_went_down_counts_what_happened_since(tmp_path):
    before = h100(grown_tree(tmp_path / "a", "mlx5_0", "port_rcv_errors", "40"))
    after = h100(grown_tree(tmp_path / "b", "mlx5_0", "port_rcv_errors", "2"))  # cleared, then 2 more
    verdict = counter_checks([before], [after], FabricSection(saturated="warn"), "p", {})
    (row,) = [c for c in verdict.checks if c.failed]
    assert row.value == 2.0 and "went down from 40 to 2" in row.hint


def test_queue_drops_on_an_interface_fail_naming_node_and_interface_where_the_profile_allows_none():
    """The recorded tc output of this VM: a tbf root qdisc before (0 drops) and after a UDP blast.
    Drops are recorded, not gated, by default; an allowance for qdisc_drops gates them."""
    before = node("ns-a", gpc0=netdev("gpc0", tc=TC_BEFORE, tx_bytes=1000), lo=netdev("lo", "unknown"))
    after = node("ns-a", gpc0=netdev("gpc0", tc=TC_AFTER, tx_bytes=5000), lo=netdev("lo", "unknown"))
    recorded = counter_checks([before], [after], SECTION, "cpu-local", {})
    assert not [c for c in recorded.checks if c.failed] and not recorded.suspects
    (row,) = [c for c in recorded.checks if c.metric == "fabric.drops"]
    assert (row.value, row.threshold, row.verdict) == (431383.0, None, "info")
    gated = FabricSection(allowed_increase={"qdisc_drops": 0})
    verdict = counter_checks([before], [after], gated, "cpu-local", {})
    (failed,) = [c for c in verdict.checks if c.failed]
    assert failed.labels == {"node": "ns-a", "device": "gpc0", "counter": "qdisc_drops"}
    assert failed.value > 0 and str(failed.ref) == "profile cpu-local: fabric.allowed_increase.qdisc_drops"
    assert failed.hint.startswith("node ns-a, interface gpc0: drop counter qdisc_drops grew by")
    assert "tc -s qdisc show dev gpc0" in failed.hint
    traffic = next(c for c in verdict.checks if c.metric == "fabric.traffic")
    assert (traffic.value, traffic.threshold) == (4000.0, None)
    assert verdict.counted == {"ns-a": ("gpc0",)}


def test_a_port_gone_from_the_last_reading_and_a_node_without_one_fail(tmp_path):
    before = [h100(node="a"), h100(node="b")]
    root = tmp_path / "sys"
    shutil.copytree(H100, root)
    shutil.rmtree(root / "class" / "infiniband" / "mlx5_1")
    after = [h100(root, node="a")]  # b gave no reading at all
    verdict = counter_checks(before, after, FabricSection(saturated="warn"), "p", {})
    failed = {(c.metric, c.labels.get("node"), c.labels.get("device")) for c in verdict.checks if c.failed}
    assert failed == {("fabric.port_present", "a", "mlx5_1"), ("fabric.node_read", "b", None)}
    gone = next(c for c in verdict.checks if c.metric == "fabric.port_present")
    assert "node a, device mlx5_1 port 1 was in the first reading and is gone" in gone.hint


def test_bytes_moved_read_ib_data_counters_in_4_byte_words(tmp_path):
    before = h100()
    word_count = before.ib_ports[0].counters["port_xmit_data"]
    after = h100(grown_tree(tmp_path, "mlx5_0", "port_xmit_data", str(word_count + 250)))
    assert moved_bytes(before.ib_ports[0], after.ib_ports[0]) == 1000.0
