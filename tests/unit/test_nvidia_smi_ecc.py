"""ECC mode and counters from ``nvidia-smi -q [-d ECC]`` (several drivers and GPU generations) and the
``--query-gpu=ecc.mode.current,ecc.mode.pending`` CSV.

The -q files are real outputs (tests/data/nvidia_smi/SOURCES.md). No real ECC-mode CSV was found,
so those rows are built here from the modes the recorded -q files show (said again at each test).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_smi_ecc import parse_ecc, parse_ecc_mode_csv, parse_ecc_query

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_h100_535_ecc_enabled_current_and_pending_with_hopper_counters():
    """Healthy H100s: ECC on now and after reboot, zero uncorrectable errors; Hopper's SRAM split counted."""
    gpus = parse_ecc_query(read("ecc_q_h100x8_first2_535.161.08_gpud.txt"))
    assert [(g.index, g.bus_id, g.product_name) for g in gpus] == [
        (0, "00000000:19:00.0", "NVIDIA H100 80GB HBM3"),
        (1, "00000000:3B:00.0", "NVIDIA H100 80GB HBM3"),
    ]
    gpu = gpus[0]
    assert (gpu.mode_current, gpu.mode_pending) == (True, True)
    assert set(gpu.volatile) == {
        "sram_correctable",
        "sram_uncorrectable_parity",
        "sram_uncorrectable_sec_ded",
        "dram_correctable",
        "dram_uncorrectable",
    }
    assert gpu.aggregate["sram_threshold_exceeded"] is False
    assert (gpu.uncorrected("volatile"), gpu.uncorrected("aggregate"), gpu.corrected()) == (0, 0, 0)
    assert gpu.remapped_rows["pending"] is False and gpu.remapped_rows["remapping_failure_occurred"] is False
    assert gpu.retired_pages == {
        "single_bit_ecc": None,
        "double_bit_ecc": None,
        "pending_page_blacklist": None,
    }


def test_geforce_with_ecc_disabled_reads_false_not_unknown():
    gpus = parse_ecc_query(read("ecc_q_rtx4090x8_disabled_first2_535.154.05_gpud.txt"))
    assert [(g.mode_current, g.mode_pending) for g in gpus] == [(False, False), (False, False)]
    assert gpus[0].uncorrected() is None  # every counter N/A


def test_a10_ecc_clean_but_uncorrectable_row_remaps_pending():
    (gpu,) = parse_ecc_query(read("ecc_q_a10_remapped_pending_535.129.03_gpud.txt"))
    assert (gpu.product_name, gpu.mode_current, gpu.uncorrected()) == ("NVIDIA A10", True, 0)
    assert gpu.remapped_rows["uncorrectable_error"] == 4
    assert gpu.remapped_rows["pending"] is True


def test_titan_v_old_single_double_bit_layout_all_not_available():
    """560 driver, Volta: ECC Mode N/A (no ECC on the part) and the Single/Double Bit counter tree."""
    (gpu,) = parse_ecc_query(read("ecc_q_titanv_na_old_layout_560.35.03_gpud.txt"))
    assert (gpu.mode_current, gpu.mode_pending) == (None, None)
    assert "single_bit.device_memory" in gpu.volatile and "double_bit.total" in gpu.aggregate
    assert gpu.uncorrected() is None and gpu.remapped_rows == {}  # "Remapped Rows : N/A"


def test_old_layout_totals_come_from_double_bit_total():
    """The TITAN V tree with numbers, as a Volta/Pascal Tesla prints it: volatile Double Bit Total 2."""
    text = read("ecc_q_titanv_na_old_layout_560.35.03_gpud.txt")
    volatile, aggregate = text.split("        Aggregate\n", 1)
    single, double = volatile.split("            Double Bit\n", 1)
    single = re.sub(r"(Total\s+:) N/A", r"\1 0", single)
    double = re.sub(r"(Total\s+:) N/A", r"\1 2", double, count=1)
    text = f"{single}            Double Bit\n{double}        Aggregate\n{aggregate}"
    (gpu,) = parse_ecc_query(text)
    assert gpu.uncorrected("volatile") == 2 and gpu.corrected("volatile") == 0
    assert gpu.uncorrected("aggregate") is None


def test_a100_after_xid63_pasted_with_elisions():
    (gpu,) = parse_ecc_query(read("ecc_q_a100_xid63_dram_correctable_elided_510.73.08_mlengineering.txt"))
    assert (gpu.bus_id, gpu.product_name) == ("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert (gpu.mode_current, gpu.mode_pending) == (None, None)  # the ECC Mode section was elided
    assert (gpu.corrected("volatile"), gpu.corrected("aggregate"), gpu.uncorrected()) == (177, 177, 0)
    assert gpu.remapped_rows["correctable_error"] == 1 and gpu.remapped_rows["pending"] is True
    assert gpu.remapped_rows["bank_remap_availability_histogram.max"] == "639 bank(s)"


def test_ecc_errors_block_without_its_gpu_line_is_one_gpu():
    """One broken GPU: SRAM Uncorrectable 1 since the driver loaded, 5 over its life."""
    (gpu,) = parse_ecc_query(read("ecc_errors_block_sram_uncorrectable_no_gpu_header_mlengineering.txt"))
    assert (gpu.index, gpu.bus_id) == (0, None)
    assert (gpu.uncorrected("volatile"), gpu.uncorrected("aggregate")) == (1, 5)


def test_query_without_ecc_sections_is_an_error():
    with pytest.raises(ParseError, match="no 'ECC Mode' or 'ECC Errors' section"):
        parse_ecc_query(read("smi_h800_1gpu_525.txt"))


def test_unexpected_mode_word_is_an_error_naming_the_gpu():
    text = "GPU 00000000:19:00.0\n    ECC Mode\n        Current : Maybe\n        Pending : Enabled\n"
    with pytest.raises(
        ParseError, match=r"GPU 00000000:19:00\.0: ECC mode 'Maybe', expected Enabled, Disabled or N/A"
    ):
        parse_ecc_query(text)


# --- --query-gpu=ecc.mode.current,ecc.mode.pending ------------------------------------------------------
# Built rows (no public recording found): the modes are those of the recorded -q files above.


def test_ecc_mode_csv_noheader_h100_and_a_disabled_pending_enable():
    rows = parse_ecc_mode_csv("Enabled, Enabled\nDisabled, Enabled\n")
    assert [(r.index, r.current, r.pending) for r in rows] == [(0, True, True), (1, False, True)]


def test_ecc_mode_csv_with_header_index_and_not_available():
    text = "index, ecc.mode.current, ecc.mode.pending\n0, Disabled, Disabled\n1, [N/A], [N/A]\n"
    rows = parse_ecc_mode_csv(text)
    assert [(r.index, r.current, r.pending) for r in rows] == [(0, False, False), (1, None, None)]


def test_parse_ecc_picks_the_format():
    assert parse_ecc("ecc.mode.current, ecc.mode.pending\nEnabled, Enabled\n")[0].current is True
    assert parse_ecc(read("ecc_q_a10_remapped_pending_535.129.03_gpud.txt"))[0].product_name == "NVIDIA A10"


def test_ecc_mode_csv_with_a_bad_value_names_the_line():
    with pytest.raises(ParseError, match="ECC CSV line 2: ECC mode 'On'"):
        parse_ecc_mode_csv("Enabled, Enabled\nOn, Enabled\n")


def test_text_that_is_neither_is_an_error():
    with pytest.raises(ParseError, match="no 'ECC Mode' section"):
        parse_ecc("GPU 0: NVIDIA H800 (UUID: GPU-34bf)\n")
