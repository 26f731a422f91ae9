"""The node × area matrix of the sign-off: one row per node (failing nodes first), one column per area.

Each cell says what the run found for that node in that area — ``pass``, ``fail``, ``n.a.`` (the
area's tests were all skipped: the skip reason is the cell's note), ``not run`` (nothing ran, or
the area measured other nodes but not this one) or ``—`` (the area has values, but none names a
node: they are in the cluster row) — with the count of measurements behind it. The cluster row
holds what names no node: inter-node sweeps, scaling, SFT, a job that failed without naming a
host.

The columns are data: `AREAS` (what the run measured, by metric prefix and test id) and then any
`Column` added with `NodeMatrix.add_column` (the next action per node; a history of earlier runs).

Pure; no pytest, no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pytest_gpucluster.results.findings import Finding, host_of
from pytest_gpucluster.results.model import Measurement, TestOutcome

__all__ = ["AREAS", "CLUSTER", "Area", "Cell", "Column", "NodeMatrix", "Row", "area_of", "node_matrix"]

Status = Literal["pass", "fail", "n.a.", "not run", "—"]
CLUSTER = "cluster"
"""The name of the row of values that name no node."""


@dataclass(frozen=True, slots=True)
class Area:
    """A column of the matrix: the metrics (prefixes) and tests (fnmatch patterns) that belong to it."""

    key: str
    title: str
    metrics: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()
    scope: str | None = None
    """Only values of this scope (collectives: ``inter-node``); None: any scope."""


AREAS: tuple[Area, ...] = (
    Area("inventory", "inventory", ("inventory.", "cluster.", "versions"), ("*test_inventory.py::*",)),
    Area("preflight", "preflight", ("preflight.",), ("*test_preflight*",)),
    Area("coll_intra", "collectives intra", ("collectives.",), ("*test_collectives.py::*",)),
    Area(
        "coll_inter",
        "collectives inter",
        ("collectives.",),
        ("*test_collectives.py::*inter-node*",),
        "inter-node",
    ),
    Area("nvlink", "NVLink", ("nvlink.",), ("*test_nvlink.py::*",)),
    Area("nccl", "NCCL", ("nccl.", "net_plugin.", "agreement."), ("*test_nccl.py::*",)),
    Area("sft", "SFT / scaling", ("sft.", "scaling."), ("*test_sft.py::*", "*test_scaling.py::*")),
    Area("health", "burn-in GPU health", ("burnin.",), ("*test_burnin.py::*", "*test_fabric.py::test_dcgm*")),
    Area(
        "counters",
        "counters / XID",
        (
            "burnin.ecc_uncorrected",
            "burnin.xid",
            "burnin.remapped_rows",
            "burnin.retired_pages",
            "burnin.row_remap_failure",
            "burnin.counter_increases",
            "burnin.gpus_lost",
        ),
        ("*test_burnin.py::test_counters_*",),
    ),
    Area("fabric", "fabric", ("fabric.", "burnin.soak.", "burnin.pair_"), ("*test_fabric.py::*",)),
    Area("numerics", "numerics", ("numerics.",), ("*test_numerics*",)),
)


def _best(candidates: Iterable[tuple[int, Area]]) -> Area | None:
    ranked = sorted(candidates, key=lambda c: -c[0])
    return ranked[0][1] if ranked else None


def area_of(metric: str, scope: str | None = None, areas: Sequence[Area] = AREAS) -> Area | None:
    """The area of a metric: the longest matching prefix, a scoped area before an unscoped one. A
    profile key that was not measured (``profile.burnin.min_matmul``) is in the area of its key."""
    metric = metric.removeprefix("profile.")
    return _best(
        (len(prefix) + (1000 if a.scope else 0), a)
        for a in areas
        for prefix in a.metrics
        if metric.startswith(prefix) and (a.scope is None or a.scope == scope)
    )


def area_of_test(test_id: str, areas: Sequence[Area] = AREAS) -> Area | None:
    """The area of a test id: the longest matching pattern (the most specific)."""
    return _best((len(p), a) for a in areas for p in a.tests if fnmatch.fnmatchcase(test_id, p))


@dataclass(frozen=True, slots=True)
class Cell:
    status: Status
    count: int = 0
    """Measurements behind the cell."""
    failed: int = 0
    note: str = ""
    """Why: the skip reason of an n.a., what failed, where the values are."""


@dataclass(frozen=True, slots=True)
class Column:
    """A column after the areas, one text per row (the next action; a history column)."""

    key: str
    title: str
    values: Mapping[str, str] = field(default_factory=dict)
    """Row name (a node, or `CLUSTER`) -> text; a row without a value shows nothing."""


@dataclass(slots=True)
class Row:
    name: str
    cells: dict[str, Cell]

    @property
    def failed(self) -> int:
        return sum(c.status == "fail" for c in self.cells.values())


@dataclass(slots=True)
class NodeMatrix:
    areas: tuple[Area, ...]
    rows: list[Row]
    """The cluster row first, then the nodes: failing ones first (most failed areas first)."""
    columns: list[Column] = field(default_factory=list)

    def add_column(self, column: Column) -> None:
        self.columns.append(column)

    @property
    def nodes(self) -> list[Row]:
        return [r for r in self.rows if r.name != CLUSTER]

    def failing_nodes(self) -> list[str]:
        return [r.name for r in self.nodes if r.failed]


def natural_key(name: str) -> tuple[object, ...]:
    """node2 before node10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _skip_reason(message: str) -> str:
    return message.removeprefix("Skipped: ").strip() or "(no reason given)"


