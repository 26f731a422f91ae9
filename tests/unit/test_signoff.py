"""The sign-off on real results: the node x area matrix, the next action per node, skips listed
with their reasons, and charts bounded by metrics (a real cpu-local run, fanned out to a fleet)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

with contextlib.suppress(ImportError):  # see test_report.py: numpy must not load twice
    import matplotlib.figure  # noqa: F401

from pytest_gpucluster import cli
from pytest_gpucluster.results.baseline import RunResults, read_results
from pytest_gpucluster.results.chart_groups import group_measurements, uncharted_rows
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.matrix import CLUSTER, Column, area_of, node_matrix
from pytest_gpucluster.results.report import write_reports
from pytest_gpucluster.results.signoff import action_column, skip_groups
from pytest_gpucluster.testbed.fanout import dumps, fan_out

REAL_RUN = Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json"


@pytest.fixture(scope="module")
def real() -> dict:
    return json.loads(REAL_RUN.read_text())


@pytest.fixture(scope="module")
def fleet64(real):
    fanned, planted = fan_out(real, 64)
    return RunResults.from_json(json.loads(dumps(fanned)), "fleet64/results.json"), planted


def test_the_fan_out_plants_one_slow_gpu_and_one_failed_port_among_healthy_peers(real, fleet64):
    run, planted = fleet64
    assert (planted.slow_node, planted.slow_gpu, planted.slow_metric) == ("node022", "5", "burnin.cpu_matmul")
    assert (planted.port_node, planted.port, planted.port_metric) == (
        "node043",
        "eth0",
        "fabric.error_increase",
    )
    matmul = [m for m in run.measurements if m.metric == "burnin.cpu_matmul"]
    assert len(matmul) == 64 * 8 and sum(m.failed for m in matmul) == 1
    healthy = sorted(m.value for m in matmul if not m.failed)
    assert healthy[-1] / healthy[0] < 1.05  # ±2% noise
    assert len(run.fingerprint["hosts"]) == 64
    assert fan_out(real, 64)[0] == fan_out(real, 64)[0]  # deterministic for a seed


def test_the_matrix_puts_the_failing_nodes_first_with_their_next_action(fleet64):
    run, _ = fleet64
    hosts = run.fingerprint["hosts"]
    findings = findings_of(run.measurements, run.outcomes, hosts)
    matrix = node_matrix(run.measurements, run.outcomes, findings, hosts)
    matrix.add_column(action_column(findings, hosts))
    names = [r.name for r in matrix.rows]
    assert names[:3] == [CLUSTER, "node022", "node043"] and len(names) == 65
    slow, port = matrix.rows[1], matrix.rows[2]
    assert (slow.cells["health"].status, slow.cells["health"].count) == ("fail", 48)
    assert port.cells["fabric"].status == "fail" and slow.cells["fabric"].status == "pass"
    # skipped everywhere: not applicable, with the skip reason as the note
    assert slow.cells["coll_inter"].status == "n.a." and "needs 2 nodes" in slow.cells["coll_inter"].note
    # intra-node sweeps name no node: in the cluster row, the node cells point there
    assert matrix.rows[0].cells["coll_intra"].status == "pass" and slow.cells["coll_intra"].status == "—"
    action = matrix.columns[0].values
    assert action["node022"] == "GPU 5: burnin.cpu_matmul 0.0175 TFLOP/s (>= 0.028 TFLOP/s) -> reset GPU"
    assert action["node043"].startswith("eth0: fabric.error_increase 37 count") and action[
        "node043"
    ].endswith("-> reseat/replace cable or NIC")
    assert "node001" not in action


def test_matrix_columns_are_data_a_later_column_shows_in_both_formats(fleet64, tmp_path):
    run, _ = fleet64
    files = write_reports(run, tmp_path, charts=False)
    md = files.markdown.read_text()
    head = next(line for line in md.splitlines() if line.startswith("| node |"))
    assert head.split(" | ")[1:4] == ["inventory", "collectives intra", "collectives inter"]
    assert head.rstrip(" |").endswith("findings -> next action")
    hosts = run.fingerprint["hosts"]
    findings = findings_of(run.measurements, run.outcomes, hosts)
    matrix = node_matrix(run.measurements, run.outcomes, findings, hosts)
    matrix.add_column(Column("history", "last 5 runs", {"node022": "F F . . ."}))
    from pytest_gpucluster.results.render import markdown, page

    assert "| last 5 runs |" in markdown([("matrix", matrix)])
    assert "<td class='history'>F F . . .</td>" in page([("matrix", matrix)])


def test_the_cpu_local_report_lists_every_skip_with_its_reason(real, tmp_path):
    run = read_results(REAL_RUN)
    skipped = [o for o in run.outcomes if o.outcome == "skipped"]
    assert len(skipped) == 21
    groups = skip_groups(run.outcomes)
    assert sum(len(g.tests) for g in groups) == 21 and len(groups) < 21
    files = write_reports(run, tmp_path, charts=False)
    md = files.markdown.read_text()
    section = md.split("## Skipped: 21 test(s)", 1)[1].split("\n## ", 1)[0]
    for o in skipped:
        reason = o.message.removeprefix("Skipped: ")
        line = next(line for line in section.splitlines() if f"`{o.test_id}`" in line)
        assert line.startswith(f"- **{reason}** (")
    page = files.html.read_text()
    assert page.count("<li>") >= len(groups)


def test_the_real_run_report_starts_with_the_verdict_and_the_matrix(tmp_path):
    files = write_reports(read_results(REAL_RUN), tmp_path, charts=False)
    lines = [line for line in files.markdown.read_text().splitlines() if line]
    assert lines[1] == "**NOT FIT: 22 passed, 1 below threshold, 21 skipped**"
    assert lines[2].startswith("1 of 1 node(s) fail: vm (rerun).")
    assert lines[3].startswith("| node | inventory | collectives intra |")
    assert lines[5].startswith("| cluster |") and lines[6].startswith("| vm |")


def test_charts_are_one_per_metric_whatever_the_fleet_size(real):
    counts = {}
    for nodes in (1, 8):
        run = RunResults.from_json(json.loads(dumps(fan_out(real, nodes)[0])), "x")
        groups = group_measurements(run.measurements)
        assert len({(g.metric, g.scope, g.fixed) for g in groups}) == len(groups)
        counts[nodes] = len(groups)
        assert not any(m.unit == "bool" for g in groups for m in g.members)
        cells = {row[0] for row in uncharted_rows(run.measurements)}
        assert {"inventory.node_probed", "fabric.error_increase"} <= cells
    assert counts[1] == counts[8]


def test_gpucluster_report_rebuilds_an_old_results_file(tmp_path, capsys):
    data = json.loads(REAL_RUN.read_text())
    data["schema_version"] = 2  # as written before `problem` and `findings`
    for m in data["measurements"]:
        m.pop("problem", None)
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert cli.main(["report", str(tmp_path / "results.json"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**NOT FIT: 22 passed, 1 below threshold, 21 skipped**" in md
    assert "| vm, rank 0 | burnin.cpu_matmul | 0.02386 TFLOP/s | >= 0.028 TFLOP/s |" in md
    assert area_of("collectives.all_reduce.busbw", "inter-node").key == "coll_inter"


def test_a_fleet_chart_names_the_planted_gpu_and_no_healthy_one(fleet64):
    pytest.importorskip("matplotlib", reason="charts need matplotlib")
    from pytest_gpucluster.results.plots import render_plots

    run, planted = fleet64
    memory = [m for m in run.measurements if m.metric in ("burnin.cpu_matmul", "sft.peak_memory")]
    matmul, peak = render_plots(memory)
    assert matmul.title == "burnin.cpu_matmul" and matmul.png.startswith(b"\x89PNG")
    slow = f"{planted.slow_node}/GPU {planted.slow_gpu}"
    assert matmul.caption.startswith(f"512 values, 1 failing (red); outliers: {slow} 0.0175")
    assert "; " not in matmul.caption.split("outliers: ", 1)[1]  # ±2% noise: no healthy GPU named
    # two SFT cases in one chart: each GPU is judged against its own case, so none stands out
    assert peak.caption.startswith("1024 values (lower is better)") and "outliers" not in peak.caption


def test_a_version_1_results_file_still_gives_the_sign_off(tmp_path):
    data = json.loads(REAL_RUN.read_text())
    data["schema_version"] = 1
    for m in data["measurements"]:
        ref = m.pop("ref", None)
        m["source"] = f"profile {ref['profile']}" if ref else ""  # version 1: prose, dropped on read
        m.pop("problem", None)
    (tmp_path / "results.json").write_text(json.dumps(data))
    files = write_reports(read_results(tmp_path / "results.json"), tmp_path, charts=False)
    md = files.markdown.read_text()
    assert "**NOT FIT: 22 passed, 1 below threshold, 21 skipped**" in md
    assert (
        "| vm, rank 0 | burnin.cpu_matmul | 0.02386 TFLOP/s | >= 0.028 TFLOP/s | no profile key recorded"
        in md
    )
