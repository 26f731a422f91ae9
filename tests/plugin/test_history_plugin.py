"""--gpucluster-history seen from outside: every run is appended at session end, whichever of
command line, environment or ini names the store, failed runs included; a store that cannot
take the run is said in the summary and does not fail the run."""

import pytest

from pytest_gpucluster.results.history.store import HistoryStore

SOURCE = """
def test_fast(results):
    results.check("demo.busbw", 2e9, 1e9, unit="B/s", labels={"host": "n1", "gpu": "GPU 3"})

def test_slow(results):
    results.check("demo.busbw", 1e9, 2e9, unit="B/s", labels={"host": "n2", "gpu": "GPU 1"})
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
    assert failed == [("n2", "GPU 1", "demo.busbw")] * 3


def test_a_store_that_cannot_be_written_is_said_not_failed(run, tmp_path):
    db = tmp_path / "h.db"
    db.write_text("not a database\n" * 100)
    result = run(f"--gpucluster-history={db}", "-k", "fast")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [f"WARNING history: this run was not appended to {db}: *not a readable history store*"
         f"gpucluster history add --db {db} *results.json"]
    )  # fmt: skip
