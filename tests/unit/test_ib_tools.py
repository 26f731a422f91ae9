"""ibstat, ibstatus, ibv_devinfo, perfquery and pasted sysfs dumps, on recorded real outputs.

Each test names the fabric behaviour its sample stands for (SOURCES.md in tests/data/infiniband/
says where each file came from).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.ib_tools import (
    detect_format,
    parse_fabric,
    parse_ib_text,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    parse_perfquery,
    parse_sysfs_dump,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "infiniband"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def by_device(ports):
    return {(p.device, p.port): p for p in ports}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ibstat_h100_8x400_ndr_gpud.txt", "ibstat"),
        ("ibstat_bluefield3_down_linkup_no_sm.txt", "ibstat"),
        ("ibstatus_a100_hdr_gpud.txt", "ibstatus"),
        ("ibv_devinfo_vv_cx6_hdr_second_port_disabled_ucx9908.txt", "ibv_devinfo"),
        ("ibv_devinfo_spaces_two_hcas_cut_deepep60.txt", "ibv_devinfo"),
        ("perfquery_x_extended_rhel75_infinibanddiags16.txt", "perfquery"),
        ("perfquery_ibsim_prompt_cut_ibsim1.txt", "perfquery"),
        ("sysfs_counters_for_loop_saturated_gpud943.txt", "sysfs"),
        ("sysfs_counters_grep_i40iw_no_pma_cut_nodeexporter966.txt", "sysfs"),
    ],
)
def test_every_recorded_output_is_recognised_and_parses(name, kind):
    text = read(name)
    assert detect_format(text) == kind
    assert parse_ib_text(text, name)


def test_ibstat_h100_node_all_ndr_ports_active_at_400():
    """A healthy H100 node: every IB port Active/LinkUp at 400 Gb/s."""
    ports = parse_ibstat(read("ibstat_h100_8x400_ndr_gpud.txt"))
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    assert len(ib) == 8
    assert {(p.state, p.phys_state, p.rate_gbps) for p in ib} == {("ACTIVE", "LinkUp", 400.0)}
    assert all(p.source == "ibstat" and p.port == 1 for p in ports)


def test_ibstat_roce_node_with_two_ports_down_and_one_polling():
    """Ports below rate or down are visible per device: the check names them."""
    ports = by_device(parse_ibstat(read("ibstat_h100_roce_two_down_polling_gpud.txt")))
    assert len(ports) == 12
    down = sorted(dev for (dev, _), p in ports.items() if p.state == "DOWN")
    assert down == ["mlx5_11", "mlx5_5"]
    assert {ports[(d, 1)].rate_gbps for d in down} == {40.0}
    assert [dev for (dev, _), p in ports.items() if p.phys_state == "Polling"] != []
    assert {p.link_layer for p in ports.values()} == {"Ethernet"}
    assert sorted({p.rate_gbps for p in ports.values() if p.state == "ACTIVE"}) == [100.0, 400.0]


def test_ibstat_stopped_by_ibpanic_keeps_the_ports_printed_before():
    """ibstat exit 255 part-way: 8 CAs were printed; the missing one shows as a missing port, not a crash."""
    ports = parse_ibstat(read("ibstat_a100_hdr_ibpanic_partial_gpud.txt"))
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert {p.rate_gbps for p in ports} == {200.0}


def test_ibstat_cabled_but_no_subnet_manager_is_down_with_physical_link_up():
    ports = parse_ibstat(read("ibstat_bluefield3_down_linkup_no_sm.txt"))
    assert [(p.device, p.state, p.phys_state, p.rate_gbps) for p in ports] == [
        ("mlx5_0", "DOWN", "LinkUp", 100.0),
        ("mlx5_1", "DOWN", "LinkUp", 100.0),
    ]


def test_ibstat_with_ibwarn_lines_two_ports_and_a_cut():
    """ConnectX-3: port 1 administratively disabled, port 2 up at FDR 56; the paste ends mid-port."""
    ports = by_device(parse_ibstat(read("ibstat_cx3_ibwarn_port1_disabled_cut_rdmacore847.txt")))
    assert sorted(ports) == [("mlx4_0", 1), ("mlx4_0", 2)]
    assert (ports["mlx4_0", 1].state, ports["mlx4_0", 1].phys_state, ports["mlx4_0", 1].rate_gbps) == (
        "DOWN",
        "Disabled",
        10.0,
    )
    assert (ports["mlx4_0", 2].state, ports["mlx4_0", 2].rate_gbps) == ("ACTIVE", 56.0)
    assert ports["mlx4_0", 2].link_layer is None  # cut off before it


def test_ibstat_space_indented_roce_with_a_disabled_port_cut_off():
    ports = by_device(parse_ibstat(read("ibstat_roce_200_and_disabled_spaces_cut_mooncake1999.txt")))
    assert ports["mlx5_0", 1].rate_gbps == 200.0 and ports["mlx5_0", 1].link_layer == "Ethernet"
    assert (ports["mlx5_10", 1].state, ports["mlx5_10", 1].phys_state, ports["mlx5_10", 1].rate_gbps) == (
        "DOWN",
        "Disabled",
        None,
    )


def test_ibstatus_hdr_ports():
    ports = parse_ibstatus(read("ibstatus_a100_hdr_gpud.txt"))
    assert len(ports) == 9
    first = ports[0]
    assert (first.device, first.port, first.state, first.phys_state, first.rate_gbps) == (
        "mlx5_0",
        1,
        "ACTIVE",
        "LinkUp",
        200.0,
    )
    assert first.rate_text == "200 Gb/sec (4X HDR)"


def test_ibstatus_through_pdsh_names_the_node_of_every_port():
    """The seed's runbook runs `pdsh -w node[001-008] ibstatus`: each line carries `host: `."""
    lines, seen = [], 0
    for line in read("ibstatus_a100_hdr_gpud.txt").splitlines():
        seen += line.startswith("Infiniband device")
        if line.strip():  # pdsh drops blank lines; the first 5 ports answer from node001, the rest node002
            lines.append(f"node00{1 if seen <= 5 else 2}: {line}")
    ports = parse_ibstatus("\n".join(lines))
    assert len(ports) == 9
    assert [p.node for p in ports] == ["node001"] * 5 + ["node002"] * 4
    assert ports[0].name == "node001:mlx5_0/1"
    assert ports[0].rate_gbps == 200.0


