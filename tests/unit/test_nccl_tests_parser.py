"""The nccl-tests parser on recorded real outputs (tests/data/nccl_tests/, see SOURCES.md).

Expected cells are read off the files by eye.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.maths.metrics import bus_factor
from pytest_gpucluster.parsers.nccl_tests import Measurement, Row, Run, format_table, parse

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
SAMPLES = sorted(p.name for p in DATA.iterdir() if p.name != "SOURCES.md" and "_non_mpi_" not in p.name)
"""Every recorded table; the ``_non_mpi_`` excerpts hold headers of lone processes and no row, and are
read by the rank check (test_nccl_tests_launch.py)."""


def runs_of(name: str) -> list[Run]:
    return parse((DATA / name).read_text(encoding="utf-8"), source=name)


def test_every_sample_is_documented() -> None:
    sources = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    assert len(SAMPLES) >= 6
    for name in SAMPLES:
        assert f"`{name}`" in sources, f"{name} has no provenance line in SOURCES.md"


# --- one test per recorded output ------------------------------------------------------------


def test_old_layout_with_error_column_single_host() -> None:
    [run] = runs_of("superbench_a100x8_all_reduce_error_column.log")
    assert (run.collective, run.nranks, run.nnodes) == (None, 8, 1)
    assert run.hosts == ("localhost",)
    assert len(run.rows) == 34
    assert [r.size_bytes for r in run.rows[:3]] == [0, 0, 4]
    assert run.avg_busbw_gbs == 68.4048
    big = run.row(8589934592)
    assert (big.count, big.dtype, big.redop, big.root) == (2147483648, "float", "sum", None)
    assert big.out_of_place == Measurement(63896.0, 134.44, 235.26, wrong=None, error=None)
    assert big.in_place == Measurement(63959.0, 134.30, 235.03, wrong=None, error=None)
    # nccl-tests' busbw is algbw * 2(n-1)/n for all_reduce, as metrics.bus_factor says
    assert big.out_of_place.busbw_gbs == pytest.approx(134.44 * bus_factor("all_reduce", 8), abs=0.01)


def test_alltoall_with_blank_redop_cell() -> None:
    [run] = runs_of("superbench_a100x8_alltoall_blank_redop.log")
    assert run.collective is None  # the file never names the binary
    assert (run.nranks, run.nnodes, len(run.rows)) == (8, 1, 34)
    assert all(r.redop is None and r.root is None for r in run.rows)
    row = run.row(4294967296)
    assert row.count == 134217728
    assert row.out_of_place == Measurement(16860.0, 254.74, 222.90)  # integer time cell
    assert row.in_place is not None and row.in_place.busbw_gbs == 225.34
    assert row.out_of_place.busbw_gbs == pytest.approx(254.74 * bus_factor("alltoall", 8), abs=0.01)
    assert run.avg_busbw_gbs == 58.6481


def test_new_layout_two_nodes_collective_from_command_line() -> None:
    [run] = runs_of("gcp_a3mega_h100x16_all_reduce_2node.md")
    assert (run.collective, run.nranks, run.nnodes) == ("all_reduce", 16, 2)
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert len(run.rows) == 31
    big = run.row(8589934592)
    assert (big.redop, big.root) == ("sum", -1)
    assert big.out_of_place == Measurement(47535.0, 180.71, 338.82, wrong=0)
    assert big.in_place == Measurement(47743.0, 179.92, 337.35, wrong=0)
    assert run.row(8).out_of_place == Measurement(135.8, 0.0, 0.0, wrong=0)
    assert run.avg_busbw_gbs == 70.742


def test_open_mpi_tags_and_nccl_info_between_rows() -> None:
    [run] = runs_of("aws_efa_eks_p4d_a100x16_mpi_tags.log")
    assert (run.collective, run.nranks, run.nnodes) == (None, 16, 2)
    assert run.hosts == ("nccl-tests-efa-worker-0", "nccl-tests-efa-worker-1")
    assert len(run.rows) == 28
    first = run.row(8)
    assert (first.redop, first.root) == ("sum", None)
    assert first.out_of_place == Measurement(167.5, 0.0, 0.0, wrong=None, error=2e-07)
    assert first.in_place == Measurement(167.1, 0.0, 0.0, wrong=None, error=1e-07)
    last = run.rows[-1]
    assert last.size_bytes == 1073741824
    assert last.out_of_place == Measurement(61556.0, 17.44, 32.71, error=5e-07)
    assert run.avg_busbw_gbs == 7.80081


def test_two_indented_runs_in_one_file() -> None:
    first, second = runs_of("cscs_gh200x8_two_runs_indented.md")
    for run in (first, second):
        assert (run.collective, run.nranks, run.nnodes, len(run.rows)) == ("all_reduce", 8, 2, 25)
        assert run.hosts == ("nid005471", "nid005487")
    assert first.row(134217728).out_of_place == Measurement(1916.4, 70.04, 122.57, wrong=0)
    assert second.row(134217728).out_of_place == Measurement(43293.0, 3.10, 5.43, wrong=0)
    assert second.row(33554432).in_place == Measurement(17275.0, 1.94, 3.40, wrong=0)
    assert first.row(16384).in_place == Measurement(36.53, 0.45, 0.78, wrong=0)  # shifted row
    assert (first.avg_busbw_gbs, second.avg_busbw_gbs) == (19.7866, 1.58767)


def test_three_runs_with_srun_labels_and_validation_off() -> None:
    single, two_nodes, tuned = runs_of("nccl_tests_issue290_h100_three_runs_srun_label.md")
    assert (single.nranks, single.nnodes, len(single.rows)) == (8, 1, 6)
    assert single.row(4294967296).in_place == Measurement(15773.0, 272.30, 476.53, wrong=0)
    assert single.avg_busbw_gbs == 439.369
    assert (two_nodes.nranks, two_nodes.nnodes, len(two_nodes.rows)) == (16, 2, 11)
    assert two_nodes.row(8589934592).out_of_place == Measurement(103530.0, 82.97, 155.57, wrong=None)
    assert two_nodes.avg_busbw_gbs == 142.735
    # the third block starts at "# Using devices", without a "# nThread" line
    assert (tuned.nranks, tuned.nnodes, len(tuned.rows)) == (16, 2, 11)
    assert tuned.row(8589934592).out_of_place == Measurement(179148.0, 47.95, 89.90, wrong=None)
    assert tuned.avg_busbw_gbs == 85.5294
    assert {single.collective, two_nodes.collective, tuned.collective} == {None}


def test_truncated_run_keeps_complete_rows_only() -> None:
    text = (DATA / "nccl_tests_issue214_a40x2_truncated.log").read_text(encoding="utf-8")
    assert text.rstrip().endswith("0.26    0.")  # the last row is cut mid-number
    [run] = parse(text)
    assert (run.collective, run.nranks, run.nnodes) == (None, 2, 2)
    assert [r.size_bytes for r in run.rows] == [256, 512, 1024, 2048, 4096]
    assert run.avg_busbw_gbs is None
    row = run.row(4096)
    assert row.out_of_place == Measurement(30.74, 0.13, 0.13, wrong=0)
    assert row.in_place == Measurement(30.69, 0.13, 0.13, wrong=None)  # printed N/A


def test_old_broadcast_layout_with_root_and_no_redop() -> None:
    [run] = runs_of("nccl_tests_issue82_v100x2_broadcast_root_column.log")
    assert (run.collective, run.nranks, run.nnodes, run.avg_busbw_gbs) == ("broadcast", 2, 2, None)
    assert run.rows == (
        Row(
            size_bytes=8,
            count=2,
            dtype="float",
            redop=None,
            root=0,
            out_of_place=Measurement(45.82, 0.0, 0.0),
            in_place=Measurement(38.17, 0.0, 0.0),
        ),
    )


def test_newest_layout_with_mpi_help_lines_between_header_and_rows() -> None:
    [run] = runs_of("rtx6000d_x16_nccl_tests_2.18.3_mpi_warnings.log")
    assert (run.collective, run.nranks, run.nnodes, len(run.rows)) == ("all_reduce", 16, 2, 24)
    assert run.row(1024).out_of_place == Measurement(60.47, 0.02, 0.03, wrong=0)
    big = run.row(8589934592)
    assert big.out_of_place == Measurement(431537.0, 19.91, 37.32, wrong=0)
    assert big.in_place == Measurement(432914.0, 19.84, 37.20, wrong=0)
    assert run.avg_busbw_gbs == 18.9974


def test_all_gather_with_srun_labels_and_no_rank_lines() -> None:
    [run] = runs_of("gcp_a3mega_all_gather_srun_label.md")
    assert (run.collective, run.nranks, run.nnodes, len(run.rows)) == ("all_gather", None, None, 11)
    assert all((r.redop, r.root) == ("none", -1) for r in run.rows)
    big = run.row(8589934592)
    assert big.out_of_place == Measurement(42637.0, 201.47, 188.88, wrong=None)
    # all_gather's size is the gathered total: count * 4 bytes * 16 ranks; busbw = algbw * 15/16
    assert big.size_bytes == big.count * 4 * 16
    assert big.out_of_place.busbw_gbs == pytest.approx(201.47 * bus_factor("all_gather", 16), abs=0.01)
    assert run.avg_busbw_gbs == 128.817


# --- prefixes, JSON form, errors -------------------------------------------------------------


def test_pdsh_host_prefixes_are_read_through() -> None:
    # No public pdsh capture was found; prefix a real output the way pdsh does ("host: line").
    text = (DATA / "gcp_a3mega_h100x16_all_reduce_2node.md").read_text(encoding="utf-8")
    prefixed = "\n".join(f"gpu-node-01.cluster: {line}" for line in text.splitlines())
    assert parse(prefixed) == runs_of("gcp_a3mega_h100x16_all_reduce_2node.md")
    # pdsh around mpirun --tag-output
    text = (DATA / "aws_efa_eks_p4d_a100x16_mpi_tags.log").read_text(encoding="utf-8")
    prefixed = "\n".join(f"launcher: {line}" for line in text.splitlines())
    assert parse(prefixed) == runs_of("aws_efa_eks_p4d_a100x16_mpi_tags.log")


def test_mpi_build_binary_name_loses_its_suffixes() -> None:
    # nccl-tests built with MPI=1 NAME_SUFFIX=_mpi prints "all_reduce_perf_mpi" (issue #309 shows it)
    text = (DATA / "rtx6000d_x16_nccl_tests_2.18.3_mpi_warnings.log").read_text(encoding="utf-8")
    [run] = parse(text.replace("all_reduce_perf", "all_reduce_perf_mpi"))
    assert run.collective == "all_reduce"


def test_json_form_matches_the_cli_contract() -> None:
    [run] = runs_of("superbench_a100x8_all_reduce_error_column.log")
    payload = json.loads(json.dumps([run.to_dict()]))
    [item] = payload
    assert list(item) == ["collective", "nranks", "nnodes", "rows", "avg_busbw_gbs"]
    assert item["rows"][-1] == {
        "size_bytes": 8589934592,
        "count": 2147483648,
        "dtype": "float",
        "redop": "sum",
        "root": None,
        "out_of_place": {
            "time_us": 63896.0,
            "algbw_gbs": 134.44,
            "busbw_gbs": 235.26,
            "wrong": None,
            "error": None,
        },
        "in_place": {
            "time_us": 63959.0,
            "algbw_gbs": 134.30,
            "busbw_gbs": 235.03,
            "wrong": None,
            "error": None,
        },
    }


def test_a_file_without_result_rows_is_a_parse_error() -> None:
    text = (DATA / "aws_efa_eks_p4d_a100x16_mpi_tags.log").read_text(encoding="utf-8")
    header_only = text.split("[1,0]<stdout>:           8")[0]  # everything before the first row
    assert "#       size         count" in header_only
    with pytest.raises(ParseError, match=r"^p4d\.log: no nccl-tests result rows found"):
        parse(header_only, source="p4d.log")
    with pytest.raises(ParseError):
        parse("")


def test_rows_without_a_header_are_not_guessed() -> None:
    rows_only = "           8             2   float     sum    167.5    0.00    0.00  2e-07    167.1    0.00    0.00  1e-07\n"
    with pytest.raises(ParseError):
        parse(rows_only)


# --- format_table ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SAMPLES)
def test_format_table_round_trips(name: str) -> None:
    for run in runs_of(name):
        text = format_table(run.rows, run.collective)
        [back] = parse(text)
        assert back.rows == run.rows
        assert back.collective == run.collective
        mean = sum(m.busbw_gbs for r in run.rows for m in (r.out_of_place, r.in_place) if m) / (
            sum(1 for r in run.rows for m in (r.out_of_place, r.in_place) if m)
        )
        assert back.avg_busbw_gbs == pytest.approx(mean, rel=1e-5)


def test_format_table_layout_and_defaults() -> None:
    rows = [
        Row(1048576, 262144, None, None, -1, Measurement(74.78, 14.02, 24.54, wrong=0), None),
        Row(2097152, 524288, None, None, -1, Measurement(16215.0, 132.44, 231.76, wrong=0), None),
    ]
    text = format_table(rows, "all_reduce", dtype="bfloat16", redop="sum")
    lines = text.splitlines()
    assert lines[0] == "# Collective test starting: all_reduce_perf"
    assert "out-of-place" in lines[1] and "in-place" not in lines[1]
    assert lines[2].split() == [
        "#",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
    ]
    assert lines[4].split() == ["1048576", "262144", "bfloat16", "sum", "-1", "74.78", "14.02", "24.54", "0"]
    assert lines[5].split()[5] == "16215"  # nccl-tests drops decimals above 10 ms
    assert lines[-2] == "# Avg bus bandwidth    : 128.15"
    [back] = parse(text)
    assert back.collective == "all_reduce"
    assert [(r.dtype, r.redop) for r in back.rows] == [("bfloat16", "sum")] * 2
    assert [r.in_place for r in back.rows] == [None, None]


def test_format_table_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        format_table([], "all_reduce")
    both = Row(8, 2, "float", "sum", -1, Measurement(1.0, 0.0, 0.0), Measurement(1.0, 0.0, 0.0))
    one = Row(16, 4, "float", "sum", -1, Measurement(1.0, 0.0, 0.0), None)
    with pytest.raises(ValueError, match="same placements"):
        format_table([both, one])
    with pytest.raises(ValueError, match="no dtype"):
        format_table([Row(8, 2, None, None, None, Measurement(1.0, 0.0, 0.0), None)])
