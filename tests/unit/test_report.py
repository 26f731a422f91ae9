"""report.md / report.html / summary.csv from results, chart grouping, the terminal summary's three
failure kinds, the end-of-session gate (finish_run) and `gpucluster report`."""

import base64
import contextlib
import csv
import json
import sys

import pytest

# Import at collection, before any in-process pytester run: its sys.modules snapshot would drop a
# numpy first imported inside it (by the report at session end), and numpy cannot load twice.
with contextlib.suppress(ImportError):
    import matplotlib.figure  # noqa: F401

from pytest_gpucluster import cli
from pytest_gpucluster.results.baseline import RunResults, read_results
from pytest_gpucluster.results.model import Measurement, Spread
from pytest_gpucluster.results.model import TestOutcome as Outcome
from pytest_gpucluster.results.plots import group_measurements
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.results.report import BASELINE_TEST_ID, CSV_COLUMNS, finish_run, write_reports
from pytest_gpucluster.results.summary import summary_lines

GB = 1e9
SIZES = [2**k for k in range(10, 22, 2)]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def m(
    metric, value, unit="B/s", threshold=None, comparison=">=", scope="intra-node", test="t.py::t", **labels
):
    return Measurement(
        test_id=test,
        metric=metric,
        value=value,
        unit=unit,
        threshold=threshold,
        comparison=comparison,
        scope=scope,
        labels=labels,
    )


def sweep(scope="intra-node", peak=100 * GB):
    out = []
    for i, size in enumerate(SIZES):
        threshold = peak / 4 if size >= 2**18 else None
        out.append(
            m(
                "collectives.all_reduce.busbw",
                peak * (i + 1) / len(SIZES),
                "B/s",
                threshold,
                scope=scope,
                size_bytes=size,
                dtype="float32",
            )
        )
    return out


def ranks():
    return [m("burnin.rank_busbw", v * GB, rank=r) for r, v in enumerate([50, 51, 20, 49])]


def sft():
    spread = Spread(median=0.5, min=0.45, max=0.6, mad=0.02, n=5, values=(0.45, 0.5, 0.5, 0.52, 0.6))
    return [
        Measurement(
            "sft.step_time", 0.5, "s", 1.0, "<=", labels={"case": "tiny"}, spread=spread, test_id="t.py::sft"
        ),
        m("scaling.efficiency", 0.97, "fraction", 0.9, scope=None, nodes=2),
        m("scaling.efficiency", 0.93, "fraction", 0.9, scope=None, nodes=4),
    ]


OUTCOMES = (
    Outcome("t.py::t", "passed", "pass", 1.0),
    Outcome(
        "t.py::slow",
        "failed",
        "performance",
        1.0,
        "collectives.all_reduce.busbw: measured 5 GB/s, expected at least 25 GB/s",
    ),
    Outcome("t.py::crash", "failed", "infrastructure", 1.0, "JobFailed: rank 3 on node2 exited with code 1"),
    Outcome("t.py::bug", "failed", "failure", 1.0, "AssertionError: loss is nan"),
)


def results(measurements, outcomes=OUTCOMES):
    return RunResults(
        source="results.json",
        measurements=tuple(measurements),
        outcomes=tuple(outcomes),
        fingerprint={"hosts": ["n1"], "gpu_model": "H100", "gpu_count": 8, "versions": {"nccl": "2.21.5"}},
        profile={"name": "h100-ib", "sha256": "f" * 64, "path": "thresholds/h100-ib.yaml"},
    )


def test_grouping_curves_by_size_bars_by_rank_and_sft_always():
    single = m("inventory.nodes", 1, "nodes", 1, scope=None)
    one_size = m("nvlink.busbw", 5 * GB, size_bytes=2**24)
    groups = group_measurements([*sweep(), *sweep("inter-node"), *ranks(), *sft(), single, one_size])
    kinds = [(g.kind, g.metric, g.scope, g.axis, len(g.members)) for g in groups]
    assert (
        kinds
        == [
            ("curve", "collectives.all_reduce.busbw", "inter-node", "size_bytes", 6),
            ("curve", "collectives.all_reduce.busbw", "intra-node", "size_bytes", 6),
            ("bars", "burnin.rank_busbw", "intra-node", "rank", 4),
            ("curve", "scaling.efficiency", None, "nodes", 2),
        ]
    )  # a lone value (inventory.nodes, sft.step_time) and a one-point "curve" (nvlink.busbw) are table rows only


