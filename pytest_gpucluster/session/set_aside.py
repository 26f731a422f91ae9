"""Stage 5 of the session's start: the probe's facts and the preflight's findings -> the nodes the
session runs on (`NodeSplit`): a node that fails a node-level requirement is set aside, named with
its reason and the next action, and the others are measured.

A node is set aside when

- its probe did not come back (unreachable, the probe failed or timed out): *drain node*;
- it cannot reach its peers while they reach each other (the probe's reachability reading: most
  peers it tried, and most peers that tried it, got no TCP answer): *reseat/replace cable or NIC*;
- under a CUDA profile it lacks the ``cuda`` capability (no GPU listed, or GPUs its torch cannot
  use) while another node has it: *reset GPU*;
- it has a preflight error (fewer usable GPUs than ranks or than the profile's count, another
  part, MIG, an interface or HCA absent or down) on a requirement another judged node meets:
  *reset GPU* for the GPUs, *reseat/replace cable or NIC* for interfaces and HCAs, *drain node*
  for the rest.

A requirement that no node meets is not a node's fault: the profile or the settings do not fit
the cluster. Such an error still stops the run before launch, listing every finding, as does any
node-level failure under ``--gpucluster-strict-nodes``. The run also stops before launch when no
usable node is left, or when a multi-node run keeps fewer than the two nodes its smallest
multi-node check needs; those checks are then NOT MEASURED, and the stop says why.

Plain values in and out (no pytest); imports nothing else of `session/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.cluster.preflight import PreflightFinding
from pytest_gpucluster.results.model import (
    PREFLIGHT_TEST_ID,
    SET_ASIDE_METRIC,
    SET_ASIDE_TEST_ID,
    Check,
    TestOutcome,
)

__all__ = [
    "MULTI_NODE_MIN",
    "NodeSplit",
    "SetAside",
    "set_aside_checks",
    "set_aside_outcome",
    "split_lines",
    "split_nodes",
    "stop_outcome",
]

MULTI_NODE_MIN = 2
"""Nodes the smallest multi-node check needs (an inter-node collective, a pairwise round)."""
GPU_REQUIREMENTS = ("ranks per node", "GPU count", "MIG mode")
NIC_REQUIREMENTS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")


@dataclass(frozen=True, slots=True)
class SetAside:
    """One node left out before the first job: why, and what to do about it (the findings' ladder)."""

    host: str
    reason: str
    action: str

    def text(self) -> str:
        return f"{self.host} ({self.reason} -> {self.action})"

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "reason": self.reason, "action": self.action}


@dataclass(frozen=True, slots=True)
class NodeSplit:
    """The nodes the session runs on, those set aside, and why it stops before launch (None: it runs)."""

    usable: tuple[str, ...]
    set_aside: tuple[SetAside, ...] = ()
    excluded: tuple[str, ...] = ()
    """``--gpucluster-exclude``'s nodes, left out before the probe."""
    stop: str | None = None
    stop_category: str = "infrastructure"
    """``not measured`` when the stop leaves multi-node checks without nodes."""
    given: int = 0
    """Nodes the session was given, the excluded ones included."""

    def line(self) -> str:
        """``measured on 3 of 4 nodes; set aside: node-4 (reason -> action)``; empty when every
        node given is measured."""
        if not (self.set_aside or self.excluded):
            return ""
        parts = [f"measured on {0 if self.stop else len(self.usable)} of {self.given} nodes"]
        if self.set_aside:
            parts.append("set aside: " + ", ".join(s.text() for s in self.set_aside))
        if self.excluded:
            parts.append("excluded (--gpucluster-exclude): " + ", ".join(self.excluded))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "measured_on": 0 if self.stop else len(self.usable),
            "of": self.given,
            "usable": list(self.usable),
            "set_aside": [s.to_json() for s in self.set_aside],
            "excluded": list(self.excluded),
            "stop": self.stop,
            "line": self.line(),
        }


def _action(requirement: str) -> str:
    if requirement in GPU_REQUIREMENTS:
        return "reset GPU"
    if requirement in NIC_REQUIREMENTS:
        return "reseat/replace cable or NIC"
    return "drain node"


