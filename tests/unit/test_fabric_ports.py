"""Fabric port values and the sysfs reader, on a real H100 node's sysfs tree and on this machine's /sys.

tests/data/infiniband/sysfs_h100_gpud/ is a recorded sysfs root (SOURCES.md there): the reader walks
it exactly as it walks /sys on a node, and the parser must give every port's state, rate and counters.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_ports import (
    parse_phys_state,
    parse_port_state,
    parse_rate_gbps,
    parse_snapshot,
)
from pytest_gpucluster.workloads import fabric_probe
from pytest_gpucluster.workloads.fabric_probe import snapshot

H100_SYSFS = Path(__file__).resolve().parents[1] / "data" / "infiniband" / "sysfs_h100_gpud"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("4: ACTIVE", "ACTIVE"),  # sysfs, ibstatus
        ("1: DOWN", "DOWN"),
        ("Active", "ACTIVE"),  # ibstat
        ("Initializing", "INIT"),  # ibstat of a port waiting for a subnet manager
        ("PORT_ACTIVE (4)", "ACTIVE"),  # ibv_devinfo
        ("PORT_DOWN (1)", "DOWN"),
        ("2: INIT", "INIT"),
        ("Armed", "ARMED"),
    ],
)
def test_port_state_words_of_every_tool(text, state):
    assert parse_port_state(text) == state


def test_unknown_port_state_is_kept_visible_not_guessed():
    assert parse_port_state("Sleeping") == "SLEEPING"
    assert parse_port_state("") is None


@pytest.mark.parametrize(
    ("text", "phys"),
    [
        ("5: LinkUp", "LinkUp"),
        ("LINK_UP (5)", "LinkUp"),
        ("Polling", "Polling"),
        ("2: Polling", "Polling"),
        ("3: Disabled", "Disabled"),
        ("DISABLED (3)", "Disabled"),
        ("invalid physical state (0)", None),
    ],
)
def test_physical_state_words_of_every_tool(text, phys):
    assert parse_phys_state(text) == phys


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200", 200.0),
        ("100 Gb/sec (2X HDR)", 100.0),
        ("200 Gb/sec (2X NDR)", 200.0),
        ("2.5", 2.5),
        ("56", 56.0),
    ],
)
def test_rate_in_gbps(text, gbps):
    assert parse_rate_gbps(text) == gbps


def test_rate_that_is_not_a_rate_is_an_error_naming_the_value():
    with pytest.raises(ParseError, match=r"'fast'.*Gb/s"):
        parse_rate_gbps("fast")


def test_reader_and_parser_on_a_recorded_h100_sysfs_tree():
    """An H100 node: 400G NDR InfiniBand ports and a 200G RoCE bond, counters and hw_counters read."""
    data = snapshot(H100_SYSFS, node="h100-node")
    json.dumps(data)  # plain JSON-able data, as it crosses the rank boundary
    snap = parse_snapshot(data)
    ports = {p.device: p for p in snap.ib_ports}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
    ib = ports["mlx5_0"]
    assert (ib.node, ib.port, ib.state, ib.phys_state, ib.rate_gbps, ib.link_layer) == (
        "h100-node",
        1,
        "ACTIVE",
        "LinkUp",
        400.0,
        "InfiniBand",
    )
    assert ib.rate_text == "400 Gb/sec (4X NDR)"
    bond = ports["mlx5_bond_0"]
    assert (bond.rate_gbps, bond.link_layer) == (200.0, "Ethernet")
    # counters/* by sysfs name, hw_counters/* prefixed hw_
    assert ports["mlx5_1"].counters["link_downed"] == 255
    assert ports["mlx5_1"].counters["excessive_buffer_overrun_errors"] == 15  # a 4-bit counter, pinned
    assert ib.counters["port_rcv_errors"] == 14
    assert "hw_out_of_buffer" in ib.counters and "port_rcv_errors" in ib.counters
    assert ib.counters["port_xmit_data"] > 0
    assert not ib.unreadable
    assert snap.interfaces == ()  # the recorded tree has no class/net


def test_reader_records_unreadable_and_missing_files_and_never_stops(tmp_path):
    port = tmp_path / "class" / "infiniband" / "mlx5_9" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    (port / "rate").mkdir()  # reading it fails with EISDIR, as an unreadable attribute would
    (port / "counters" / "symbol_error").write_text("7\n")
    (port / "counters" / "port_rcv_errors").write_text("N/A (no PMA)\n")
    net = tmp_path / "class" / "net" / "ib0"
    (net / "statistics").mkdir(parents=True)
    (net / "operstate").write_text("down\n")
    (net / "statistics" / "rx_errors").write_text("3\n")

    data = snapshot(tmp_path, node="n1")
    reading = data["infiniband"]["mlx5_9"]["ports"]["1"]
    assert reading["errors"]["rate"].startswith(errno.errorcode[errno.EISDIR])
    assert reading["errors"]["link_layer"] == "missing"
    assert data["net"]["ib0"]["errors"]["speed"] == "missing"

    snap = parse_snapshot(data)
    (ib,) = snap.ib_ports
    assert (ib.state, ib.phys_state, ib.rate_gbps, ib.link_layer) == ("DOWN", "Disabled", None, None)
    assert ib.counters == {"symbol_error": 7}
    assert ib.unreadable["counters/port_rcv_errors"] == "not a counter: 'N/A (no PMA)'"
    (iface,) = snap.interfaces
    assert (iface.name, iface.operstate, iface.speed_mbps, iface.counters) == (
        "ib0",
        "down",
        None,
        {"rx_errors": 3},
    )


def test_an_unreadable_counter_is_named_with_its_directory(tmp_path):
    (tmp_path / "hw_counters").mkdir()
    (tmp_path / "hw_counters" / "out_of_buffer").write_text("12\n")
    errors: dict[str, str] = {}
    read = fabric_probe._read_attrs(
        tmp_path / "hw_counters", ["out_of_buffer", "gone"], errors, "hw_counters/"
    )
    assert read == {"out_of_buffer": "12"} and errors == {"hw_counters/gone": "missing"}


@pytest.mark.skipif(
    not Path("/sys/class/net/lo/speed").exists(), reason="this machine has no /sys/class/net/lo"
)
def test_reader_on_this_machines_sys_records_einval_of_a_link_without_speed():
    """The kernel answers EINVAL to reading `speed` of lo (and of a down link): recorded, not raised."""
    try:
        Path("/sys/class/net/lo/speed").read_text()
        pytest.skip("this kernel reports a speed for lo, so there is no EINVAL to see here")
    except OSError as exc:
        assert exc.errno == errno.EINVAL
    snap = parse_snapshot(snapshot("/sys", interfaces=["lo"]))
    (lo,) = snap.interfaces
    assert lo.speed_mbps is None
    assert lo.unreadable["speed"] == "EINVAL: Invalid argument"
    assert lo.mtu and lo.mtu > 0
    assert "rx_bytes" in lo.counters


def test_qdisc_reading_feeds_the_interface_counters(monkeypatch, tmp_path):
    """With qdisc=True the root qdisc's drops become counter `qdisc_drops` (tc's real JSON, recorded here)."""
    tc_json = (H100_SYSFS.parents[1] / "netdev" / "tc_s_j_qdisc_tbf_after_udp_blast_this_vm.json").read_text()
    net = tmp_path / "class" / "net" / "fab0"
    (net / "statistics").mkdir(parents=True)
    (net / "statistics" / "tx_dropped").write_text("0\n")
    seen: list[list[str]] = []

    def fake_run(argv, **kwargs):
        seen.append(list(argv))
        return type("Done", (), {"returncode": 0, "stdout": tc_json, "stderr": ""})()

    monkeypatch.setattr(fabric_probe.subprocess, "run", fake_run)
    snap = parse_snapshot(snapshot(tmp_path, qdisc=True, tc="tc"))
    assert seen and seen[0][1:] == ["-s", "-j", "qdisc", "show", "dev", "fab0"]
    (iface,) = snap.interfaces
    assert iface.counters == {"tx_dropped": 0, "qdisc_drops": 431383}


def test_missing_tc_is_recorded_as_the_reason(tmp_path):
    (tmp_path / "class" / "net" / "eth9").mkdir(parents=True)
    data = snapshot(tmp_path, qdisc=True, tc=os.path.join(str(tmp_path), "no-such-tc"))
    assert "is not installed" in data["net"]["eth9"]["qdisc"]["error"]
    (iface,) = parse_snapshot(data).interfaces
    assert "qdisc_drops" not in iface.counters and "qdisc" in iface.unreadable


def test_snapshot_that_is_not_one_names_the_source():
    with pytest.raises(ParseError, match=r"node-7\.json: expected a fabric snapshot"):
        parse_snapshot({"hello": 1}, source="node-7.json")
