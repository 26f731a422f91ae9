"""The history store at the end of a pytest session (``--gpucluster-history``): each node's
failures in the store's last runs go into results.json for the report's matrix (read before
this run is appended), then the finished run is appended.

Called by `plugin.pytest_sessionfinish`; no pytest import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_gpucluster.errors import GpuClusterError

if TYPE_CHECKING:
    from pytest_gpucluster.session import GpuClusterSession

__all__ = ["add_history_column", "append_run"]


def add_history_column(gc: GpuClusterSession) -> None:
    """Each node's failures in the store's last runs, for the report's matrix (read before this
    run is appended); an unreadable store is said when the append fails on it too."""
    from pytest_gpucluster.results.history.column import read_history_record

    if gc.settings.history is None:
        return
    try:
        record = read_history_record(gc.settings.history, gc.hosts)
    except GpuClusterError:
        return
    if record is not None:
        gc.recorder.header["history"] = record


def append_run(gc: GpuClusterSession) -> str:
    """Append the finished run to the history store; a store that cannot take it is said, never
    a failure of the run (its results.json stands, and `gpucluster history add` takes it later)."""
    from pytest_gpucluster.results.history import record_run

    db = gc.settings.history
    if db is None:
        return ""
    gc.recorder.flush()
    try:
        return record_run(db, gc.recorder.path)
    except GpuClusterError as exc:
        return (
            f"WARNING history: this run was not appended to {db}: {exc}; "
            f"append it later with: gpucluster history add --db {db} {gc.recorder.path}"
        )
