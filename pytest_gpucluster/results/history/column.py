"""The report's "history" column: per node of this run, how many of its last runs in the store
failed, and on which component (GPU, port, rank) the failures recur.

`history_record` reads the store at session end, before this run is appended (so the column is
about the runs before it), and its record goes into results.json (``history``); `history_column`
turns the record into the node matrix's column, so ``gpucluster report`` shows the same from the
file alone.

No pytest; `history_column` is pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.history.nodes import DEFAULT_WINDOW, failures, took_part
from pytest_gpucluster.results.history.store import HistoryStore
from pytest_gpucluster.results.matrix import Column

__all__ = ["history_column", "history_record", "read_history_record"]


def history_record(store: HistoryStore, hosts: Sequence[str], last: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """Per host, the runs of the last ``last`` it took part in, those that failed, and the failed
    runs per component."""
    runs = store.runs(last=last)
    joined = took_part(store, runs)
    found = failures(store, runs)
    nodes: dict[str, Any] = {}
    for host in hosts:
        mine = [f for f in found if f.host == host]
        per_component: Counter[str] = Counter()
        for component in {(f.run.id, f.component) for f in mine if f.component}:
            per_component[component[1]] += 1
        nodes[host] = {
            "runs": len(joined.get(host, [])),
            "failed_runs": len({f.run.id for f in mine}),
            "components": dict(per_component.most_common()),
        }
    return {"db": str(store.path), "last": last, "runs": len(runs), "nodes": nodes}


def read_history_record(db: Path, hosts: Sequence[str], last: int = DEFAULT_WINDOW) -> dict[str, Any] | None:
    """`history_record` of the store at ``db``; None when there is no store yet (the first run)."""
    if not Path(db).is_file():
        return None
    with HistoryStore.open(db, create=False) as store:
        return history_record(store, hosts, last)


def history_column(record: Mapping[str, Any]) -> Column:
    """The node matrix's column for a `history_record`."""
    values = {}
    for host, node in (record.get("nodes") or {}).items():
        runs, failed = int(node.get("runs") or 0), int(node.get("failed_runs") or 0)
        if not runs:
            values[host] = "no earlier run"
            continue
        text = f"{failed} of {runs} failed"
        recurring = [f"{c} in {n}" for c, n in (node.get("components") or {}).items()]
        values[host] = text + (f" ({', '.join(recurring[:2])})" if recurring else "")
    return Column("history", f"history: failed runs of the last {record.get('last', DEFAULT_WINDOW)}", values)
