"""``dcgmi diag`` JSON (DCGM 2.x, 3.x, 4.x layouts) and plain-text tables, on recorded outputs.

SOURCES.md in tests/data/dcgm/ says where each file came from and which are real runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.dcgm_diag import (
    DiagResult,
    normalize_status,
    parse_dcgm_diag,
    parse_dcgm_diag_json,
)
from pytest_gpucluster.parsers.dcgm_diag_text import parse_dcgm_diag_text

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("word", "status"),
    [
        ("PASS", "Pass"),
        ("Pass", "Pass"),
        ("pass", "Pass"),
        ("FAIL", "Fail"),
        ("Warn", "Warn"),
        ("WARNING", "Warn"),
        ("SKIP", "Skip"),
        ("Skipped", "Skip"),
        ("Not Run", "Not Run"),
        ("NOT  RUN", "Not Run"),
    ],
)
def test_status_words_of_every_version(word, status):
    assert normalize_status(word) == status


def test_an_unknown_status_word_is_never_read_as_a_pass():
    assert normalize_status("Inconclusive") == "Inconclusive"


def test_dcgm_3_1_real_8gpu_run_with_banner_and_nulls():
    """A healthy 8-GPU node: every test Pass; the null entries and the warning banner are skipped."""
    report = parse_dcgm_diag_json(read("diag_3.1.0_8gpu_pass_nulls_banner_dcgm_repo.json"), "r.json")
    assert (report.layout, report.dcgm_version) == ("dcgm-2.x/3.x", "3.1.0")
    assert {r.status for r in report.results} == {"Pass"}
    assert report.failures() == ()
    denylist = next(r for r in report.results if r.test == "Denylist")
    assert (denylist.category, denylist.ids) == ("Deployment", tuple(range(8)))  # "0,1,2,3,4,5,6,7"
    software = [r for r in report.results if r.test == "software"]
    assert [r.ids for r in software] == [(i,) for i in range(8)]  # gpu_ids as a bare int


def test_dcgm_4_real_gb10_run_with_a_failing_gpu_names_the_gpu_and_the_test():
    report = parse_dcgm_diag(read("diag_4.2.3_gb10_software_fail.json"), "gb10.json")
    assert (report.layout, report.dcgm_version, report.driver_version) == ("dcgm-4.x", "4.2.3", "580.82.09")
    (failure,) = report.failures()
    assert (failure.test, failure.category, failure.entity, failure.ids, failure.blamed()) == (
        "software",
        "Deployment",
        "GPU",
        (0,),
        (0,),
    )
    assert failure.error_ids == (29,)
    assert "Persistence mode for GPU 0 is disabled" in failure.warnings[0]
    (summary,) = report.summaries
    assert (summary.test, summary.status) == ("software", "Fail")
    assert "SRAM Threshold" in summary.info[0]
    assert report.serials == {}  # <<<NOT_SUPPORTED>>> is not a serial number
    assert report.to_json()["failures"] == ["software: GPU 0"]


def test_dcgm_2_layout_one_result_for_four_gpus_blames_the_gpus_its_warnings_name():
    """NVVS 1.3: sm_stress FAIL for gpu_ids "0,1,2,3"; warnings name GPUs 0, 2, 3 — GPU 1 is not blamed."""
    report = parse_dcgm_diag_json(read("diag_nvvs1.3_4gpu_sm_stress_fail_vendor_fixture.json"))
    assert report.dcgm_version == "1.3"
    (failure,) = report.failures()
    assert (failure.test, failure.ids, failure.blamed()) == ("sm_stress", (0, 1, 2, 3), (0, 2, 3))
    assert len(failure.warnings) == 3 and failure.info[0].startswith("GPU 0 temperature")
    memory_gpu0 = next(r for r in report.results if r.test == "memory" and r.ids == (0,))
    assert memory_gpu0.status == "Skip" and "ECC memory" in memory_gpu0.warnings[0]
    targeted = next(r for r in report.results if r.test == "targeted_power")
    assert (targeted.status, targeted.warnings) == ("Skip", ())  # "warnings": null


def test_blame_falls_back_to_the_ids_when_warnings_name_no_gpu():
    result = DiagResult("pcie", "Fail", ids=(2,), warnings=("There was an internal error during the test",))
    assert result.blamed() == (2,)


def test_hand_trimmed_paste_is_an_error_naming_file_line_and_expectation():
    """DCGM#139: `{"..."}` put in place of a category, and the paste cut short — not a silent partial read."""
    with pytest.raises(ParseError) as info:
        parse_dcgm_diag(read("diag_3.3_t400_skip_pasted_placeholder_cut_issue139.json"), "t400.json")
    message = str(info.value)
    assert message.startswith("t400.json: malformed JSON at line 6 column 10")
    assert "'DCGM GPU Diagnostic' (DCGM 2.x/3.x) or 'DCGM Diagnostic' (DCGM 4.x)" in message
    assert "cut short or trimmed" in message


def test_a_single_test_object_pasted_alone_is_an_error_listing_what_was_found():
    with pytest.raises(
        ParseError, match=r"fragment\.txt: top-level keys are \['name', 'results', 'test_summary'\]"
    ):
        parse_dcgm_diag(read("diag_4.x_8gpu_diagnostic_test_fragment_issue215.txt"), "fragment.txt")


