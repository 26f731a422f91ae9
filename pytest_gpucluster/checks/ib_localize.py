"""Slow node pairs joined with the fabric model: when the pairs that failed all cross one leaf's
uplinks, one leaf, one rail (or one spine that is the only way between their leaves), that element
is reported, not the nodes.

The input is what the pairwise burn-in measured: (host a, host b, rail or None, slow). A pair
tested on one rail (``NCCL_IB_HCA`` set to the rail's device) crosses that rail's elements only; a
pair with ``rail=None`` used every rail. Elements a pair crosses, for each rail it used:

- ``host H`` — either end (a node fault: the pairwise localization already names it);
- ``leaf L`` — the leaf either end's HCA of that rail is cabled to;
- ``leaf L uplinks`` — when the two ends sit on different leaves: both leaves' uplinks;
- ``spine S`` — when S is the only spine both leaves are cabled to (with several, routing picks one
  and the pair alone cannot say which);
- ``rail r``.

An element is reported when every slow pair crosses it (at least ``min_slow`` of them) and at most
``max_fast_share`` of the pairs crossing it passed; among such elements the one fewest passing
pairs cross wins, then the most specific (fewest pairs crossing it). A host that explains them as
well is reported as the host: the fabric is then not to blame.

Pure: no I/O, no pytest/torch imports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpucluster.checks.ib_fabric import rails_of
from pytest_gpucluster.parsers.ib_fabric import FabricModel

__all__ = ["PairOutcome", "PathVerdict", "action_for", "elements_of", "localize_on_fabric"]


@dataclass(frozen=True, slots=True)
class PairOutcome:
    a: str
    b: str
    rail: int | None
    slow: bool


@dataclass(frozen=True, slots=True)
class PathVerdict:
    element: str
    slow: int
    """Slow pairs crossing it (all of them)."""
    fast: int
    """Passing pairs crossing it."""

    def line(self) -> str:
        return (f"{self.element}: all {self.slow} slow pairs cross it, {self.fast} passing pair(s) do "
                f"-> {action_for(self.element)}")  # fmt: skip


def action_for(element: str) -> str:
    """What an operator checks for an element ``localize_on_fabric`` names."""
    kind, _, name = element.partition(" ")
    if kind == "leaf" and name.endswith(" uplinks"):
        leaf = name.removesuffix(" uplinks")
        return f"check {leaf}'s uplinks (its cables, transceivers and ports to the spines)"
    if kind == "leaf":
        return f"check {name} (the switch, and its ports and cables to these nodes' HCAs)"
    if kind == "spine":
        return f"check {name} (the only spine between these leaves) and its ports"
    if kind == "rail":
        return f"check rail {name}: its leaves and every node's rail-{name} HCA, cable and port"
    return f"look at node {name} (slow on every path it takes): the fabric is not to blame"


def _topology(model: FabricModel) -> tuple[dict[tuple[str, int], str], dict[str, set[str]]]:
    """((host, rail) -> leaf label, leaf label -> its spines' labels)."""
    rails = rails_of(model)
    leaf_of: dict[tuple[str, int], str] = {}
    spines: dict[str, set[str]] = defaultdict(set)
    for link in model.links:
        for x, y in ((link.a, link.b), (link.b, link.a)):
            node, peer = model.nodes.get(x[0]), model.nodes.get(y[0])
            if node is None or peer is None:
                continue
            if node.kind == "ca" and node.host and peer.kind == "switch" and x[0] in rails:
                leaf_of[node.host, rails[x[0]]] = model.label(y[0])
    leaves = set(leaf_of.values())
    for link in model.links:
        ends = [model.nodes.get(link.a[0]), model.nodes.get(link.b[0])]
        if any(n is None or n.kind != "switch" for n in ends):
            continue
        a, b = model.label(link.a[0]), model.label(link.b[0])
        if a in leaves and b not in leaves:
            spines[a].add(b)
        elif b in leaves and a not in leaves:
            spines[b].add(a)
    return leaf_of, spines


def elements_of(
    pair: PairOutcome, leaf_of: dict[tuple[str, int], str], spines: dict[str, set[str]]
) -> set[str]:
    """The fabric elements (and hosts) a pair's traffic crosses; see the module docstring."""
    out = {f"host {pair.a}", f"host {pair.b}"}
    rails = [pair.rail] if pair.rail is not None else sorted({r for _, r in leaf_of})
    for rail in rails:
        la, lb = leaf_of.get((pair.a, rail)), leaf_of.get((pair.b, rail))
        out.add(f"rail {rail}")
        out |= {f"leaf {x}" for x in (la, lb) if x}
        if la and lb and la != lb:
            out |= {f"leaf {la} uplinks", f"leaf {lb} uplinks"}
            common = spines.get(la, set()) & spines.get(lb, set())
            if len(common) == 1:
                out.add(f"spine {next(iter(common))}")
    return out


def localize_on_fabric(
    model: FabricModel, pairs: Sequence[PairOutcome], min_slow: int = 2, max_fast_share: float = 0.25
) -> PathVerdict | None:
    """The one element that explains every slow pair (module docstring), or None."""
    leaf_of, spines = _topology(model)
    slow = [p for p in pairs if p.slow]
    if len(slow) < min_slow:
        return None
    crossing: dict[str, list[PairOutcome]] = defaultdict(list)
    for pair in pairs:
        for element in elements_of(pair, leaf_of, spines):
            crossing[element].append(pair)
    best: tuple[int, int, int, str] | None = None
    for element, crossed in crossing.items():
        n_slow = sum(p.slow for p in crossed)
        n_fast = len(crossed) - n_slow
        if n_slow < len(slow) or n_fast > max_fast_share * len(crossed):
            continue
        # fewest passing pairs, then a host before the fabric (a node fault explains it as well),
        # then the most specific element
        key = (n_fast, 0 if element.startswith("host ") else 1, len(crossed), element)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return PathVerdict(best[3], len(slow), best[0])