def _finding_reason(f: PreflightFinding) -> str:
    if f.requirement in ("GPU count", "ranks per node"):
        needed = f.asked.split()[0]
        return f"{f.found.split()[0]} GPUs usable, {needed} needed"
    return f.message.removeprefix(f"{f.host}: ")


def _unreachable(facts: ClusterFacts) -> dict[str, str]:
    """Nodes that got no TCP answer from most peers they tried, and from which most peers that
    tried them got none, while some other node reached most of its peers: host -> why."""
    tried: dict[str, list[tuple[str, str | None]]] = {}
    for node in facts.nodes:  # by short names: the hostfile's and the node's own may differ
        for peer, why in (node.reach or {}).items():
            tried.setdefault(node.host, []).append((_short(peer), why))
    out_fail = {h: sum(1 for _, why in pairs if why) for h, pairs in tried.items()}
    incoming: dict[str, list[str | None]] = {}
    for pairs in tried.values():
        for peer, why in pairs:
            incoming.setdefault(peer, []).append(why)
    cut = {}
    for host, pairs in tried.items():
        seen_by = incoming.get(_short(host), [])
        missed_by = sum(1 for w in seen_by if w)
        if out_fail[host] * 2 > len(pairs) and missed_by * 2 > len(seen_by):
            cut[host] = (
                f"unreachable: no TCP answer from {out_fail[host]} of the {len(pairs)} peers it tried, "
                f"nor from it to {missed_by} of the {len(seen_by)} that tried it"
            )
    fine = [h for h, pairs in tried.items() if out_fail[h] * 2 <= len(pairs)]
    return cut if fine else {}


def _node_failures(
    facts: ClusterFacts, findings: Sequence[PreflightFinding], cuda: bool
) -> tuple[dict[str, list[tuple[str, str]]], list[PreflightFinding]]:
    """host -> [(reason, action)] for the node-level failures; and the errors no node is to blame
    for (a requirement every judged node fails)."""
    failures: dict[str, list[tuple[str, str]]] = {}
    for node in facts.nodes:
        if node.error:
            failures.setdefault(node.host, []).append((f"not probed: {node.error}", "drain node"))
    for host, why in _unreachable(facts).items():
        failures.setdefault(host, []).append((why, "reseat/replace cable or NIC"))
    answered = [n for n in facts.nodes if not n.error]
    if cuda:
        with_cuda = [n for n in answered if n.capabilities()["cuda"] is None]
        for node in answered:
            gap = node.capabilities()["cuda"]
            if gap and with_cuda:
                failures.setdefault(node.host, []).append((gap, "reset GPU"))
    judged = [n.host for n in answered if not (cuda and n.capabilities()["cuda"])]
    errors = [f for f in findings if f.severity == "error"]
    blamed, everyone = [], []
    for f in errors:
        failing = {e.host for e in errors if e.requirement == f.requirement}
        (everyone if failing >= set(judged) else blamed).append(f)
    shown: dict[str, set[str]] = {}
    for f in blamed:
        if f.requirement == "ranks per node" and any(
            e.host == f.host and e.requirement == "GPU count" for e in blamed
        ):
            continue  # the GPU count says it
        reason = _finding_reason(f)
        if reason not in shown.setdefault(f.host, set()):
            shown[f.host].add(reason)
            failures.setdefault(f.host, []).append((reason, _action(f.requirement)))
    return failures, everyone


def _short(host: str) -> str:
    return host.split(".")[0]


_RUNGS = ("rerun", "drain node", "reset GPU", "reseat/replace cable or NIC", "RMA")


