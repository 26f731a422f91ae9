"""The fleet's memory: every run appended to one SQLite store, and what it tells over time.

``store`` (the file: schema, migrations, atomic appends), ``rows`` (a results.json as rows),
``nodes`` (per-node summaries, lemons, trends), ``baseline`` (the regression gate's baseline
from the last healthy runs), ``cli`` (``gpucluster history``). No pytest anywhere here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.baseline import ResultsFileError, RunResults

__all__ = ["HISTORY_ENV", "read_run_file", "record_run"]

HISTORY_ENV = "GPUCLUSTER_HISTORY"
"""The store ``gpucluster history`` uses without ``--db`` (the same variable the plugin reads)."""


def read_run_file(path: Path) -> tuple[RunResults, list[Mapping[str, Any]]]:
    """A results.json of any version the results reader accepts, with its ``findings`` (if any)."""
    from pytest_gpucluster.results.baseline import read_results

    run = read_results(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:  # read_results read it a moment ago
        raise ResultsFileError(f"cannot read {path}: {exc}") from None
    findings = data.get("findings") or []
    if not isinstance(findings, list) or not all(isinstance(f, Mapping) for f in findings):
        raise ResultsFileError(f"{path}: 'findings' should be a list of objects")
    return run, findings


def record_run(db: Path, results_json: Path) -> str:
    """Append the run of ``results_json`` to the store at ``db``; the sentence that says so."""
    from pytest_gpucluster.results.history.store import HistoryStore

    run, findings = read_run_file(results_json)
    with HistoryStore.open(db) as store:
        return store.append(run, findings).sentence(db)
