"""The history store at the end of a pytest session (``--gpucluster-history``): each node's
failures in the store's last runs go into results.json for the report's matrix (read before
this run is appended), then the finished run is appended.

Called by `plugin.pytest_sessionfinish` with plain values; no pytest, nothing of `session/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.recorder import Recorder

__all__ = ["add_history_column", "append_run"]


def add_history_column(history: Path | None, hosts: Sequence[str], recorder: Recorder) -> None:
    """Each node's failures in the store's last runs, for the report's matrix (read before this
    run is appended); an unreadable store is said when the append fails on it too."""
    from pytest_gpucluster.results.history.column import read_history_record

    if history is None:
        return
    try:
        record = read_history_record(history, list(hosts))
    except GpuClusterError:
        return
    if record is not None:
        recorder.header["history"] = record


def append_run(db: Path | None, recorder: Recorder) -> str:
    """Append the finished run to the history store; a store that cannot take it is said, never
    a failure of the run (its results.json stands, and `gpucluster history add` takes it later)."""
    from pytest_gpucluster.results.history import record_run

    if db is None:
        return ""
    recorder.flush()
    try:
        return record_run(db, recorder.path)
    except GpuClusterError as exc:
        return (
            f"WARNING history: this run was not appended to {db}: {exc}; "
            f"append it later with: gpucluster history add --db {db} {recorder.path}"
        )