def test_reports_hold_plots_tables_and_three_separate_failure_kinds(tmp_path):
    measurements = [
        *sweep(),
        *ranks(),
        *sft(),
        m("collectives.all_reduce.busbw", 5 * GB, "B/s", 25 * GB, scope="inter-node", size_bytes=2**20),
    ]
    files = write_reports(results(measurements), tmp_path)
    assert files.note is None
    page = files.html.read_text()
    images = page.count("<img alt=")
    assert images == len(files.plots) == 3  # sft.step_time, one value, is a table cell
    assert page.count('src="data:image/png;base64,') == 3
    assert "<td>sft.step_time</td><td>1</td><td>500 ms</td>" in page
    first = page.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    assert base64.b64decode(first).startswith(PNG_MAGIC)
    assert "<link" not in page and "<script" not in page  # self-contained
    for heading in ("INFRASTRUCTURE ERRORS", "PERFORMANCE FAILURES", "OTHER FAILURES"):
        assert page.count(heading) == 1
    assert "rank 3 on node2 exited with code 1" in page
    assert "NOT FIT: 1 passed, 1 below threshold, 1 infrastructure errors, 1 other failures" in page
    md = files.markdown.read_text()
    for plot in files.plots:
        assert f"(plots/{plot.name})" in md
        assert plot.read_bytes().startswith(PNG_MAGIC)
    assert (
        "| FAIL | collectives.all_reduce.busbw [inter-node] (size_bytes=1048576) | 5 GB/s | >= 25 GB/s |"
        in md
    )
    assert "| INFO | burnin.rank_busbw [intra-node] (4 values) | 20 GB/s..51 GB/s | - |" in md


def test_summary_csv_has_one_row_per_measurement_with_spread(tmp_path):
    measurements = [*sweep(), *sft()]
    files = write_reports(results(measurements), tmp_path)
    rows = list(csv.DictReader(files.csv.open()))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == len(measurements)
    step = next(r for r in rows if r["metric"] == "sft.step_time")
    assert (step["value"], step["unit"], step["threshold"], step["comparison"], step["verdict"]) == (
        "0.5",
        "s",
        "1.0",
        "<=",
        "pass",
    )
    assert (step["min"], step["max"], step["repeats"], step["labels"]) == ("0.45", "0.6", "5", "case=tiny")
    assert rows[0]["labels"] == "size_bytes=1024;dtype=float32"


def test_without_matplotlib_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    files = write_reports(results(sweep()), tmp_path)
    assert files.plots == ()
    assert "matplotlib is not installed" in (files.note or "")
    for path in (files.markdown, files.html):
        assert (
            "Plots are not included: matplotlib is not installed (pip install 'pytest-gpucluster[report]')"
            in path.read_text().replace("&#x27;", "'")
        )
    assert "data:image/png" not in files.html.read_text()


def test_terminal_summary_lists_failure_kinds_apart_and_folds_info_sweeps(tmp_path):
    recorder = Recorder(path=tmp_path / "results.json")
    recorder.measurements = [*sweep(), m("x.busbw", 1 * GB, "B/s", 2 * GB)]
    recorder.outcomes = list(OUTCOMES)
    lines = summary_lines(recorder, tmp_path, reports=[tmp_path / "report.html"])
    text = "\n".join(lines)
    assert lines[0] == "INFRASTRUCTURE ERRORS (the job could not run, a rank crashed or hung): 1"
    assert lines[1] == "  t.py::crash: JobFailed: rank 3 on node2 exited with code 1"
    assert text.index("INFRASTRUCTURE") < text.index("PERFORMANCE FAILURES") < text.index("OTHER FAILURES")
    table = [line for line in lines if line.startswith(("FAIL ", "PASS ", "INFO "))]
    assert table[0].startswith("FAIL     x.busbw [intra-node]")
    folded = " ".join(table[-1].split())
    assert folded == "INFO collectives.all_reduce.busbw [intra-node] (4 values) 16.67 GB/s..66.67 GB/s -"
    assert f"report: {tmp_path / 'report.html'}" in lines


