"""`gpucluster history lemons|node|trend` on ten stored runs: three real cpu-local suite runs, then
seven four-node runs fanned out of real runs (`history_runs.fan_out`). node03's GPU 1 fails in
four of them (the recorded slow-rank runs), node02 fails once (the run recorded while the machine
was loaded), the single-node host ``vm`` once: only node03 is a lemon."""

from __future__ import annotations

import pytest
from history_runs import HEALTHY, LOADED, SLOW_RANK, fan_out, real_run

from pytest_gpucluster.cli import main
from pytest_gpucluster.results.history.nodes import find_lemons, node_history
from pytest_gpucluster.results.history.store import HistoryStore

T0 = 1_800_000_000.0


def _ten_runs() -> list:
    healthy = [real_run(n) for n in HEALTHY]
    slow = [real_run(n) for n in SLOW_RANK]
    loaded = real_run(LOADED)
    runs = [healthy[0], loaded, healthy[1]]  # real single-node runs on host vm, as recorded
    node03 = {4: slow[0], 6: slow[1], 7: slow[0], 9: slow[1]}
    for i in range(3, 10):
        nodes = {
            "node01": healthy[i % 4],
            "node02": loaded if i == 5 else healthy[(i + 1) % 4],
            "node03": node03.get(i, healthy[(i + 2) % 4]),
            "node04": healthy[(i + 3) % 4],
        }
        runs.append(fan_out(nodes, started_at=T0 + 3600 * i))
    return runs


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "history.db"
    with HistoryStore.open(path) as store:
        for run in _ten_runs():
            assert store.append(run).added
    return path


def test_the_node_failing_on_one_gpu_is_the_only_lemon(db):
    with HistoryStore.open(db) as store:
        assert len(store.runs()) == 10
        [lemon] = find_lemons(store)
    assert lemon.host == "node03"
    assert (lemon.runs, lemon.failed_runs) == (7, 4)
    assert any(why.startswith("GPU 1 failed in 4 runs") for why in lemon.why)
    assert any(why.startswith("failed in 4 of its last 7 runs") for why in lemon.why)
    assert {f.component for f in lemon.evidence} == {"GPU 1"}
    assert {f.metric for f in lemon.evidence} == {"burnin.cpu_matmul", "burnin.cpu_memory_bandwidth"}
    # its GPU 1 misses while the GPUs of the other nodes pass: a hardware finding, reset the GPU
    assert {(f.reason_class, f.action) for f in lemon.evidence} == {("hardware", "reset GPU")}


def test_lemons_prints_the_evidence_and_exits_1(db, capsys):
    assert main(["history", "lemons", "--db", str(db)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("lemon nodes over the last 10 run(s)") and lines[0].endswith(": 1")
    assert lines[1].startswith("node03: failed in 4 of its last 7 runs (57%")
    assert "GPU 1 failed in 4 runs (burnin.cpu_matmul, burnin.cpu_memory_bandwidth" in lines[1]
    evidence = [line for line in lines[2:] if line.startswith("  run #")]
    assert len({line.split()[1] for line in evidence}) == 4
    assert all(": GPU 1: burnin.cpu_" in line and "vs >= " in line for line in evidence)
    assert "node02" not in out and "vm" not in out


def test_one_transient_failure_is_not_named_even_on_a_short_window(db):
    with HistoryStore.open(db) as store:
        node02 = node_history(store, "node02")
        vm = node_history(store, "vm")
        assert [lemon.host for lemon in find_lemons(store, window=5)] == ["node03"]
    assert (len(node02.runs), len({f.run.id for f in node02.failures})) == (7, 1)
    assert (len(vm.runs), len({f.run.id for f in vm.failures})) == (3, 1)
    assert {f.component for f in node02.failures} == {"GPU 0", "GPU 1"}


def test_a_stricter_rule_names_more_but_never_a_fleet_wide_miss(db):
    """With one failed run enough, node02 is named too (its GPUs missed while the other nodes'
    passed: hardware); vm is not: in its single-node run both ranks missed alike (threshold)."""
    with HistoryStore.open(db) as store:
        names = [lemon.host for lemon in find_lemons(store, max_failure_rate=0.1, recurring=1)]
        vm = node_history(store, "vm")
    assert names == ["node03", "node02"]
    assert vm.by_reason == {"threshold": 1}


def test_node_shows_failures_by_reason_class(db, capsys):
    assert main(["history", "node", "node03", "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "node node03: 7 run(s), failed in 4"
    assert "  hardware: 4 run(s)" in out


def test_trend_shows_one_metric_per_node_across_runs(db, capsys):
    assert main(["history", "trend", "burnin.cpu_matmul", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    assert header[:2] == ["run", "started"] and header[-5:] == ["node01", "node02", "node03", "node04", "vm"]
    assert len(lines) == 2 + 10
    assert all("TFLOP/s (n=2)" in line for line in lines[2:])


def test_unknown_metric_or_node_is_one_sentence(db, capsys):
    assert main(["history", "trend", "no.such.metric", "--db", str(db)]) == 2
    assert main(["history", "node", "node99", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "the history holds no value of 'no.such.metric'" in err
    assert "the history holds no run on node node99" in err


def test_without_db_or_env_the_command_says_how(monkeypatch, capsys):
    monkeypatch.delenv("GPUCLUSTER_HISTORY", raising=False)
    assert main(["history", "lemons"]) == 2
    assert "pass --db PATH or set GPUCLUSTER_HISTORY" in capsys.readouterr().err


def test_add_ingests_results_files_and_reads_the_env_default(tmp_path, monkeypatch, capsys):
    from history_runs import DATA

    db = tmp_path / "h.db"
    monkeypatch.setenv("GPUCLUSTER_HISTORY", str(db))
    files = [str(DATA / f"{n}.json") for n in (*HEALTHY[:2], HEALTHY[0])]
    assert main(["history", "add", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split(" (")[0] for line in out] == [
        "added as run #1",
        "added as run #2",
        "already stored as run #1",
    ]


def test_add_takes_every_results_version_the_reader_accepts(tmp_path, capsys):
    """Version 1 (a free-text source), 2 (the recorded runs here) and 3 (this plugin's, written
    back from the store): each is stored, and comes back with its values."""
    import json

    from history_runs import DATA
    from test_baseline import VERSION_1

    from pytest_gpucluster.results.model import SCHEMA_VERSION

    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(VERSION_1))
    db = tmp_path / "h.db"
    assert main(["history", "add", "--db", str(db), str(v1), str(DATA / f"{HEALTHY[0]}.json")]) == 0
    with HistoryStore.open(db) as store:
        back = store.results(2)
        v3 = tmp_path / "v3.json"
        data = {
            "schema_version": SCHEMA_VERSION,
            "started_at": 1.9e9,
            "fingerprint": back.fingerprint,
            "profile": back.profile,
            "measurements": [m.to_json() for m in back.measurements],
            "outcomes": [],
        }
        v3.write_text(json.dumps(data))
        assert store.results(1).measurements[0].value == 1.2e9
    assert main(["history", "add", "--db", str(db), str(v3)]) == 0
    assert "added as run #3" in capsys.readouterr().out.splitlines()[-1]
    assert SCHEMA_VERSION >= 3


def test_trend_draws_one_chart_with_the_outlier_nodes(db, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    png = tmp_path / "trend.png"
    assert main(["history", "trend", "burnin.cpu_memory_bandwidth", "--db", str(db), "--plot", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"chart: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
