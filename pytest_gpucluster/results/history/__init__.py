"""The fleet's memory: every run appended to one SQLite store, and what it tells over time.

``store`` (the file: schema, migrations, atomic appends), ``rows`` (a results.json as rows),
``nodes`` (per-node summaries, lemons, trends), ``baseline`` (the regression gate's baseline
from the last healthy runs), ``cli`` (``gpucluster history``). No pytest anywhere here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HISTORY_ENV", "record_run"]

HISTORY_ENV = "GPUCLUSTER_HISTORY"
"""The store ``gpucluster history`` uses without ``--db`` (the same variable the plugin reads)."""


def record_run(db: Path, results_json: Path) -> str:
    """Append the run of ``results_json`` to the store at ``db``; the sentence that says so."""
    from pytest_gpucluster.results.baseline import read_results
    from pytest_gpucluster.results.history.store import HistoryStore

    run = read_results(results_json)
    with HistoryStore.open(db) as store:
        return store.append(run).sentence(db)
