"""The history store on real recorded runs: schema version and migrations, appends that store a
run once and give it back whole, and what the rows say about nodes and components."""

from __future__ import annotations

import sqlite3

import pytest
from history_runs import HEALTHY, LOADED, real_run

from pytest_gpucluster.results.history import record_run
from pytest_gpucluster.results.history.rows import component_of, host_of
from pytest_gpucluster.results.history.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    HistoryError,
    HistoryStore,
)


def test_a_new_store_is_at_the_current_version(tmp_path):
    with HistoryStore.open(tmp_path / "h.db") as store:
        assert store.version == SCHEMA_VERSION == len(MIGRATIONS)
        assert store.runs() == []


def test_an_older_store_is_migrated_keeping_its_runs(tmp_path, monkeypatch):
    """A store written at version 1, opened by a plugin that knows a version 2: the missing step
    runs, and the stored runs stay."""
    db = tmp_path / "h.db"
    with HistoryStore.open(db) as store:
        store.append(real_run(HEALTHY[0]))
    step = ("ALTER TABLE runs ADD COLUMN note TEXT",)
    monkeypatch.setattr("pytest_gpucluster.results.history.store.MIGRATIONS", (*MIGRATIONS, step))
    monkeypatch.setattr("pytest_gpucluster.results.history.store.SCHEMA_VERSION", len(MIGRATIONS) + 1)
    with HistoryStore.open(db) as store:
        assert store.version == len(MIGRATIONS) + 1
        assert len(store.runs()) == 1
        assert store.query("SELECT note FROM runs") == [(None,)]


def test_a_store_from_a_newer_plugin_is_refused(tmp_path):
    db = tmp_path / "h.db"
    HistoryStore.open(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(HistoryError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade the plugin"):
        HistoryStore.open(db)


def test_a_file_that_is_not_a_store_is_named(tmp_path):
    db = tmp_path / "h.db"
    db.write_text("not a database\n" * 100)
    with pytest.raises(HistoryError, match=f"{db} is not a readable history store"):
        HistoryStore.open(db)


def test_reading_a_missing_store_says_how_one_is_made(tmp_path):
    with pytest.raises(HistoryError, match=r"no history store at .*--gpucluster-history"):
        HistoryStore.open(tmp_path / "none.db", create=False)


def test_a_run_is_stored_once_and_comes_back_whole(tmp_path):
    run = real_run(LOADED)
    db = tmp_path / "h.db"
    with HistoryStore.open(db) as store:
        first = store.append(run)
        again = store.append(run)
        assert first.added and not again.added and again.run_id == first.run_id
        (stored,) = store.runs()
        back = store.results(stored.id)
    assert [m.to_json() for m in back.measurements] == [m.to_json() for m in run.measurements]
    assert back.outcomes == run.outcomes
    assert back.fingerprint == run.fingerprint and back.profile == run.profile
    assert stored.tests_failed == sum(o.outcome == "failed" for o in run.outcomes) > 0
    assert not stored.healthy
    assert stored.hosts == ("vm",)


def test_record_run_appends_a_results_file_and_says_so(tmp_path):
    from history_runs import DATA

    line = record_run(tmp_path / "h.db", DATA / f"{HEALTHY[1]}.json")
    assert line.startswith(f"history {tmp_path / 'h.db'}: appended run #1 (")
    assert "stored already (run #1)" in record_run(tmp_path / "h.db", DATA / f"{HEALTHY[1]}.json")


@pytest.mark.parametrize(
    ("labels", "host", "component"),
    [
        ({"host": "n1", "rank": 3, "gpu": "GPU 1"}, "n1", "GPU 1"),
        ({"node": "n2", "gpu": "all", "test": "(dcgmi)"}, "n2", None),
        ({"node": "n2", "gpu": 0, "test": "Diagnostic"}, "n2", "GPU 0"),
        ({"host": "n3", "device": "mlx5_0", "port": "1"}, "n3", "port mlx5_0/1"),
        ({"node": "n3", "device": "eth0"}, "n3", "port eth0"),
        ({"host": "n4", "rank": 1}, "n4", "rank 1"),
        ({"rank": 1, "host": "n4", "injected": True}, "n4", "rank 1"),
        ({"collective": "all_reduce", "size_bytes": 1024}, None, None),
    ],
)
def test_node_and_component_of_labels(labels, host, component):
    assert host_of(labels) == host
    assert component_of(labels) == component
