"""Retest before drain (``--gpucluster-retest-suspects``): which tests to run again on which
nodes, and what the second measurement says.

A *suspect* is a node that this run would take out of scheduling: a finding's next action drains
it (drain node, reset GPU, reseat a cable, RMA; ``results/findings.py``), or a burn-in test put
it on the drain list (``suspects.json``). After the run,
the tests behind those findings run once more on the suspects only; their values are recorded
with ``attempt`` `RETEST_ATTEMPT` after the first ones, which they supersede as the value that
counts (every reader takes the last value per key). So the findings, the drain list and the
report judge the retest: a node is listed to drain only when its retest fails too, and a
suspect whose retest passes is cleared with both numbers shown.

A burn-in suspect whose finding says ``rerun`` (``threshold; rerun``: one rank of two below a
floor, every peer missing alike) drains nothing (`burnin.drain.judged_drain_commands`), yet it is
retested: measuring it again, on that node with the longer tier's durations, is the very rerun its
finding asks for, so the retest's rows and line say so (`RetestPlan.reruns`) rather than speak of a
drain the finding never ordered.

Pure: no pytest, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.burnin.drain import DRAINING_ACTIONS
from pytest_gpucluster.results.findings import Finding, findings_of
from pytest_gpucluster.results.history.rows import component_of, host_of
from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.results.text import format_value

__all__ = [
    "RETEST_ATTEMPT",
    "RetestPlan",
    "RetestRow",
    "confirmed_hosts",
    "plan_retest",
    "retest_lines",
    "retest_record",
    "retest_rows",
]

RETEST_ATTEMPT = 3
"""``Measurement.attempt`` of a value measured again on a suspect (2 is the gate's confirmation)."""


@dataclass(frozen=True, slots=True)
class RetestPlan:
    hosts: tuple[str, ...]
    """The suspects, in the order of the run's hosts."""
    test_ids: tuple[str, ...]
    """The tests whose findings named them, in the order they ran."""
    findings: tuple[Finding, ...]
    reruns: tuple[str, ...] = ()
    """The suspects retested only because a burn-in test listed them while their finding says
    ``rerun``: their retest is the rerun the finding asked for (module docstring)."""

    def line(self) -> str:
        tests = ", ".join(t.split("::")[-1] for t in self.test_ids)
        line = f"retest of suspect(s) {', '.join(self.hosts)}: running again {tests}"
        if self.reruns:
            line += f" ({', '.join(self.reruns)}: the rerun its finding asked for, threshold; rerun)"
        return line


def plan_retest(
    measurements: Sequence[Measurement],
    outcomes: Sequence[Any],
    hosts: Sequence[str],
    test_order: Sequence[str],
    listed: Sequence[tuple[str, str]] = (),
) -> RetestPlan:
    """The suspects of a run and the tests to run again on them (module docstring). ``listed``:
    (node, test id) of each drainable suspect the burn-in tests wrote to the drain list."""
    found = findings_of(measurements, outcomes, hosts)
    suspects = [f for f in found if f.host and f.action in DRAINING_ACTIONS]
    named = {str(f.host) for f in suspects} | {node for node, _ in listed}
    order = [h for h in hosts if h in named] + sorted(h for h in named if h not in hosts)
    wanted = {f.test_id for f in suspects if f.test_id} | {test for _, test in listed if test}
    tests = tuple(t for t in test_order if t in wanted)
    rerun = {(f.host, f.test_id) for f in found if f.action == "rerun"}
    draining = {str(f.host) for f in suspects}
    reruns = tuple(
        h for h in order if h not in draining and any(n == h and (n, t) in rerun for n, t in listed)
    )
    return RetestPlan(tuple(order), tests, tuple(suspects), reruns)


def confirmed_hosts(plan: RetestPlan, measurements: Sequence[Measurement], outcomes: Sequence[Any],
                    hosts: Sequence[str]) -> list[str]:  # fmt: skip
    """The suspects the retest did not clear: a finding still drains them once the retest's values
    count, or a retested value naming them failed, or the retest measured nothing of them (no
    evidence clears a node)."""
    still = {f.host for f in findings_of(measurements, outcomes, hosts) if f.action in DRAINING_ACTIONS}
    retested = [m for m in measurements if m.attempt == RETEST_ATTEMPT]
    out = []
    for host in plan.hosts:
        mine = [m for m in retested if host_of(m.labels) == host]
        if host in still or not mine or any(m.failed for m in mine):
            out.append(host)
    return out


@dataclass(frozen=True, slots=True)
class RetestRow:
    """One value measured again on a suspect: the first measurement and the retest's."""

    host: str
    component: str | None
    metric: str
    unit: str
    first: float | None
    retest: float | None
    threshold: str
    confirmed: bool
    """The retest missed the threshold too."""
    rerun: bool = False
    """Its node's retest is the rerun its finding asked for (`RetestPlan.reruns`)."""

    def cells(self) -> list[str]:
        def shown(v: float | None) -> str:
            return "no value" if v is None else format_value(v, self.unit)

        # confirmed is what the retest measured; whether the node is drained is its finding's action
        # (burnin.drain.judged_drain_commands): a miss the findings call "threshold; rerun" is not
        if self.rerun:
            verdict = "missed again" if self.confirmed else "passed"
            verdict += " on the rerun its finding asked for (threshold; rerun: not drained for it)"
        else:
            verdict = "CONFIRMED: missed again" if self.confirmed else "cleared: not drained"
        return [self.host, self.component or "-", self.metric, shown(self.first), shown(self.retest),
                self.threshold, verdict]  # fmt: skip


ROW_HEADER = ["node", "component", "metric", "first", "retest", "threshold", "verdict"]


def _value(m: Measurement) -> float | None:
    return m.value if math.isfinite(m.value) else None


def retest_rows(
    measurements: Iterable[Measurement], hosts: Sequence[str], reruns: Sequence[str] = ()
) -> list[RetestRow]:
    """Per value the retest measured on a suspect that failed the first time: both values.
    ``reruns``: `RetestPlan.reruns`, whose rows say the retest is the rerun their finding asked for."""
    first: dict[str, Measurement] = {}
    again: dict[str, Measurement] = {}
    for m in measurements:
        if m.attempt == RETEST_ATTEMPT:
            again[m.key] = m
        elif m.key not in again:
            first[m.key] = m
    rows = []
    for key, m in again.items():
        before = first.get(key)
        host = host_of(m.labels)
        if before is None or not before.failed or host not in hosts:
            continue
        threshold = "-" if m.threshold is None else f"{m.comparison} {format_value(m.threshold, m.unit)}"
        rows.append(
            RetestRow(
                host,
                component_of(m.labels),
                m.metric,
                m.unit,
                _value(before),
                _value(m),
                threshold,
                m.failed,
                host in reruns,
            )
        )
    return sorted(rows, key=lambda r: (r.host, r.component or "", r.metric))


def retest_record(
    plan: RetestPlan, rows: Sequence[RetestRow], ran: Sequence[str], still_suspect: Sequence[str]
) -> dict[str, Any]:
    """What results.json keeps of the retest (``retest``): suspects, tests, both values of each.
    ``still_suspect``: `confirmed_hosts`."""
    confirmed = [h for h in plan.hosts if h in still_suspect]
    return {
        "suspects": list(plan.hosts),
        "tests": list(ran),
        "confirmed": confirmed,
        "cleared": [h for h in plan.hosts if h not in confirmed],
        "reruns": list(plan.reruns),
        "header": ROW_HEADER,
        "rows": [r.cells() for r in rows],
    }


def retest_lines(record: dict[str, Any]) -> list[str]:
    """The summary's lines for a retest record."""
    if "note" in record:
        return [f"retest of suspects {', '.join(record['suspects'])}: {record['note']}"]
    lines = [
        f"retest of suspects {', '.join(record['suspects'])}: confirmed "
        f"{', '.join(record['confirmed']) or 'none'}; cleared {', '.join(record['cleared']) or 'none'}"
    ]
    for row in record["rows"]:
        node, component, metric, first, again, threshold, verdict = row
        lines.append(f"  {node} {component}: {metric} first {first}, retest {again} ({threshold}): {verdict}")
    return lines