def _cell(ms: Sequence[Measurement], extra_failures: Sequence[str] = ()) -> Cell:
    failed = [m for m in ms if m.failed]
    notes = [f"{m.metric}" for m in failed[:3]] + list(extra_failures)
    if failed or extra_failures:
        return Cell(
            "fail", len(ms), len(failed) + len(extra_failures), "failed: " + ", ".join(dict.fromkeys(notes))
        )
    return Cell("pass", len(ms))


def node_matrix(
    measurements: Sequence[Measurement],
    outcomes: Sequence[TestOutcome],
    findings: Sequence[Finding],
    hosts: Iterable[str] = (),
    areas: Sequence[Area] = AREAS,
) -> NodeMatrix:
    """The matrix of a run (module docstring); areas with nothing in the run are left out, unless
    every area is empty (then all are shown, each ``not run``)."""
    latest = {m.key: m for m in measurements}
    by_cell: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    names = dict.fromkeys(hosts)
    for m in latest.values():
        area = area_of(m.metric, m.scope, areas)
        if area is None:
            continue
        host = host_of(m.labels)
        if host is not None:
            names.setdefault(host)
        by_cell[(host or CLUSTER, area.key)].append(m)
    outcomes_of: dict[str, list[TestOutcome]] = defaultdict(list)
    for o in outcomes:
        area = area_of_test(o.test_id, areas)
        if area is not None:
            outcomes_of[area.key].append(o)
    # failed tests without a failed value (workload failed...) fail the cell of the host they name
    loose: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in findings:
        if f.measured is None and f.threshold is None and f.test_id:
            area = area_of_test(f.test_id, areas)
            if area is not None:
                loose[(f.host or CLUSTER, area.key)].append(f"{f.reason}: {f.test_id.rsplit('::', 1)[-1]}")
    nodes = sorted(names, key=natural_key)
    shown = [
        a
        for a in areas
        if outcomes_of.get(a.key) or any(k == a.key for _, k in by_cell) or any(k == a.key for _, k in loose)
    ] or list(areas)
    rows = []
    for name in [CLUSTER, *nodes]:
        cells = {}
        for a in shown:
            cells[a.key] = _area_cell(name, a, by_cell, loose, outcomes_of.get(a.key, []), nodes)
        rows.append(Row(name, cells))
    cluster, node_rows = rows[0], rows[1:]
    node_rows.sort(key=lambda r: (-r.failed, natural_key(r.name)))
    return NodeMatrix(tuple(shown), [cluster, *node_rows])


def _area_cell(
    name: str,
    area: Area,
    by_cell: Mapping[tuple[str, str], list[Measurement]],
    loose: Mapping[tuple[str, str], list[str]],
    outcomes: Sequence[TestOutcome],
    nodes: Sequence[str],
) -> Cell:
    ms = by_cell.get((name, area.key), [])
    extra = loose.get((name, area.key), [])
    if ms or extra:
        return _cell(ms, extra)
    per_node = any((n, area.key) in by_cell for n in nodes)
    cluster_level = (CLUSTER, area.key) in by_cell or (CLUSTER, area.key) in loose
    if name == CLUSTER and per_node:
        return Cell("—", note="every value of this area names a node: see the node rows")
    if name != CLUSTER and per_node:
        return Cell("not run", note="the area measured other nodes, but no value names this one")
    if name != CLUSTER and cluster_level:
        return Cell("—", note="values of this area name no node: see the cluster row")
    if outcomes and all(o.outcome == "skipped" for o in outcomes):
        reasons = list(dict.fromkeys(_skip_reason(o.message) for o in outcomes))
        return Cell("n.a.", note="skipped: " + " | ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else ""))
    if outcomes:
        ran = [o for o in outcomes if o.outcome != "skipped"]
        if ran and all(o.outcome == "passed" for o in ran) and name == CLUSTER:
            return Cell("pass", note=f"{len(ran)} test(s) passed without a recorded value")
        if ran and name != CLUSTER:
            return Cell("—", note="no value of this area names a node: see the cluster row")
    return Cell("not run", note="no test of this area ran")
