"""The nvidia-smi parsers (topo -m, nvlink -s/-gt, -L, --query-gpu CSV, the main table) on recorded real outputs.

Every file under tests/data/nvidia_smi/ is a real output; SOURCES.md there says where each came from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers import nvidia_nvlink, nvidia_smi, nvidia_topo
from pytest_gpucluster.parsers.nvidia_nvlink import (
    LinkBytes,
    LinkCounters,
    LinkStatus,
    counter_delta,
    inactive_links,
    parse_nvlink_counters,
    parse_nvlink_status,
    parse_nvlink_text,
    slow_links,
)
from pytest_gpucluster.parsers.nvidia_smi import (
    INVENTORY_ARGS,
    parse_gpu_header,
    parse_gpu_inventory,
    parse_gpu_list,
    parse_mib,
    parse_query_csv,
    parse_smi_table,
)
from pytest_gpucluster.parsers.nvidia_topo import parse_topo_text, topology_mismatches

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
TOPO_FILES = sorted(p.name for p in DATA.glob("topo_*.txt"))


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --- nvidia-smi topo -m ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOPO_FILES)
def test_every_recorded_topology_parses_symmetric_and_complete(name):
    topo = parse_topo_text(read(name))
    assert topo.gpus, name
    # "_cut_" files: the paste stops inside the matrix, so later rows are missing and the last one is short.
    cut = "_cut_" in name
    last = list(topo.matrix)[-1]
    for a in topo.gpus:
        if a in topo.matrix:
            assert topo.matrix[a][a] == "X" or (cut and a == last)
        else:
            assert cut, (name, a)
    for row, cells in topo.matrix.items():
        for col, cell in cells.items():
            if cut and row == last and cell is None:
                continue
            assert cell is not None, (row, col)
            assert topo.matrix.get(col, {}).get(row, cell) in (cell, *([None] if cut else [])), (row, col)


def test_dgx_h100_with_nic_legend():
    topo = parse_topo_text(read("topo_dgx_h100_13nic.txt"))
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nics == tuple(f"NIC{i}" for i in range(13))
    assert topo.nic_names["NIC0"] == "mlx5_ib0"
    assert topo.nic_names["NIC12"] == "mlx5_eth4"
    assert topo.matrix["GPU0"]["GPU7"] == "NV18"
    assert topo.matrix["GPU0"]["NIC0"] == "PIX"
    assert topo.matrix["GPU0"]["NIC1"] == "PXB"
    assert topo.matrix["GPU4"]["NIC2"] == "SYS"
    assert topo.matrix["NIC8"]["NIC9"] == "PIX"
    assert topo.cpu_affinity["GPU0"] == "0-55,112-167"
    assert topo.cpu_affinity["GPU4"] == "56-111,168-223"
    assert topo.numa_affinity["GPU7"] == "1"
    assert topo.gpu_numa_id["GPU3"] is None  # printed "N/A"
    assert "NIC0" not in topo.cpu_affinity  # NIC rows print no affinity
    assert topology_mismatches(topo, "NV18") == []


def test_dgx_a100_nv12_with_17_nics():
    topo = parse_topo_text(read("topo_a100_8gpu_17nic.txt"))
    assert len(topo.gpus) == 8 and len(topo.nics) == 17
    assert topo.matrix["GPU0"]["GPU7"] == "NV12"
    assert topo.matrix["GPU6"]["NIC12"] == "PXB"
    assert topo.matrix["NIC16"]["NIC16"] == "X"  # the row ends in "X " with a trailing blank
    assert topo.nic_names["NIC16"] == "mlx5_bond_0"
    assert topo.cpu_affinity["GPU5"] == "0-103"
    assert topology_mismatches(topo, "NV12") == []
    # An H100 profile run on this A100 box names all 28 pairs and what they are instead.
    wrong = topology_mismatches(topo, "NV18")
    assert len(wrong) == 28
    assert wrong[0] == ("GPU0", "GPU1", "NV12")


def test_pcie_only_box_reports_every_pair():
    topo = parse_topo_text(read("topo_a10_4gpu_pcie.txt"))
    assert topo.matrix["GPU0"]["GPU3"] == "SYS"
    assert topo.matrix["NIC0"]["NIC1"] == "PIX"
    assert topology_mismatches(topo, "NV18") == [
        ("GPU0", "GPU1", "SYS"),
        ("GPU0", "GPU2", "SYS"),
        ("GPU0", "GPU3", "SYS"),
        ("GPU1", "GPU2", "SYS"),
        ("GPU1", "GPU3", "SYS"),
        ("GPU2", "GPU3", "SYS"),
    ]


def test_tab_separated_output():
    topo = parse_topo_text(read("topo_rtx4090_8gpu_tabs.txt"))
    assert topo.nics == ("NIC0", "NIC1")
    assert topo.nic_names == {}  # this paste stopped before the NIC legend
    assert topo.matrix["GPU6"]["NIC0"] == "PHB"
    assert topo.matrix["GPU7"]["GPU0"] == "SYS"
    assert topo.cpu_affinity["GPU4"] == "56-111,168-223"
    assert topo.numa_affinity["GPU0"] == "0"
    assert topo.gpu_numa_id["GPU0"] is None


def test_partial_nvlink_box_topology_agrees_with_its_link_status():
    # One box, two commands: GPU0-GPU1 share an NVLink bridge (NV4), GPU2 has none.
    topo = parse_topo_text(read("topo_rtx_a6000_3gpu_tabs_nv4.txt"))
    status = parse_nvlink_status(read("nvlink_s_rtx_a6000_tabs_all_inactive.txt"))
    assert topo.matrix["GPU0"]["GPU1"] == "NV4"
    assert topology_mismatches(topo, "NV4") == [("GPU0", "GPU2", "NODE"), ("GPU1", "GPU2", "NODE")]
    assert [len(status.gpus[i].links) for i in "012"] == [4, 4, 0]
    assert topo.numa_affinity == {"GPU0": "0", "GPU1": "0", "GPU2": "0"}


def test_single_space_between_affinity_columns():
    topo = parse_topo_text(read("topo_rtx4090_8gpu_numa_per_gpu.txt"))
    assert topo.cpu_affinity["GPU4"] == "112-127,240-254"
    assert topo.numa_affinity["GPU4"] == "7"
    assert topo.numa_affinity["GPU0"] == "3"
    assert topo.nics == ()


def test_old_driver_names_nic_columns_after_the_device():
    topo = parse_topo_text(read("topo_dgx1_v100_old_mlx5_columns.txt"))
    assert topo.nics == ("mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1")  # printed order, not sorted
    assert topo.nic_names == {n: n for n in topo.nics}
    assert topo.matrix["GPU0"]["mlx5_0"] == "PIX"
    assert topo.matrix["mlx5_1"]["GPU2"] == "PIX"
    assert topo.matrix["GPU0"]["GPU1"] == "NV1"
    assert topo.matrix["GPU0"]["GPU3"] == "NV2"
    assert topo.matrix["GPU0"]["GPU5"] == "SYS"  # hybrid cube mesh: not every pair is linked
    assert topo.cpu_affinity["GPU7"] == "0-19,40-59"
    assert topo.numa_affinity == {} and topo.gpu_numa_id == {}  # columns this driver does not print
    assert ("GPU0", "GPU5", "SYS") in topology_mismatches(topo, "NV2")


def test_missing_gpu_numa_id_column_and_na_numa():
    topo = parse_topo_text(read("topo_gtx1080ti_2gpu_no_numa_id.txt"))
    assert topo.matrix["GPU0"]["GPU1"] == "PHB"
    assert topo.cpu_affinity == {"GPU0": "0-11", "GPU1": "0-11"}
    assert topo.numa_affinity == {"GPU0": None, "GPU1": None}
    assert topo.gpu_numa_id == {}


def test_terminal_clipped_output_keeps_what_is_readable():
    # The NIC columns were cut off the header by the terminal width; the NIC rows and legend remain.
    topo = parse_topo_text(read("topo_h800_8gpu_terminal_clipped.txt"))
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nics == ("NIC0", "NIC1", "NIC2", "NIC3")
    assert topo.nic_names["NIC3"] == "mlx5_3"
    assert topo.matrix["GPU0"]["GPU7"] == "NV8"
    assert topo.matrix["NIC0"]["GPU1"] == "PIX"
    assert "NIC0" not in topo.matrix["GPU0"]  # no column to read it from
    assert topo.cpu_affinity["GPU0"] is None  # printed "-31,64-95": the leading "0" was cut
    assert topo.cpu_affinity["GPU4"] == "32-63,96-127"
    assert topology_mismatches(topo, "NV8") == []


def test_legend_cut_mid_line():
    topo = parse_topo_text(read("topo_h100_4gpu_nv6_issue_excerpt.txt"))
    assert topo.matrix["GPU0"]["GPU3"] == "NV6"
    assert topo.cpu_affinity["GPU0"] == "6,14,22,30"
    assert topo.numa_affinity == {"GPU0": "3", "GPU1": "1", "GPU2": "7", "GPU3": "5"}
    assert topo.nic_names == {}


def test_elided_rows_are_skipped_and_missing_cells_are_none():
    lines = read("topo_dgx_h100_13nic.txt").splitlines()
    # Header, GPU0 and GPU1, then "...", then the start of GPU7's row.
    text = "\n".join([*lines[:3], "...", "GPU7    NV18    NV18"]) + "\n"  # ends with a line end: not cut
    topo = parse_topo_text(text)
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))  # from the header
    assert set(topo.matrix) == {"GPU0", "GPU1", "GPU7"}
    assert topo.matrix["GPU7"]["GPU1"] == "NV18"
    assert topo.matrix["GPU7"]["GPU2"] is None
    assert "GPU7" not in topo.cpu_affinity
    assert topo.link("GPU7", "GPU0") == "NV18"
    # GPU2..GPU6 have no row and GPU7's row stops early: those pairs cannot be confirmed.
    wrong = topology_mismatches(topo, "NV18")
    assert ("GPU2", "GPU3", None) in wrong
    assert ("GPU0", "GPU2", "NV18") not in wrong  # read from GPU0's row


def test_ansi_codes_from_a_terminal_capture_are_ignored():
    text = read("topo_a10_4gpu_pcie.txt").splitlines()
    text[1] = f"\x1b[4m\x1b[1m{text[1]}\x1b[0m"
    topo = parse_topo_text("\n".join(text))
    assert topo.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert topo.cpu_affinity["GPU0"] == "0-127"


def test_topology_to_json_shape():
    data = parse_topo_text(read("topo_a10_4gpu_pcie.txt")).to_json()
    assert set(data) == {
        "gpus",
        "nics",
        "nic_names",
        "matrix",
        "cpu_affinity",
        "numa_affinity",
        "gpu_numa_id",
    }
    assert data["matrix"]["GPU0"] == {
        "GPU0": "X",
        "GPU1": "SYS",
        "GPU2": "SYS",
        "GPU3": "SYS",
        "NIC0": "SYS",
        "NIC1": "SYS",
    }
    assert data["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nvidia-smi: command not found",
        "GPU0     X      NV18\nGPU1    NV18     X",
        read("nvlink_s_h800_elided.txt"),
    ],
)
def test_topology_without_header_or_rows_is_a_parse_error(text):
    with pytest.raises(ParseError, match="topo -m"):
        parse_topo_text(text)


# --- nvidia-smi nvlink -gt d / -gt r --------------------------------------------------------------


def test_data_counters_of_eight_h800s():
    report = parse_nvlink_text(read("nvlink_gt_d_h800_8gpu.txt"))
    assert report.kind == "data"
    assert sorted(report.gpus) == [str(i) for i in range(8)]
    gpu0 = report.gpus["0"]
    assert gpu0.name == "NVIDIA H800"
    assert gpu0.uuid == "GPU-34bf77d1-c686-6821-79a8-32d326c5039c"
    assert sorted(gpu0.links, key=int) == [str(i) for i in range(8)]
    assert gpu0.links["0"] == LinkCounters(tx_kib=695737216, rx_kib=692677038)
    assert report.gpus["7"].links["7"] == LinkCounters(tx_kib=692687169, rx_kib=695736450)
    # The recorded output has "Data Tx: 1054002679 KiB()" on this line.
    assert report.gpus["2"].links["0"] == LinkCounters(tx_kib=1054002679, rx_kib=1030362744)


def test_raw_counters_and_json_shape():
    report = parse_nvlink_text(read("nvlink_gt_r_h800_gpu0.txt"))
    assert report.kind == "raw"
    data = report.to_json()
    assert data["kind"] == "raw"
    assert data["gpus"]["0"]["name"] == "NVIDIA H800"
    assert data["gpus"]["0"]["links"]["0"] == {"tx_kib": 1933426555, "rx_kib": 1975423057}
    assert data["gpus"]["0"]["links"]["7"] == {"tx_kib": 1919300185, "rx_kib": 1957241622}


def test_counter_delta_between_two_real_readings():
    # The seed's all-GPU reading came first; the `-i 0` reading of the same box came later.
    before = parse_nvlink_text(read("nvlink_gt_d_h800_8gpu.txt"))
    after = parse_nvlink_text(read("nvlink_gt_d_h800_gpu0.txt"))
    delta = counter_delta(before, after)
    assert list(delta) == ["0"]  # only GPU 0 is in both
    assert delta["0"]["0"] == LinkBytes(
        tx_bytes=(1390774681 - 695737216) * 1024, rx_bytes=(1387831436 - 692677038) * 1024
    )
    assert len(delta["0"]) == 8
    raw = counter_delta(
        parse_nvlink_text(read("nvlink_gt_r_h800_8gpu.txt")),
        parse_nvlink_text(read("nvlink_gt_r_h800_gpu0.txt")),
    )
    assert raw["0"]["7"].tx_bytes == (1919300185 - 1102660262) * 1024


def test_counter_delta_refuses_a_reset_counter_and_mixed_kinds():
    later = parse_nvlink_text(read("nvlink_gt_d_h800_gpu0.txt"))
    earlier = parse_nvlink_text(read("nvlink_gt_d_h800_8gpu.txt"))
    with pytest.raises(ParseError, match=r"GPU 0 link 0 Tx went down .* reset"):
        counter_delta(later, earlier)
    with pytest.raises(ParseError, match="same kind"):
        counter_delta(earlier, parse_nvlink_text(read("nvlink_gt_r_h800_gpu0.txt")))


def test_one_missing_counter_line_leaves_that_direction_none():
    text = "\n".join(
        ln for ln in read("nvlink_gt_d_h800_gpu0.txt").splitlines() if "Link 3: Data Rx" not in ln
    )
    report = parse_nvlink_counters(text, "data")
    assert report.gpus["0"].links["3"] == LinkCounters(tx_kib=1390772616, rx_kib=None)
    assert counter_delta(report, report)["0"]["3"] == LinkBytes(tx_bytes=0, rx_bytes=None)


def test_a_counter_in_another_unit_is_refused_not_guessed():
    text = read("nvlink_gt_d_h800_gpu0.txt").replace("1390774681 KiB", "1390774681 MiB")
    with pytest.raises(ParseError, match="in 'MiB', expected KiB"):
        parse_nvlink_text(text)


def test_two_captures_of_different_kinds_are_refused_by_the_one_report_parser():
    text = read("nvlink_gt_d_h800_gpu0.txt") + read("nvlink_gt_r_h800_gpu0.txt")
    with pytest.raises(ParseError, match=r"holds 2 captures \(data at lines 2-18, raw at lines 20-36\)"):
        parse_nvlink_text(text)
    with pytest.raises(ParseError, match="expected only data"):
        parse_nvlink_counters(read("nvlink_gt_r_h800_gpu0.txt"), "data")


# --- nvidia-smi nvlink -s -------------------------------------------------------------------------


def test_status_with_inactive_links_and_elided_gpus():
    report = parse_nvlink_text(read("nvlink_s_v100_inactive_elided.txt"))
    assert report.kind == "status"
    assert list(report.gpus) == ["3"]
    gpu3 = report.gpus["3"]
    assert gpu3.name == "Tesla V100-SXM2-32GB"
    assert gpu3.uuid is None  # printed "(UUID: ...)"
    assert gpu3.links["0"] == LinkStatus(active=True, speed_gbs=25.781)
    assert gpu3.links["3"] == LinkStatus(active=False, speed_gbs=None)
    assert inactive_links(report) == [("3", "3"), ("3", "5")]
    assert slow_links(report, 25.0) == []
    assert slow_links(report, 26.562) == [
        ("3", "0", 25.781),
        ("3", "1", 25.781),
        ("3", "2", 25.781),
        ("3", "4", 25.781),
    ]


def test_status_of_an_h800_box_with_gpus_elided():
    report = parse_nvlink_text(read("nvlink_s_h800_elided.txt"))
    assert list(report.gpus) == ["0", "1", "7"]
    assert all(len(g.links) == 8 for g in report.gpus.values())
    assert report.gpus["7"].links["7"] == LinkStatus(True, 26.562)
    assert inactive_links(report) == []
    assert slow_links(report, 26.0) == []
    assert report.to_json()["gpus"]["1"]["links"]["0"] == {"active": True, "speed_gbs": 26.562}


def test_status_of_gb200_cut_mid_gpu():
    report = parse_nvlink_text(read("nvlink_s_gb200_elided.txt"))
    assert len(report.gpus["0"].links) == 18
    assert report.gpus["0"].links["17"] == LinkStatus(True, 53.125)
    assert sorted(report.gpus["1"].links) == ["0", "1"]  # the paste stops after link 1


def test_status_tab_indented_with_an_all_inactive_gpu():
    report = parse_nvlink_status(read("nvlink_s_rtx_a6000_tabs_all_inactive.txt"))
    assert report.gpus["0"].links["3"] == LinkStatus(True, 14.062)
    assert report.gpus["2"].links == {}
    assert report.gpus["2"].note == "NVML: Unable to retrieve NVLink information as all links are inActive"
    assert report.gpus["0"].note is None


def test_status_helpers_refuse_counter_reports():
    with pytest.raises(ParseError, match="nvlink -s"):
        inactive_links(parse_nvlink_text(read("nvlink_gt_d_h800_gpu0.txt")))


def test_status_of_gpus_without_nvlink():
    text = "GPU 0: NVIDIA L40S (UUID: GPU-0)\nGPU 1: NVIDIA L40S (UUID: GPU-1)\n"
    with pytest.raises(ParseError, match="parse_nvlink_status"):
        parse_nvlink_text(text)  # cannot tell which command printed it
    report = parse_nvlink_status(text)
    assert {i: g.links for i, g in report.gpus.items()} == {"0": {}, "1": {}}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Failed to initialize NVML: Driver/library version mismatch",
        read("topo_a10_4gpu_pcie.txt"),
        # `nvidia-smi nvlink -c` (capabilities) is neither of the three
        "GPU 0: NVIDIA H800 (UUID: GPU-34bf77d1-c686-6821-79a8-32d326c5039c)\n"
        "         Link 0, P2P is supported: true\n",
    ],
)
def test_nvlink_text_without_link_lines_is_a_parse_error(text):
    with pytest.raises(ParseError, match="nvidia-smi nvlink"):
        parse_nvlink_text(text)


# --- nvidia-smi -L, --query-gpu, the main table ---------------------------------------------------


def test_gpu_list_with_mig_devices():
    gpus = parse_gpu_list(read("list_gpus_a100_mig.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert gpus[0].uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert [m.device for m in gpus[0].mig] == [0, 1, 2, 3]
    assert gpus[0].mig[3].profile == "1g.20gb"
    assert gpus[0].mig[3].uuid == "MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b"
    assert gpus[3].mig == ()


def test_gpu_list_after_a_prompt():
    gpus = parse_gpu_list(read("list_gpus_quadro_rtx4000.txt"))
    assert [(g.index, g.name) for g in gpus] == [(0, "Quadro RTX 4000"), (1, "Quadro RTX 4000")]
    assert gpus[1].to_json()["uuid"] == "GPU-d6de6afc-bdfe-75c4-5273-0544439153fc"


def test_gpu_list_error_names_what_it_got():
    with pytest.raises(ParseError, match="No devices were found"):
        parse_gpu_list("No devices were found\n")


def test_gpu_header_line():
    assert parse_gpu_header("GPU 0: NVIDIA H100").uuid is None
    assert parse_gpu_header("  Link 0: 26.562 GB/s") is None


def test_query_csv_with_header_drops_units_from_keys():
    rows = parse_query_csv(read("query_csv_header_gtx.txt"))
    assert len(rows) == 13
    assert rows[0]["utilization.gpu"] == "26 %"
    assert rows[0]["power.draw"] == "83.92 W"
    assert rows[-1]["clocks.current.graphics"] == "1440 MHz"


def test_query_csv_noheader_with_fields():
    assert parse_query_csv(read("query_csv_noheader_h100nvl.txt"), ["name", "pci.device_id"]) == [
        {"name": "NVIDIA H100 NVL", "pci.device_id": "0x232110DE"}
    ]
    with pytest.raises(ParseError, match="has 2 values, expected 3"):
        parse_query_csv(read("query_csv_noheader_h100nvl.txt"), ["name", "pci.device_id", "uuid"])


def test_inventory_query_rows():
    # Built from the seed H800 host's values (table, `nvidia-smi -q`): SOURCES.md says so.
    text = (
        "0, NVIDIA H800, 81559 MiB, 525.105.17, 00000000:18:00.0\n"
        "1, NVIDIA H800, [N/A], 525.105.17, 00000000:3E:00.0\n"
    )
    assert INVENTORY_ARGS == (
        "--query-gpu=index,name,memory.total,driver_version,pci.bus_id",
        "--format=csv,noheader",
    )
    rows = parse_gpu_inventory(text)
    assert rows[0].to_json() == {
        "index": 0,
        "name": "NVIDIA H800",
        "memory_total_mib": 81559,
        "driver_version": "525.105.17",
        "pci_bus_id": "00000000:18:00.0",
    }
    assert rows[1].memory_total_mib is None
    header = "index, name, memory.total [MiB], driver_version, pci.bus_id\n"
    assert parse_gpu_inventory(header + text) == rows
    assert parse_mib("81559") == 81559 and parse_mib("N/A") is None


def test_main_table_old_layout():
    table = parse_smi_table(read("smi_h800_8gpu_525.txt"))
    assert (table.driver_version, table.cuda_version) == ("525.105.17", "12.0")
    assert [g.index for g in table.gpus] == list(range(8))
    g2 = table.gpus[2]
    assert (g2.name, g2.bus_id, g2.memory_used_mib, g2.memory_total_mib, g2.util_percent) == (
        "NVIDIA H800",
        "00000000:51:00.0",
        68925,
        81559,
        100,
    )
    single = parse_smi_table(read("smi_h800_1gpu_525.txt"))
    assert [(g.index, g.memory_used_mib, g.util_percent) for g in single.gpus] == [(7, 60787, 23)]


def test_main_table_new_layout():
    table = parse_smi_table(read("smi_a40_10gpu_550.txt"))
    assert (table.driver_version, table.cuda_version) == ("550.127.05", "12.4")
    assert len(table.gpus) == 10
    assert table.gpus[9].to_json() == {
        "index": 9,
        "name": "NVIDIA A40",
        "bus_id": "00000000:D6:00.0",
        "memory_used_mib": 1,
        "memory_total_mib": 46068,
        "util_percent": 0,
        "mig_mode": "N/A",
    }


def test_main_table_error():
    with pytest.raises(ParseError, match="Driver Version"):
        parse_smi_table("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_module_level_to_json_matches_the_methods():
    topo = parse_topo_text(read("topo_dgx_h100_13nic.txt"))
    assert nvidia_topo.to_json(topo) == topo.to_json()
    assert nvidia_topo.to_json(topo)["cpu_affinity"]["GPU4"] == "56-111,168-223"
    status = parse_nvlink_text(read("nvlink_s_v100_inactive_elided.txt"))
    assert nvidia_nvlink.to_json(status)["gpus"]["3"]["links"]["5"] == {"active": False, "speed_gbs": None}
    assert nvidia_smi.to_json(parse_gpu_list(read("list_gpus_quadro_rtx4000.txt")))[0]["index"] == 0
    assert (
        nvidia_smi.to_json(parse_smi_table(read("smi_h800_1gpu_525.txt")))["driver_version"] == "525.105.17"
    )


def test_main_table_reads_the_mig_mode_column():
    """The third row of a GPU block (``MIG M.``): Disabled on the real 8 x H200 table, N/A on an A40."""
    h200 = parse_smi_table(read("smi_h200x8_550.163.01_mir_hw2.txt"))
    assert [g.mig_mode for g in h200.gpus] == ["Disabled"] * 8
    enabled = read("smi_h200x8_550.163.01_mir_hw2.txt").replace("Disabled |", "Enabled |", 1)
    assert [g.mig_mode for g in parse_smi_table(enabled).gpus][:2] == ["Enabled", "Disabled"]
