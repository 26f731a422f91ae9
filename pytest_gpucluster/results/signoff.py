"""The sign-off: what the first screen of the report says, before any chart.

FIT / NOT FIT and why in one sentence; the node × area matrix (``results/matrix.py``) with the next
action per node as its last column; the findings, one row each, with the raw message and the job
logs a click away; the skipped tests grouped by their reason. The report renders these; this
module only decides what they say.

Pure; no pytest, no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpucluster.results.findings import LADDER, REASONS, Finding
from pytest_gpucluster.results.matrix import CLUSTER, Column, NodeMatrix
from pytest_gpucluster.results.model import TestOutcome
from pytest_gpucluster.results.summary import outcome_counts

__all__ = ["SkipGroup", "Verdict", "action_column", "skip_groups", "verdict_of"]

ACTIONS_SHOWN = 3
"""Findings named per node in the matrix's action column (the rest: "+N more", in the findings)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    fit: bool
    headline: str
    """``FIT: ...`` / ``NOT FIT: ...`` / ``NO RESULTS: ...``."""
    sentence: str
    """Which nodes fail and with what next action; how many findings of each reason class."""


def _short(f: Finding) -> str:
    """``GPU 5: burnin.gpu_matmul 540 TFLOP/s (>= 800 TFLOP/s) -> reset GPU``."""
    who = f.component or ""
    values = f" {f.value_text()} ({f.threshold_text()})" if f.threshold is not None else ""
    what = f.metric.rsplit("::", 1)[-1] if f.measured is None and f.threshold is None else f.metric
    return f"{who + ': ' if who else ''}{what}{values} -> {f.action}"


def action_column(findings: Sequence[Finding], hosts: Sequence[str] = ()) -> Column:
    """The matrix's last column: per row, its findings' next actions, highest rung first."""
    per_row: dict[str, list[Finding]] = defaultdict(list)
    known = set(hosts)
    for f in findings:
        per_row[f.host if f.host and (not known or f.host in known) else CLUSTER].append(f)
    values = {}
    for name, found in per_row.items():
        found.sort(key=lambda f: -f.rank)
        text = "; ".join(_short(f) for f in found[:ACTIONS_SHOWN])
        values[name] = text + (f"; +{len(found) - ACTIONS_SHOWN} more" if len(found) > ACTIONS_SHOWN else "")
    return Column("action", "findings -> next action", values)


def verdict_of(
    outcomes: Sequence[TestOutcome], findings: Sequence[Finding], matrix: NodeMatrix, measured: int
) -> Verdict:
    """FIT only when no test failed and no finding stands (a regression is a failed test)."""
    counts = Counter(o.outcome for o in outcomes)
    tests = outcome_counts(outcomes)
    failing = matrix.failing_nodes()
    nodes = len(matrix.nodes)
    reasons = Counter(f.reason for f in findings)
    by_reason = ", ".join(f"{reasons[r]} {r}" for r in REASONS if reasons.get(r))
    bad = bool(findings) or counts.get("failed", 0) + counts.get("error", 0) > 0
    if not measured and not bad:
        # passing or skipped tests that measured nothing (a dry run, every test skipped) sign nothing
        why = f" ({tests})" if tests else ""
        return Verdict(False, f"NO RESULTS: nothing was measured{why}", "")
    if not bad:
        return Verdict(
            True,
            f"FIT: {tests or 'every measured value passed'}",
            f"{nodes} node(s): every area that ran passed; no finding ({measured} values measured).",
        )
    actions: dict[str, str] = {}
    for f in sorted(findings, key=lambda f: -f.rank):
        if f.host:
            actions.setdefault(f.host, f.action)
    named = ", ".join(f"{n} ({actions.get(n, 'see findings')})" for n in failing[:8])
    more = f" and {len(failing) - 8} more" if len(failing) > 8 else ""
    cluster_row = matrix.rows[0] if matrix.rows and matrix.rows[0].name == CLUSTER else None
    parts = []
    if failing:
        parts.append(f"{len(failing)} of {nodes} node(s) fail: {named}{more}")
    elif nodes:
        parts.append(f"no node fails alone (of {nodes})")
    if cluster_row is not None and cluster_row.failed:
        parts.append(f"cluster-level failures in {cluster_row.failed} area(s)")
    if findings:
        top = max(f.rank for f in findings)
        parts.append(f"{len(findings)} finding(s): {by_reason}; highest next action: {LADDER[top]}")
    sentence = ". ".join(p[0].upper() + p[1:] for p in parts) + "."
    return Verdict(False, f"NOT FIT: {tests}" if tests else "NOT FIT", sentence)


@dataclass(frozen=True, slots=True)
class SkipGroup:
    reason: str
    tests: tuple[str, ...]


def skip_groups(outcomes: Sequence[TestOutcome]) -> list[SkipGroup]:
    """Skipped tests grouped by their reason, the largest group first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        if o.outcome == "skipped":
            groups[o.message.removeprefix("Skipped: ").strip() or "(no reason given)"].append(o.test_id)
    return [
        SkipGroup(reason, tuple(tests))
        for reason, tests in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