def split_nodes(
    hosts: Sequence[str],
    facts: ClusterFacts,
    findings: Sequence[PreflightFinding],
    *,
    cuda: bool,
    strict: bool = False,
    excluded: Sequence[str] = (),
) -> NodeSplit:
    """The usable nodes of ``hosts``, those set aside, and whether the run stops (module docstring)."""
    given = len(hosts) + len(excluded)
    found, everyone = _node_failures(facts, findings, cuda)
    # ``node01`` in the hostfile is ``node01.cluster.local`` where the node names itself
    failures = {_short(host): why for host, why in found.items()}
    aside = tuple(
        SetAside(host, "; ".join(r for r, _ in why), max((a for _, a in why), key=_RUNGS.index))
        for host in hosts
        if (why := failures.get(_short(host)))
    )
    usable = tuple(h for h in hosts if _short(h) not in failures)
    errors = [f.message for f in findings if f.severity == "error"]
    base = {"set_aside": aside, "excluded": tuple(excluded), "given": given}
    if everyone or (strict and (errors or aside)):
        why = errors + [
            f"{s.host}: {s.reason}" for s in aside if not any(e.startswith(f"{s.host}:") for e in errors)
        ]
        message = f"preflight: {len(why)} finding(s), nothing launched: " + "; ".join(why)
        return NodeSplit(usable, stop=message[:2000], **base)
    if aside and not usable:
        named = ", ".join(s.text() for s in aside)
        return NodeSplit((), stop=f"no usable node left, nothing launched: set aside: {named}"[:2000], **base)
    if aside and len(hosts) >= MULTI_NODE_MIN and len(usable) < MULTI_NODE_MIN:
        named = ", ".join(s.text() for s in aside)
        message = (
            f"NOT MEASURED: the multi-node checks need {MULTI_NODE_MIN} nodes and {len(usable)} of {given} "
            f"is usable ({', '.join(usable)}); set aside: {named}; nothing launched"
        )
        return NodeSplit(usable, stop=message[:2000], stop_category="not measured", **base)
    return NodeSplit(usable, **base)


def set_aside_checks(split: NodeSplit) -> list[Check]:
    """One failing check per node set aside (its inventory failure: recorded under
    `SET_ASIDE_TEST_ID`; the findings give it the action named here)."""
    return [
        Check(
            SET_ASIDE_METRIC, 0, "usable", 1, ">=",
            labels={"host": s.host, "action": s.action, "reason": s.reason},
            hint=f"{s.host} was set aside before the first job: {s.reason}; the other nodes were measured",
        )
        for s in split.set_aside
    ]  # fmt: skip


def stop_outcome(split: NodeSplit | None) -> TestOutcome | None:
    """The failed outcome standing for the tests a stopping session does not run; None when it runs."""
    if split is None or split.stop is None:
        return None
    category: Any = split.stop_category
    return TestOutcome(PREFLIGHT_TEST_ID, "failed", category, 0.0, split.stop)


def set_aside_outcome(split: NodeSplit | None) -> TestOutcome | None:
    """The failed outcome of a run that measured without some nodes (their checks are
    `set_aside_checks`); None when no node was set aside."""
    if split is None or not split.set_aside or split.stop is not None:
        return None
    return TestOutcome(SET_ASIDE_TEST_ID, "failed", "infrastructure", 0.0, split.line())


def split_lines(split: NodeSplit, findings: Sequence[PreflightFinding], *, dry_run: bool) -> list[str]:
    """What the terminal shows after the findings: the nodes set aside, or why the run stops."""
    head = "[dry run] preflight" if dry_run else "gpucluster preflight"
    if split.stop is None:
        return [f"{head}: {split.line()}"] if split.line() else []
    what = "a run would stop here" if dry_run else "stopping before any job is launched"
    errors = [f for f in findings if f.severity == "error"]
    hosts = sorted({f.host for f in errors} | {s.host for s in split.set_aside})
    lines = [
        f"{head}: {len(errors) or len(split.set_aside)} finding(s) on {len(hosts)} node(s) ({', '.join(hosts)}): "
        f"{what}. Fix the profile or the settings each finding names, or choose the profile of this "
        "hardware (--hw=auto picks the part profile of the GPUs found); --gpucluster-exclude leaves "
        "known-bad nodes out."
    ]
    if split.stop_category == "not measured":
        lines.append(f"{head}: {split.stop}")
    return lines
