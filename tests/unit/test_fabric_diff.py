"""Counter differences between two fabric snapshots, and tc's qdisc statistics.

The "before" readings are recorded real ones (the H100 sysfs tree, this VM's tc JSON); "after"
readings are the same trees with one file changed in the test, so every case says exactly which
counter moved and what the diff must call it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_diff import counter_kind, diff_ports, diff_snapshots
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, IbPort, NetInterface, parse_snapshot
from pytest_gpucluster.parsers.ib_tools import parse_sysfs_dump
from pytest_gpucluster.parsers.tc_qdisc import parse_tc_qdisc_json, root_drops
from pytest_gpucluster.workloads.fabric_probe import snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "infiniband" / "sysfs_h100_gpud"
NETDEV = DATA / "netdev"


@pytest.fixture
def h100_tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(H100, root)
    return root


def counter_file(root: Path, device: str, name: str, group: str = "counters") -> Path:
    return root / "class" / "infiniband" / device / "ports" / "1" / group / name


def read(root: Path) -> FabricSnapshot:
    return parse_snapshot(snapshot(root, node="gpu-node-07"))


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("symbol_error", "error"),
        ("link_downed", "error"),
        ("port_rcv_errors", "error"),
        ("port_xmit_discards", "error"),
        ("VL15_dropped", "error"),
        ("hw_out_of_buffer", "error"),
        ("rx_crc_errors", "error"),
        ("tx_dropped", "error"),
        ("qdisc_drops", "error"),
        ("port_xmit_data", "traffic"),
        ("rx_bytes", "traffic"),
        ("port_xmit_wait", "other"),
        ("hw_lifespan", "other"),
        ("hw_req_cqe_flush_error", "other"),
    ],
)
def test_counter_classes(name, kind):
    assert counter_kind(name) == kind


def test_unchanged_node_has_no_changes_except_counters_pinned_at_their_maximum(h100_tree):
    """A port whose 4-bit/8-bit error counter is already at max cannot show growth: flagged, every time."""
    diff = read(h100_tree).ib_ports, read(h100_tree).ib_ports
    result = diff_ports(*diff)
    assert all(c.increase == 0 for c in result.changes)
    pinned = {(c.device, c.counter) for c in result.errors()}
    assert ("mlx5_1", "link_downed") in pinned  # 255, 8 bits
    assert ("mlx5_0", "excessive_buffer_overrun_errors") in pinned  # 15, 4 bits
    assert all(c.saturated for c in result.errors())
    assert (
        "pinned at its maximum 255"
        in next(c for c in result.errors() if c.counter == "link_downed").describe()
    )


def test_symbol_errors_that_grew_are_an_error_naming_node_device_and_port(h100_tree):
    before = read(h100_tree)
    counter_file(h100_tree, "mlx5_0", "symbol_error").write_text("3\n")
    data_file = counter_file(h100_tree, "mlx5_0", "port_xmit_data")
    data_file.write_text(str(int(data_file.read_text()) + 1_000_000) + "\n")
    diff = diff_snapshots(before, read(h100_tree))

    grown = [c for c in diff.errors() if not c.saturated]
    assert [(c.node, c.device, c.port, c.counter, c.increase) for c in grown] == [
        ("gpu-node-07", "mlx5_0", 1, "symbol_error", 3)
    ]
    assert grown[0].describe() == "gpu-node-07 mlx5_0 port 1: symbol_error +3 (0 -> 3)"
    traffic = diff.of_kind("traffic")
    assert [(c.device, c.counter, c.increase) for c in traffic] == [("mlx5_0", "port_xmit_data", 1_000_000)]


def test_a_counter_that_went_down_is_reported_as_a_reset_with_unknown_increase(h100_tree):
    before = read(h100_tree)
    counter_file(h100_tree, "mlx5_0", "port_rcv_errors").write_text("2\n")  # was 14: perfquery -R, reload
    diff = diff_snapshots(before, read(h100_tree))
    (reset,) = [c for c in diff.changes if c.went_down]
    assert (reset.counter, reset.before, reset.after, reset.increase, reset.at_least) == (
        "port_rcv_errors",
        14,
        2,
        None,
        2,
    )
    assert reset in diff.errors()
    assert "went down from 14 to 2" in reset.describe() and "unknown" in reset.describe()


def test_hw_counters_are_diffed_too(h100_tree):
    before = read(h100_tree)
    path = counter_file(h100_tree, "mlx5_bond_0", "out_of_buffer", "hw_counters")
    path.write_text(str(int(path.read_text()) + 12) + "\n")
    diff = diff_snapshots(before, read(h100_tree))
    assert [(c.device, c.counter, c.increase) for c in diff.errors() if not c.saturated] == [
        ("mlx5_bond_0", "hw_out_of_buffer", 12)
    ]


def test_ports_that_appear_or_disappear_are_listed(h100_tree):
    before = read(h100_tree)
    shutil.rmtree(h100_tree / "class" / "infiniband" / "mlx5_1")
    diff = diff_snapshots(before, read(h100_tree))
    assert diff.disappeared == ("gpu-node-07 mlx5_1 port 1",)
    reverse = diff_snapshots(read(h100_tree), before)
    assert reverse.appeared == ("gpu-node-07 mlx5_1 port 1",)


def test_saturated_counters_of_a_pasted_cat_loop_are_flagged_between_two_pastes():
    """gpud#943's live node: link_downed 255, port_xmit_discards 65535 — two readings, both pinned."""
    text = (DATA / "infiniband" / "sysfs_counters_for_loop_saturated_gpud943.txt").read_text()
    first, second = parse_sysfs_dump(text), parse_sysfs_dump(text)
    diff = diff_ports(first, second)
    assert {c.counter for c in diff.errors()} == {
        "link_downed",
        "port_xmit_discards",
        "excessive_buffer_overrun_errors",
    }
    assert {c.counter for c in diff.changes if c.kind == "other"} == {
        "port_xmit_wait"
    }  # 32-bit, pinned, not an error


