"""The readiness parsers on real recorded outputs (tests/data/readiness/README.md credits each),
and on truncated and prefixed variants of them as they reach us (a cut log, a journal prefix, a
``grep -A2 Fabric`` excerpt)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_manager import parse_fm_log, parse_sxid_lines
from pytest_gpucluster.parsers.lspci_acs import acs_on_gpu_nic_path, parse_lspci
from pytest_gpucluster.parsers.nvidia_smi_fabric import parse_gpu_readiness
from pytest_gpucluster.parsers.proc_limits import UNLIMITED, memlock_limit

DATA = Path(__file__).parents[1] / "data"
SMI = DATA / "nvidia_smi"
READY = DATA / "readiness"
ACS_ON = "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def _lspci() -> str:
    with gzip.open(READY / "lspci_vvv_hgx_h100_gpud.txt.gz", "rt") as handle:
        return handle.read()


# ----------------------------------------------------------------------------- nvidia-smi -q


def test_h100_fabric_completed_persistence_on_and_no_remap_pending():
    gpus = parse_gpu_readiness((SMI / "ecc_q_h100x8_first2_535.161.08_gpud.txt").read_text())
    assert [g.bus_id for g in gpus] == ["00000000:19:00.0", "00000000:3b:00.0"]
    assert {(g.fabric_state, g.fabric_status, g.persistence) for g in gpus} == {
        ("completed", "Success", True)
    }
    assert {(g.remap_pending, g.remap_failure, g.remapped_uncorrectable) for g in gpus} == {(False, False, 0)}
    assert {g.retired_pages for g in gpus} == {None}  # Hopper: page retirement N/A


def test_a10_with_a_row_remap_pending_and_four_uncorrectable_rows():
    [gpu] = parse_gpu_readiness((SMI / "ecc_q_a10_remapped_pending_535.129.03_gpud.txt").read_text())
    assert (gpu.name, gpu.remap_pending, gpu.remapped_uncorrectable, gpu.remap_failure) == (
        "NVIDIA A10",
        True,
        4,
        False,
    )


def test_an_old_layout_without_remapped_rows_reads_as_unknown_not_as_healthy():
    [gpu] = parse_gpu_readiness((SMI / "ecc_q_titanv_na_old_layout_560.35.03_gpud.txt").read_text())
    assert (gpu.remap_pending, gpu.remap_failure, gpu.fabric_state, gpu.persistence) == (
        None,
        None,
        None,
        False,
    )


def test_a_pasted_excerpt_with_elisions_still_reads_the_pending_remap():
    [gpu] = parse_gpu_readiness(
        (SMI / "ecc_q_a100_xid63_dram_correctable_elided_510.73.08_mlengineering.txt").read_text()
    )
    assert gpu.remap_pending is True


def test_a_grep_excerpt_of_the_fabric_section_with_no_gpu_line_is_gpu_0():
    # `nvidia-smi -q | grep -A2 Fabric` on an H100 whose Fabric Manager has not run (public reports)
    text = "    Fabric\n        State                             : In Progress\n        Status                            : N/A\n"
    [gpu] = parse_gpu_readiness(text)
    assert (gpu.index, gpu.fabric_state, gpu.fabric_status) == (0, "in progress", None)


def test_a_cut_output_keeps_the_blocks_it_has():
    lines = (SMI / "ecc_q_h100x8_first2_535.161.08_gpud.txt").read_text().splitlines()
    cut = "\n".join(lines[: lines.index("GPU 00000000:3B:00.0") + 20])  # the second block cut early
    gpus = parse_gpu_readiness(cut)
    assert gpus[0].fabric_state == "completed" and gpus[1].fabric_state is None and gpus[1].name


def test_text_without_a_gpu_block_is_refused_with_what_was_expected():
    with pytest.raises(ParseError, match=r"no 'GPU <bus id>' block.*nvidia-smi -q"):
        parse_gpu_readiness("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")


# ----------------------------------------------------------------------------- SXid, Fabric Manager log


def test_sxid_lines_of_a_real_kernel_log_count_each_event_once():
    events = parse_sxid_lines((READY / "sxid_fatal_ltssm_xid79_gpud_readme.log").read_text())
    assert [(e.switch, e.pci, e.code, e.severity, e.detail) for e in events] == [
        (1, "0000:06:00.0", 20034, "fatal", "Link 48 LTSSM Fault Up"),
        (0, "0000:05:00.0", 20034, "fatal", "Link 63 LTSSM Fault Up"),
        (2, "0000:07:00.0", 20034, "fatal", "Link 37 LTSSM Fault Up"),
        (0, "0000:05:00.0", 20034, "fatal", "Link 62 LTSSM Fault Up"),
    ]  # the Severity/Data follow-up lines and the Xid 79 lines are not SXid events


def test_a_non_fatal_sxid_behind_a_journal_prefix():
    # gpud components/accelerator/nvidia/sxid/kmsg_test.go, behind journalctl's short-iso prefix
    line = ("2024-09-19T02:29:46+0000 gpu-node-017 kernel: [111111111.111] nvidia-nvswitch3: SXid "
            "(PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)")  # fmt: skip
    [event] = parse_sxid_lines(line)
    assert (event.switch, event.code, event.fatal, event.detail) == (
        3, 12028, False, "Link 32 egress non-posted PRIV error (First)"
    )  # fmt: skip


def test_a_real_fabric_manager_log_has_its_error_and_no_success_line():
    log = parse_fm_log((READY / "fabricmanager_log_multicast_gpud.log").read_text())
    assert not log.configured and log.lines > 90
    assert log.errors == (
        "[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on "
        "NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61",
    )


def test_the_success_line_in_a_journal_says_the_switches_are_configured():
    text = (READY / "fabricmanager_log_multicast_gpud.log").read_text().splitlines()[-10:]
    text.append("May 01 13:53:50 node nv-fabricmanager[5946]: Successfully configured all the available "
                "NVSwitches to route GPU NVLink traffic.")  # fmt: skip
    assert parse_fm_log("\n".join(text)).configured


# ----------------------------------------------------------------------------- lspci ACS


def test_a_real_hgx_h100_has_acs_redirection_only_off_the_gpu_nic_path():
    devices = parse_lspci(_lspci())
    assert sum(d.is_gpu for d in devices) == 8 and sum(d.is_rdma_nic for d in devices) == 12
    redirecting = [d.bdf for d in devices if d.redirects]
    assert redirecting == [
        "0000:82:00.0",
        "0000:82:01.0",
        "0000:82:02.0",
        "0000:82:03.0",
    ]  # the NVSwitch side
    assert acs_on_gpu_nic_path(devices) == []


def test_redirection_on_the_switch_port_above_a_gpu_is_on_the_path():
    text = _lspci()
    start = text.index("\n17:01.0 ")
    end = text.index("\n\n", start)
    block = text[start:end]
    old = block[block.index("ACSCtl:") :].split("\n", 1)[0]
    flipped = text[:start] + block.replace(old, ACS_ON) + text[end:]
    assert [d.bdf for d in acs_on_gpu_nic_path(parse_lspci(flipped))] == ["0000:17:01.0"]


def test_a_cut_lspci_and_a_non_root_one_still_parse():
    text = _lspci()
    cut = parse_lspci(text[: len(text) // 3])
    assert cut and cut[-1].bdf.startswith("0000:")
    denied = text.replace("\tCapabilities: [100 v1]", "\tCapabilities: <access denied>\n\tX")
    assert any(d.caps_denied for d in parse_lspci(denied))


# ----------------------------------------------------------------------------- /proc/<pid>/limits


def test_memlock_limit_in_bytes_or_unlimited():
    line = "Max locked memory         {}              {}              bytes     \n"
    header = "Limit                     Soft Limit           Hard Limit           Units     \n"
    assert memlock_limit(header + line.format("8388608", "8388608")) == (8388608, 8388608)
    assert memlock_limit(header + line.format("unlimited", "unlimited")) == (UNLIMITED, UNLIMITED)
    with pytest.raises(ParseError, match="Max locked memory"):
        memlock_limit(header)