def test_ibv_devinfo_verbose_rate_is_width_times_lane_speed():
    """-v prints 4X and 50.0 Gbps per lane: an HDR port at 200; a disabled port has no rate, and says why."""
    ports = by_device(parse_ibv_devinfo(read("ibv_devinfo_vv_cx6_hdr_second_port_disabled_ucx9908.txt")))
    up, down = ports["mlx5_0", 1], ports["mlx5_1", 1]
    assert (up.state, up.phys_state, up.rate_gbps, up.link_layer) == ("ACTIVE", "LinkUp", 200.0, "InfiniBand")
    assert up.rate_text == "4X (2) x 50.0 Gbps (64)"
    assert (down.state, down.phys_state, down.rate_gbps) == ("DOWN", "Disabled", None)
    assert "invalid speed" in down.unreadable["rate"]


def test_ibv_devinfo_without_verbose_has_state_but_no_rate():
    ports = parse_ibv_devinfo(read("ibv_devinfo_spaces_two_hcas_cut_deepep60.txt"))
    assert [(p.device, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_12", "DOWN", None, None, "Ethernet")
    ]


def test_perfquery_extended_counters_map_to_sysfs_names():
    (port,) = parse_perfquery(read("perfquery_x_extended_rhel75_infinibanddiags16.txt"))
    assert (port.device, port.port) == ("lid10", 1)
    assert set(port.counters) >= {
        "symbol_error",
        "link_downed",
        "port_rcv_errors",
        "port_xmit_discards",
        "VL15_dropped",
        "port_xmit_data",
        "unicast_rcv_packets",
        "qp1_dropped",
    }
    assert set(port.counters.values()) == {0}


def test_perfquery_after_a_prompt_without_header_takes_the_port_from_portselect():
    (port,) = parse_perfquery(read("perfquery_ibsim_prompt_cut_ibsim1.txt"))
    assert (port.device, port.port) == ("perfquery", 1)
    assert port.counters["port_xmit_constraint_errors"] == 0
    assert len(port.counters) == 8


def test_sysfs_cat_loop_names_the_port_from_the_prompt_and_reads_saturated_counters():
    (port,) = parse_sysfs_dump(read("sysfs_counters_for_loop_saturated_gpud943.txt"))
    assert (port.device, port.port) == ("mlx5_1", 1)
    assert port.counters["link_downed"] == 255
    assert port.counters["port_xmit_discards"] == 65535
    assert port.counters["port_xmit_wait"] == 4294967295
    assert len(port.counters) == 21


def test_sysfs_grep_of_an_iwarp_nic_without_pma_marks_every_counter_unreadable():
    (port,) = parse_sysfs_dump(read("sysfs_counters_grep_i40iw_no_pma_cut_nodeexporter966.txt"))
    assert (port.device, port.port) == ("i40iw0", 1)
    assert port.counters == {}
    assert len(port.unreadable) == 8
    assert set(port.unreadable.values()) == {"not a counter: 'N/A (no PMA)'"}


def test_sysfs_grep_of_attributes_and_counters_built_from_the_recorded_tree():
    """`grep . /sys/class/infiniband/*/ports/*/{state,rate,counters/*}` over the recorded H100 tree."""
    root = DATA / "sysfs_h100_gpud"
    lines = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.parent.name in ("1", "counters"):
            lines.append(f"/sys/{path.relative_to(root)}:{path.read_text().strip()}")
    ports = by_device(parse_sysfs_dump("\n".join(lines)))
    assert ports["mlx5_0", 1].rate_gbps == 400.0 and ports["mlx5_0", 1].state == "ACTIVE"
    assert ports["mlx5_1", 1].counters["link_downed"] == 255


def test_text_that_is_no_tool_output_is_an_error_naming_the_file():
    with pytest.raises(ParseError, match=r"node3\.log: not an ibstat"):
        parse_ib_text("hello\nworld\n", "node3.log")


def test_ibstat_without_ports_is_an_error():
    with pytest.raises(ParseError, match=r"ibstat-empty\.txt: .*no \"CA"):
        parse_fabric("CA 'mlx5_0'\n\tCA type: MT4129\n", "ibstat-empty.txt")