def test_recorded_tbf_qdisc_json_before_and_after_a_udp_blast():
    before = parse_tc_qdisc_json((NETDEV / "tc_s_j_qdisc_tbf_before_this_vm.json").read_text())
    after = parse_tc_qdisc_json((NETDEV / "tc_s_j_qdisc_tbf_after_udp_blast_this_vm.json").read_text())
    assert [(q.kind, q.handle, q.root) for q in after] == [("tbf", "8004:", True)]
    assert (root_drops(before), root_drops(after)) == (0, 431383)
    assert after[0].overlimits == 436677 and after[0].packets == 1775
    noqueue = parse_tc_qdisc_json((NETDEV / "tc_s_j_qdisc_veth_default_noqueue_this_vm.json").read_text())
    assert [(q.kind, q.drops) for q in noqueue] == [("noqueue", 0)]


def test_root_drops_do_not_double_count_children():
    text = (
        '[{"kind":"mq","handle":"0:","root":true,"drops":7},'
        '{"kind":"fq_codel","handle":"0:","parent":":1","drops":4},'
        '{"kind":"fq_codel","handle":"0:","parent":":2","drops":3}]'
    )
    assert root_drops(parse_tc_qdisc_json(text)) == 7
    assert root_drops(parse_tc_qdisc_json("[]")) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('Error: Cannot find device "fab9".', "not JSON at line 1"),
        ('{"kind": "tbf"}', "expected a JSON array of qdisc objects"),
        ('[{"handle": "1:"}]', "qdisc #0 has no 'kind'"),
        ('[{"kind": "tbf", "drops": "many"}]', "'drops' is 'many', expected an integer"),
    ],
)
def test_tc_output_that_is_not_qdisc_json_is_a_clear_error(text, message):
    with pytest.raises(ParseError, match=message):
        parse_tc_qdisc_json(text, source="node-3 fab0")


def test_netdev_qdisc_drops_diff_as_an_error_and_statistics_did_not_move():
    """This VM's finding as data: tbf drops counted only by the qdisc; the diff names node and interface."""
    tx_before = {"tx_packets": 8, "tx_dropped": 0, "tx_errors": 0}
    tx_after = {"tx_packets": 8 + 1775, "tx_dropped": 0, "tx_errors": 0}
    drops = [
        root_drops(parse_tc_qdisc_json((NETDEV / name).read_text()))
        for name in ("tc_s_j_qdisc_tbf_before_this_vm.json", "tc_s_j_qdisc_tbf_after_udp_blast_this_vm.json")
    ]
    before = NetInterface("node-a", "fab0", "up", 10000, 1500, {**tx_before, "qdisc_drops": drops[0]})
    after = NetInterface("node-a", "fab0", "up", 10000, 1500, {**tx_after, "qdisc_drops": drops[1]})
    diff = diff_ports([before], [after])
    (error,) = diff.errors()
    assert (error.node, error.device, error.port, error.counter, error.increase) == (
        "node-a",
        "fab0",
        None,
        "qdisc_drops",
        431383,
    )
    assert error.describe() == "node-a fab0: qdisc_drops +431383 (0 -> 431383)"
    assert [c.counter for c in diff.of_kind("traffic")] == ["tx_packets"]


def test_ib_ports_and_interfaces_of_the_same_name_are_not_confused():
    ib = IbPort("n", "eth0", 1, "ACTIVE", "LinkUp", 100.0, "100", "Ethernet", {"symbol_error": 0})
    net = NetInterface("n", "eth0", "up", 100000, 1500, {"rx_errors": 0})
    diff = diff_ports([ib, net], [ib, net])
    assert diff.changes == () and diff.appeared == () and diff.disappeared == ()