def test_the_issue_215_fragment_wrapped_as_a_document_parses_eight_gpus():
    """The same real 4.x test object inside the document shape 4.x prints: 8 per-GPU Pass results with info."""
    fragment = read("diag_4.x_8gpu_diagnostic_test_fragment_issue215.txt").rstrip().rstrip(",")
    text = '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [' + fragment + "]}]}}"
    report = parse_dcgm_diag_json(text)
    assert [r.ids for r in report.results] == [(i,) for i in range(8)]
    assert report.results[0].info[-1] == "GPU 0 calculated at approximately 859.08 gigaflops during this test"
    assert report.results[3].info == ()  # DCGM 4 stopped giving info after 16 messages (the issue's point)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Error: unable to establish a connection to the host engine", "no JSON object found"),
        (
            '{"DCGM GPU Diagnostic": {"test_categories": {}}}',
            r"'DCGM GPU Diagnostic\.test_categories' must be a list",
        ),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "memory", "results": [{"entity_id": 0}]}]}]}}',
            r"'DCGM Diagnostic\.test_categories\[0\]\.tests\[0\]\.results\[0\]': result has no 'status'",
        ),
        (
            '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "pcie", "results": [{"gpu_ids": "zero", "status": "Pass"}]}]}]}}',
            r"GPU id 'zero' is not a number",
        ),
        ('{"DCGM GPU Diagnostic": {"version": "3.3.9"}}', "holds no test results and no runtime_error"),
        ("[1, 2]", "no JSON object found|the JSON is a list"),
    ],
)
def test_malformed_json_errors_name_the_file_and_the_key_path(text, message):
    with pytest.raises(ParseError, match=message) as info:
        parse_dcgm_diag_json(text, "node9-diag.json")
    assert str(info.value).startswith("node9-diag.json: ")


def test_runtime_error_alone_is_a_report():
    report = parse_dcgm_diag_json(
        '{"DCGM Diagnostic": {"runtime_error": "Unable to run diagnostic on unsupported GPU 0."}}'
    )
    assert report.results == () and report.runtime_error.startswith("Unable to run")


# --- plain-text tables ------------------------------------------------------------------------------


def test_text_3x_per_gpu_verdicts_and_a_wrapped_warning_rejoined():
    """A faulty 8-GPU node at -r 2: GPU Memory Pass on 1-7, Fail on GPU 0 with a thermal warning."""
    report = parse_dcgm_diag_text(read("diag_text_3.x_8gpu_gpu0_memory_fail_excerpt_mlengineering.txt"))
    passed, failed = report.results
    assert (passed.test, passed.status, passed.ids) == ("GPU Memory", "Pass", (1, 2, 3, 4, 5, 6, 7))
    assert (failed.status, failed.ids, failed.blamed()) == ("Fail", (0,), (0,))
    assert failed.warnings == (
        "GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify "
        "that the cooling on this machine is functional, including external, thermal material interface, fans, "
        "and any other components.",
    )


def test_text_4x_whole_test_failure_with_every_gpu_passing_blames_no_gpu():
    """DCGM 4.2.3: pcie Fail for internal errors while GPU0-3 each Pass — a failure with no GPU to name."""
    report = parse_dcgm_diag(read("diag_text_4.2.3_4gpu_pcie_fail_internal_error_issue253.txt"), "t.txt")
    assert (report.layout, report.dcgm_version, report.driver_version) == ("text", "4.2.3", "570.148.08")
    (failure,) = report.failures()
    assert (failure.test, failure.category, failure.ids, failure.blamed()) == ("pcie", "Integration", (), ())
    assert len(failure.warnings) == 4
    assert failure.warnings[0].endswith(
        "exited with non-zero status 1' Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
    )
    per_gpu = [r for r in report.results if r.test == "pcie" and r.ids]
    assert [(r.ids, r.status) for r in per_gpu] == [((i,), "Pass") for i in range(4)]
    assert report.to_json()["failures"] == ["pcie: GPU (none named)"]


def test_text_4x_b200_eight_gpus_under_slurm():
    report = parse_dcgm_diag_text(read("diag_text_4.4.1_b200x8_pcie_fail_slurm_issue253.txt"))
    assert report.dcgm_version == "4.4.1"
    assert report.tests() == ("software", "memory", "pcie")
    memory = [r for r in report.results if r.test == "memory"]
    assert memory[0].ids == () and memory[0].status == "Pass"  # the whole-test line
    assert [r.ids for r in memory[1:]] == [(i,) for i in range(8)]
    (failure,) = report.failures()
    assert (
        "couldn't be parsed: '* Line 1, Column 1 Syntax error: value, object or array expected."
        in failure.warnings[0]
    )


def test_text_4x_single_gpu_all_pass():
    report = parse_dcgm_diag_text(read("diag_text_4.4.2_1gpu_pass_issue124.txt"))
    assert (report.dcgm_version, report.driver_version) == ("4.4.2", "580.105.08")
    assert report.failures() == () and {r.status for r in report.results} == {"Pass"}
    assert {r.ids for r in report.results} == {(), (0,)}


def test_text_cut_mid_table_keeps_the_rows_before_the_cut():
    report = parse_dcgm_diag_text(read("diag_text_3.0.4_cut_issue55.txt"))
    assert len(report.results) == 9 and report.dcgm_version is None
    assert {(r.category, r.status) for r in report.results} == {("Deployment", "Pass")}


def test_text_without_any_test_row_names_the_file():
    with pytest.raises(ParseError, match=r"empty\.txt: no '\| <test> \| Pass/Fail"):
        parse_dcgm_diag("+---+---+\n| Diagnostic | Result |\n", "empty.txt")
