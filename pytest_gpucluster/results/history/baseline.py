"""``--baseline history:N``: the regression gate's baseline from the last N healthy runs in the store.

Per measurement key, the baseline's value is the **median over the last N runs that were healthy
for it**, and its noise interval runs from the lowest low end to the highest high end of those
runs' own intervals — the rule of a fleet baseline (``results/fleet.py``, whose merge this
uses), so the gate needs a new value to fall below everything the healthy runs measured by more
than the tolerance. A value's spread (``values``, ``n``) says which runs' values it is the median of.

*Healthy for a key*: for a value that names a node (``host``/``node`` label), no finding of that
run names the node, so one bad node does not take the others' runs out of their baselines; for
a value that names none (a cluster-wide busbw), the test that measured it passed in that run, so
a failed SFT case does not take the collectives' values with it. A value that failed or was not
measured is never taken. Runs of another profile are left out (their thresholds and workloads
differ). The run being gated is not in its own baseline: it is appended at session end, after
the gate.

Reads through `HistoryStore`; no pytest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.results.baseline import RunResults
from pytest_gpucluster.results.fleet import merge_runs
from pytest_gpucluster.results.gate import latest_by_key
from pytest_gpucluster.results.history.rows import host_of
from pytest_gpucluster.results.history.store import HistoryError, HistoryStore

__all__ = ["HistoryBaseline", "history_baseline", "read_history_baseline"]


@dataclass(frozen=True, slots=True)
class HistoryBaseline:
    results: RunResults
    """The baseline as the gate reads it (a fleet-style results file)."""
    asked: int
    runs_used: tuple[int, ...]
    """The stored runs that gave at least one value, oldest first."""
    fewest: int
    """The fewest healthy runs behind any one value (below ``asked`` where history is short)."""

    def summary(self) -> str:
        short = f"; some values from only {self.fewest}" if self.fewest < self.asked else ""
        ids = ", ".join(f"#{i}" for i in self.runs_used)
        return f"median of the last {self.asked} healthy runs per value (runs {ids}{short})"


def _unhealthy(store: HistoryStore, run_ids: list[int]) -> tuple[dict[int, set[str]], dict[int, set[str]]]:
    """Per run, the nodes its findings name, and the tests that failed."""
    nodes: dict[int, set[str]] = {i: set() for i in run_ids}
    tests: dict[int, set[str]] = {i: set() for i in run_ids}
    if not run_ids:
        return nodes, tests
    marks = ",".join("?" * len(run_ids))
    for run_id, host in store.query(
        f"SELECT run_id, host FROM findings WHERE host IS NOT NULL AND run_id IN ({marks})", run_ids
    ):
        nodes[run_id].add(host)
    for run_id, test_id in store.query(
        f"SELECT run_id, test_id FROM outcomes WHERE outcome IN ('failed', 'error') AND run_id IN ({marks})",
        run_ids,
    ):
        tests[run_id].add(test_id)
    return nodes, tests


def history_baseline(
    store: HistoryStore, last: int, *, profile: str | None = None, before: int | None = None
) -> HistoryBaseline:
    """The baseline of the last ``last`` healthy runs per key (module docstring) of ``profile``'s
    runs; ``before``: as it was before run #before was stored (what that run was gated against)."""
    runs = [
        r
        for r in store.runs()
        if (profile is None or r.profile == profile) and (before is None or r.id < before)
    ]
    bad_nodes, failed_tests = _unhealthy(store, [r.id for r in runs])
    taken: dict[str, int] = {}
    chosen: list[tuple[int, RunResults]] = []
    for stored in reversed(runs):  # newest first
        results = store.results(stored.id)
        keep = []
        for key, m in latest_by_key(results.measurements).items():
            host = host_of(m.labels)
            if taken.get(key, 0) >= last or not m.measured or m.failed:
                continue
            if host in bad_nodes[stored.id] if host else m.test_id in failed_tests[stored.id]:
                continue
            taken[key] = taken.get(key, 0) + 1
            keep.append(m)
        if keep:
            chosen.append((stored.id, dataclasses.replace(results, measurements=tuple(keep))))
    if not chosen:
        which = f" of profile {profile}" if profile else ""
        raise HistoryError(
            f"{store.path} holds no healthy run{which} to take a baseline from ({len(runs)} run(s) stored); "
            "run the suite with --gpucluster-history first"
        )
    chosen.reverse()
    fleet = merge_runs([r for _, r in chosen])
    ids = tuple(i for i, _ in chosen)
    source = f"history:{last} of {store.path} (runs {', '.join(f'#{i}' for i in ids)})"
    data = fleet.to_json()
    data["fleet"]["method"] = (
        f"per key: the median over the last {last} runs healthy for it; noise: the lowest low end to the "
        "highest high end of their intervals"
    )
    return HistoryBaseline(RunResults.from_json(data, source), last, ids, min(taken.values()))


def read_history_baseline(db: Path, last: int, profile: str | None) -> HistoryBaseline:
    """`history_baseline` of the store at ``db`` (which must exist)."""
    with HistoryStore.open(db, create=False) as store:
        return history_baseline(store, last, profile=profile)