def _recorder(tmp_path, measurements):
    recorder = Recorder(
        path=tmp_path / "run" / "results.json", header={"fingerprint": {"hosts": ["n1"], "gpu_model": "H100"}}
    )
    recorder.measurements = list(measurements)
    recorder.outcomes = [Outcome("t.py::t", "passed", "pass", 1.0)]
    return recorder


def test_finish_run_gates_records_the_comparison_and_writes_reports(tmp_path):
    baseline = results(
        [m(x.metric, x.value * 2, x.unit, x.threshold, scope=x.scope, **x.labels) for x in sweep()], []
    )
    baseline = RunResults(
        **{
            **{f: getattr(baseline, f) for f in RunResults.__slots__},
            "fingerprint": {"hosts": ["n1"], "gpu_model": "H100"},
        }
    )
    recorder = _recorder(tmp_path, sweep())
    finished = finish_run(recorder, tmp_path / "run", baseline, 0.05)
    assert finished.error is None and finished.comparison is not None and finished.comparison.fails
    saved = json.loads(recorder.path.read_text())
    gate = saved["outcomes"][-1]
    assert (gate["test_id"], gate["outcome"], gate["category"]) == (BASELINE_TEST_ID, "failed", "performance")
    # no test failed on them (recorded outside the gate), so the end of the run does
    assert gate["message"].startswith("2 measurement(s) regressed against baseline ")
    assert "(median change -50.0%)" in gate["message"]
    assert len(saved["baseline"]["changes"]) == 6  # 2 gated (a floor), 4 info points shown
    args = finished.summary_args()
    assert any(line.startswith("FAILED: 2 measurement(s) regressed") for line in args["comparison_lines"])
    page = (tmp_path / "run" / "report.html").read_text()
    assert "Comparison with the baseline" in page and "REGRESSION" in page
    rows = list(csv.DictReader((tmp_path / "run" / "summary.csv").open()))
    assert sorted(r["baseline_status"] for r in rows) == ["info"] * 4 + ["regression"] * 2
    assert [float(r["change"]) for r in rows] == pytest.approx([-0.5] * 6)
    tests_failed = finish_run(
        _recorder(tmp_path, sweep()), tmp_path / "run", baseline, 0.05, tests_failed=True
    )
    assert tests_failed.comparison.fails  # the tests that failed already said so: no extra outcome
    assert BASELINE_TEST_ID not in {o["test_id"] for o in json.loads(recorder.path.read_text())["outcomes"]}


def test_finish_run_same_values_passes_and_without_baseline_has_no_comparison(tmp_path):
    baseline = RunResults("old.json", tuple(sweep()), (), {"hosts": ["n1"], "gpu_model": "H100"})
    finished = finish_run(_recorder(tmp_path, sweep()), tmp_path / "run", baseline, 0.05)
    assert finished.comparison is not None and not finished.comparison.regressions
    assert [
        o["test_id"] for o in json.loads((tmp_path / "run" / "results.json").read_text())["outcomes"]
    ] == ["t.py::t"]
    finished = finish_run(_recorder(tmp_path, sweep()), tmp_path / "run", None, 0.05)
    assert finished.comparison is None and finished.files is not None


def test_finish_run_report_failure_is_a_message_not_a_lost_results_file(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.md").mkdir()  # a directory where the report file goes
    finished = finish_run(_recorder(tmp_path, sweep()), tmp_path / "run", None, 0.05)
    assert finished.files is None
    assert finished.error is not None and "could not be written to" in finished.error
    assert json.loads((tmp_path / "run" / "results.json").read_text())["measurements"]


def test_cli_report_regenerates_from_results_json(tmp_path, capsys):
    recorder = _recorder(tmp_path, [*sweep(), *ranks()])
    recorder.flush()
    assert cli.main(["report", str(recorder.path), "--out", str(tmp_path / "again")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "again" / n) for n in ("report.html", "report.md", "summary.csv")]
    assert (tmp_path / "again" / "report.html").read_text().count("data:image/png;base64,") == 2
    assert read_results(recorder.path).measurements == tuple(recorder.measurements)
    assert cli.main(["report", str(tmp_path / "nope.json")]) == 2
    assert "cannot read results file" in capsys.readouterr().err
