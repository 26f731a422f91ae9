"""What the history says about each node: its failures run by run, the lemons, one metric's trend.

A node *failed* in a run when one of the run's findings (``results/findings.py``, stored with
the run) names it: a value of the node that missed its threshold or could not be measured, or a
failed test whose message names the node. Each failure keeps its evidence: the run, the test,
the metric, the component (GPU, port, rank), the measured value against the threshold, the
reason class and the next action from the findings' ladder.

**Lemons** (the nodes to take out of the pool), over the last ``window`` runs:

* the node failed in more than ``max_failure_rate`` of the runs it took part in (and in at
  least 2 of them: a node seen once is not judged on one bad run), or
* the same component of the node failed in ``recurring`` or more runs: a GPU that fails again
  and again is the GPU, not bad luck.

Only failures that are the node's own count: a finding of reason class ``threshold`` (the value
missed alike across the fleet, or no peer could tell) says the profile or the whole fabric is
off, not this node, and is shown by ``history node`` but never makes a lemon. A node with one
transient failure is named by neither rule. The defaults (10 runs, 20 %, 3 runs) are policy, not
a measurement: one bad run in ten is tolerated, three are not.

Reads through `HistoryStore`; no pytest.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pytest_gpucluster.results.history.store import HistoryStore, StoredRun
from pytest_gpucluster.results.text import format_value

__all__ = [
    "DEFAULT_MAX_FAILURE_RATE",
    "DEFAULT_RECURRING",
    "DEFAULT_WINDOW",
    "Failure",
    "Lemon",
    "NodeHistory",
    "failures",
    "find_lemons",
    "node_history",
    "trend",
]

DEFAULT_WINDOW = 10
DEFAULT_MAX_FAILURE_RATE = 0.2
DEFAULT_RECURRING = 3
FLEET_REASONS = frozenset({"threshold"})
"""Reason classes that do not count against a node (module docstring)."""


def when(run: StoredRun) -> str:
    if run.started_at is None:
        return "(no start time)"
    return datetime.fromtimestamp(run.started_at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed check (or finding) naming a node in one run."""

    run: StoredRun
    host: str
    component: str | None
    metric: str
    test_id: str
    value: float | None
    threshold: float | None
    unit: str
    comparison: str
    reason_class: str
    action: str | None = None

    def line(self) -> str:
        where = self.component or "the node"
        measured = (
            "no value"
            if self.value is None
            else format_value(self.value, self.unit)
            + (
                ""
                if self.threshold is None
                else f" vs {self.comparison} {format_value(self.threshold, self.unit)}"
            )
        )
        action = f"; next: {self.action}" if self.action else ""
        return (
            f"run #{self.run.id} {when(self.run)}: {where}: {self.metric} {measured} "
            f"({self.reason_class}; {self.test_id or 'no test'}){action}"
        )


def failures(store: HistoryStore, runs: Sequence[StoredRun]) -> list[Failure]:
    """Every finding of ``runs`` that names a node (``results/findings.py``: a failed value, the
    last of its key, or a failed test whose message names one host), in run order."""
    by_id = {r.id: r for r in runs}
    if not by_id:
        return []
    marks = ",".join("?" * len(by_id))
    out = []
    for run_id, host, component, metric, reason, action, data in store.query(
        f"SELECT run_id, host, component, metric, reason_class, action, data FROM findings "
        f"WHERE run_id IN ({marks}) AND host IS NOT NULL ORDER BY run_id, seq",
        tuple(by_id),
    ):
        finding = json.loads(data)
        out.append(
            Failure(by_id[run_id], host, component, metric, str(finding.get("test_id") or ""),
                    finding.get("measured"), finding.get("threshold"), str(finding.get("unit") or ""),
                    str(finding.get("comparison") or ""), reason, action)
        )  # fmt: skip
    return out


def took_part(store: HistoryStore, runs: Sequence[StoredRun]) -> dict[str, list[StoredRun]]:
    """Per node, the runs it took part in: in the run's hosts, or named by one of its values."""
    seen: dict[str, set[int]] = defaultdict(set)
    for run in runs:
        for host in run.hosts:
            seen[host].add(run.id)
    if runs:
        marks = ",".join("?" * len(runs))
        for run_id, host in store.query(
            f"SELECT DISTINCT run_id, host FROM measurements WHERE run_id IN ({marks}) AND host IS NOT NULL",
            tuple(r.id for r in runs),
        ):
            seen[host].add(run_id)
    return {host: [r for r in runs if r.id in ids] for host, ids in seen.items()}


@dataclass(frozen=True, slots=True)
class Lemon:
    host: str
    runs: int
    """Runs of the window the node took part in."""
    failed_runs: int
    why: tuple[str, ...]
    """Which rule named it, as sentences with the numbers."""
    evidence: tuple[Failure, ...]

    @property
    def failure_rate(self) -> float:
        return self.failed_runs / self.runs if self.runs else 0.0


