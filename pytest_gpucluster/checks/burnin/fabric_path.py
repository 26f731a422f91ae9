"""The pairwise burn-in joined with the fabric model: slow pairs that all cross one leaf's uplinks,
one leaf, one rail or the only spine between their leaves become one finding that names that
element and what to check, ahead of the nodes (``checks/ib_localize.py`` finds the element).

The acceptance run has a fabric model when its before-scan reached the fabric
(``acceptance/test_fabric.py``, ``GPUCLUSTER_IB_TOOL_PREFIX``); test_pairwise_localization then
passes the model and its `Localization` here. Every judged pair of both rounds counts: a pair is
slow when the localization failed it (below the tolerance, under the floor, or failed outright).
Pairs run on every rail at once (``rail=None``): the pair jobs do not pin ``NCCL_IB_HCA``.

When an element explains the slow pairs, its nodes are not drained: draining two healthy nodes
under a leaf with a bad uplink would only move the problem to the next job on that leaf.

`fabric_join` is the whole join as the test makes it, and says what it joined: the model; no model
because the before-scan did not reach the fabric (a capability this run lacks: the nodes alone
judge); or no before-scan record at all (test_fabric_before not in the run, failed, or in a worker
that never wrote it): then slow pairs are a NOT MEASURED ``fabric.ib.path``, with the reason.

Pure: no torch, no pytest, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_gpucluster.burnin.pairwise import Localization
from pytest_gpucluster.checks.ib_localize import PairOutcome, PathVerdict, action_for, localize_on_fabric
from pytest_gpucluster.parsers.ib_fabric import FabricModel
from pytest_gpucluster.results.model import Check

__all__ = ["FabricJoin", "FabricPath", "fabric_join", "fabric_path", "outcomes_of"]

METRIC = "fabric.ib.path"
"""The check's metric: under ``fabric.`` so the findings classify it as hardware on a link."""


@dataclass(frozen=True, slots=True)
class FabricPath:
    """The element all slow pairs cross (`PathVerdict`), with its action and its check."""

    verdict: PathVerdict
    check: Check

    @property
    def is_fabric(self) -> bool:
        """False when a host explains the slow pairs as well: the nodes' suspects stand."""
        return not self.verdict.element.startswith("host ")

    @property
    def action(self) -> str:
        return action_for(self.verdict.element)

    def line(self) -> str:
        v = self.verdict
        return (f"fabric localization: {v.element}: all {v.slow} slow pair(s) cross it, {v.fast} passing pair(s) "
                f"do -> {self.action}")  # fmt: skip


def outcomes_of(found: Localization) -> list[PairOutcome]:
    """Every judged pair of every round as slow/not slow (a pair judged twice: the later round)."""
    by_pair: dict[frozenset[str], PairOutcome] = {}
    for judged in found.rounds:
        for j in judged:
            a, b = j.pair
            by_pair[frozenset((a, b))] = PairOutcome(a, b, None, not j.passed)
    return list(by_pair.values())


def fabric_path(model: FabricModel, found: Localization) -> FabricPath | None:
    """The element that explains every slow pair of ``found`` on ``model``, or None (fewer than
    two slow pairs, hosts the fabric does not know, or no single element)."""
    outcomes = outcomes_of(found)
    known = {n.host for n in model.nodes.values() if n.kind == "ca" and n.host}
    if not any(p.slow for p in outcomes) or not {x for p in outcomes for x in (p.a, p.b)} <= known:
        return None
    verdict = localize_on_fabric(model, outcomes)
    if verdict is None:
        return None
    element = verdict.element.removeprefix("host ")
    action = action_for(verdict.element)
    check = Check(
        METRIC, float(verdict.slow), "slow pairs", 0.0, "<=", scope="fabric",
        labels={"device": element},
        hint=(f"{verdict.element}: all {verdict.slow} slow pair(s) of the pairwise burn-in cross it, "
              f"{verdict.fast} passing pair(s) do (fabric model of the before-scan) -> {action}"),
    )  # fmt: skip
    return FabricPath(verdict, check)


@dataclass(frozen=True, slots=True)
class FabricJoin:
    """What the pairwise burn-in joined its pairs with, said in ``line``; the element its slow pairs
    cross (``path``) where the model explains them, or a NOT MEASURED check where there was no
    before-scan to join them with."""

    line: str
    path: FabricPath | None = None
    not_measured: Check | None = None


def fabric_join(
    model: FabricModel | None,
    found: Localization,
    *,
    unreachable: str | None = None,
    missing: str | None = None,
) -> FabricJoin:
    """The pairs of ``found`` joined with the before-scan's ``model``. ``unreachable``: the scan ran
    and could not reach the fabric (why); ``missing``: there is no record of the scan (why)."""
    slow = sum(p.slow for p in outcomes_of(found))
    if missing is not None:
        if found.ok or not slow:
            return FabricJoin(
                f"fabric localization: no slow pair, nothing to join; no fabric before-scan: {missing}"
            )
        check = Check(
            METRIC, math.nan, "slow pairs", 0.0, "<=", scope="fabric", problem="not measured",
            hint=(f"{slow} slow pair(s) of the pairwise burn-in could not be joined with the fabric (which "
                  f"leaf, spine or rail they cross): no fabric before-scan: {missing}"),
        )  # fmt: skip
        return FabricJoin(f"fabric localization NOT MEASURED: {check.hint}", not_measured=check)
    if model is None:
        why = unreachable or "no reason recorded"
        return FabricJoin(f"fabric localization: no fabric model ({why}): the nodes alone judge the pairs")
    cas = sum(1 for n in model.nodes.values() if n.kind == "ca")
    joined = f"fabric localization: pairs joined with the before-scan's model ({cas} HCA(s), {len(model.links)} link(s))"
    if found.ok or not slow:
        return FabricJoin(f"{joined}: no slow pair")
    path = fabric_path(model, found)
    where = (
        path.line().removeprefix("fabric localization: ")
        if path is not None
        else "no single fabric element explains them: the nodes' suspects stand"
    )
    return FabricJoin(f"{joined}: {slow} slow pair(s): {where}", path=path)
