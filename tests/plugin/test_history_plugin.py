"""--gpucluster-history seen from outside: every run is appended at session end, whichever of
command line, environment or ini names the store, failed runs included; a store that cannot
take the run is said in the summary and does not fail the run."""

import socket

import pytest

from pytest_gpucluster.results.history.store import HistoryStore

SOURCE = """
import socket

def test_fast(results):
    results.check("demo.busbw", 2e9, 1e9, unit="B/s", labels={"host": socket.gethostname(), "gpu": "GPU 3"})

def test_slow(results):
    results.check("demo.busbw", 1e9, 2e9, unit="B/s", labels={"host": socket.gethostname(), "gpu": "GPU 1"})
"""


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("GPUCLUSTER_HISTORY", raising=False)
    pytester.makepyfile(test_demo=SOURCE)

    def _run(*args, results="res"):
        monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
        return pytester.runpytest_inprocess(f"--results-dir={tmp_path / results}", *args)

    return _run


def test_each_run_is_appended_from_cli_env_or_ini(run, pytester, tmp_path, monkeypatch):
    db = tmp_path / "hist" / "h.db"
    first = run(f"--gpucluster-history={db}", results="a")
    assert first.ret == 1  # test_slow failed: the run is stored all the same
    first.stdout.fnmatch_lines([f"history {db}: appended run #1 (2 measurements)"])
    monkeypatch.setenv("GPUCLUSTER_HISTORY", str(db))
    run(results="b").stdout.fnmatch_lines([f"history {db}: appended run #2 (2 measurements)"])
    monkeypatch.delenv("GPUCLUSTER_HISTORY")
    pytester.makeini(f"[pytest]\ngpucluster_history = {db}\n")
    run(results="c").stdout.fnmatch_lines([f"history {db}: appended run #3 (2 measurements)"])
    with HistoryStore.open(db, create=False) as store:
        runs = store.runs()
        assert [r.tests_failed for r in runs] == [1, 1, 1]
        failed = store.query("SELECT host, component, metric FROM measurements WHERE verdict = 'fail'")
    host = socket.gethostname()
    assert failed == [(host, "GPU 1", "demo.busbw")] * 3
    # the report's node matrix has a history column: the runs before this one
    report = (tmp_path / "c" / "report.md").read_text().splitlines()
    header = next(line for line in report if line.startswith("| node "))
    assert header.rstrip(" |").endswith("history: failed runs of the last 10")
    row = next(line for line in report if line.startswith(f"| {host} |"))
    assert row.rstrip(" |").endswith("2 of 2 failed (GPU 1 in 2)")


def test_a_store_that_cannot_be_written_is_said_not_failed(run, tmp_path):
    db = tmp_path / "h.db"
    db.write_text("not a database\n" * 100)
    result = run(f"--gpucluster-history={db}", "-k", "fast")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [f"WARNING history: this run was not appended to {db}: *not a readable history store*"
         f"gpucluster history add --db {db} *results.json"]
    )  # fmt: skip


GATED = """
import os

def test_busbw(results):
    value = float(os.environ.get("DEMO_BUSBW", "2e9"))
    results.check("demo.busbw", value, 1e9, unit="B/s", labels={"host": "n1"})
"""


def test_baseline_history_n_gates_against_the_stored_runs(run, pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_demo=GATED)
    db = tmp_path / "h.db"
    for i, value in enumerate(("2.0e9", "2.1e9", "1.9e9")):
        monkeypatch.setenv("DEMO_BUSBW", value)
        assert run(f"--gpucluster-history={db}", results=f"r{i}").ret == 0
    monkeypatch.setenv("DEMO_BUSBW", "1.95e9")  # inside the stored runs' range: no regression
    healthy = run(f"--gpucluster-history={db}", "--baseline=history:2", results="ok")
    assert healthy.ret == 0
    healthy.stdout.fnmatch_lines(
        ["gpucluster: baseline history:2: median of the last 2 healthy runs per value (runs #2, #3)"]
    )
    monkeypatch.setenv("DEMO_BUSBW", "1.2e9")  # above the threshold, far below the history
    slow = run(f"--gpucluster-history={db}", "--baseline=history:2", results="slow")
    assert slow.ret == 1
    slow.stdout.fnmatch_lines(["*REGRESSION demo.busbw*"])


def test_baseline_history_needs_the_store(run, monkeypatch):
    result = run("--baseline=history:5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--baseline: history:5 takes the baseline from the run history*"])