def find_lemons(
    store: HistoryStore,
    *,
    window: int = DEFAULT_WINDOW,
    max_failure_rate: float = DEFAULT_MAX_FAILURE_RATE,
    recurring: int = DEFAULT_RECURRING,
) -> list[Lemon]:
    """The nodes either rule names over the last ``window`` runs (module docstring), worst first."""
    runs = store.runs(last=window)
    found = [f for f in failures(store, runs) if f.reason_class not in FLEET_REASONS]
    by_host: dict[str, list[Failure]] = defaultdict(list)
    for failure in found:
        by_host[failure.host].append(failure)
    lemons = []
    for host, joined in took_part(store, runs).items():
        host_failures = by_host.get(host, [])
        failed_runs = len({f.run.id for f in host_failures})
        why = []
        rate = failed_runs / len(joined) if joined else 0.0
        if failed_runs >= 2 and rate > max_failure_rate:
            why.append(
                f"failed in {failed_runs} of its last {len(joined)} runs ({rate:.0%}, more than "
                f"{max_failure_rate:.0%})"
            )
        per_component: dict[str, set[int]] = defaultdict(set)
        for f in host_failures:
            if f.component is not None:
                per_component[f.component].add(f.run.id)
        for component, run_ids in sorted(per_component.items()):
            if len(run_ids) >= recurring:
                metrics = sorted({f.metric for f in host_failures if f.component == component})
                why.append(
                    f"{component} failed in {len(run_ids)} runs ({', '.join(metrics)}; "
                    f"{recurring} or more runs is a recurring failure)"
                )
        if why:
            lemons.append(Lemon(host, len(joined), failed_runs, tuple(why), tuple(host_failures)))
    return sorted(lemons, key=lambda lemon: (-lemon.failure_rate, lemon.host))


@dataclass(frozen=True, slots=True)
class NodeHistory:
    host: str
    runs: tuple[StoredRun, ...]
    failures: tuple[Failure, ...]
    counters: dict[str, list[tuple[StoredRun, float]]] = field(default_factory=dict)
    """Per counter metric (XID, ECC, fabric error counters), its value in each run."""

    @property
    def by_reason(self) -> dict[str, int]:
        """Runs that failed, per reason class."""
        out: dict[str, set[int]] = defaultdict(set)
        for f in self.failures:
            out[f.reason_class].add(f.run.id)
        return {reason: len(ids) for reason, ids in sorted(out.items())}


COUNTER_WORDS = ("xid", "ecc", "error", "counter", "retired", "remapped")
"""A metric whose name holds one of these is shown as a counter over time by ``history node``."""


def node_history(store: HistoryStore, host: str, *, window: int | None = None) -> NodeHistory:
    runs = store.runs(last=window)
    joined = took_part(store, runs).get(host, [])
    node_failures = tuple(f for f in failures(store, joined) if f.host == host)
    counters: dict[str, list[tuple[StoredRun, float]]] = defaultdict(list)
    by_id = {r.id: r for r in joined}
    if joined:
        marks = ",".join("?" * len(joined))
        for run_id, metric, component, value in store.query(
            f"SELECT run_id, metric, component, value FROM measurements WHERE host = ? AND value IS NOT NULL "
            f"AND run_id IN ({marks}) ORDER BY run_id, seq",
            (host, *by_id),
        ):
            if any(word in metric.lower() for word in COUNTER_WORDS):
                name = metric + (f" [{component}]" if component else "")
                counters[name].append((by_id[run_id], float(value)))
    return NodeHistory(host, tuple(joined), node_failures, dict(counters))


def trend(
    store: HistoryStore, metric: str, *, window: int | None = None
) -> tuple[list[StoredRun], dict[str, dict[int, tuple[float, int]]]]:
    """``metric`` per node across runs: for each node (``(cluster)`` for values naming none), per
    run, the median of its values in that run (over GPUs, sizes, ranks) and how many there were."""
    runs = store.runs(last=window)
    if not runs:
        return [], {}
    marks = ",".join("?" * len(runs))
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run_id, host, value in store.query(
        f"SELECT run_id, host, value FROM measurements WHERE metric = ? AND value IS NOT NULL "
        f"AND run_id IN ({marks}) ORDER BY run_id, seq",
        (metric, *(r.id for r in runs)),
    ):
        values[host or "(cluster)"][run_id].append(float(value))
    series = {
        host: {run_id: (statistics.median(vs), len(vs)) for run_id, vs in per_run.items()}
        for host, per_run in sorted(values.items())
    }
    return [r for r in runs if any(r.id in s for s in series.values())], series
