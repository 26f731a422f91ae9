"""The verdict on a whole InfiniBand fabric (``gpucluster fabric scan``): every finding names a cable
by both ends and says what to replace.

- :func:`judge_links` — every cable at the rated width and lane speed (given, or the most common
  among cables of the same kind: host cables, switch-to-switch cables);
- :func:`judge_topology` — against a golden topology (a saved ``ibnetdiscover`` of the accepted
  fabric): every missing, extra or moved cable;
- :func:`judge_shape` — without one: leaves with fewer uplinks than their peers, hosts with fewer
  HCAs than the rails;
- :func:`judge_rails` — on a rail-optimized fabric, every host's rail-*r* HCA on a rail-*r* leaf;
- :func:`judge_sm` — a master subnet manager answered;
- :func:`judge_counters` — error counters between two scans, every port (switch ports included),
  with the node-side check's counter classes (:mod:`~..parsers.fabric_diff`).

A host's HCA belongs to rail *r* when its device is the *r*-th of the device names the fabric's
hosts use, sorted (``mlx5_0`` -> 0 ... ``mlx5_7`` -> 7): a host missing one HCA does not shift its
others' rails. A leaf's rail is the rail most of its HCAs belong to.

Pure: no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.parsers.fabric_diff import COUNTER_CLASSES, diff_ports
from pytest_gpucluster.parsers.fabric_ports import IbPort
from pytest_gpucluster.parsers.ib_fabric import LANE_SPEEDS, FabricModel, IbLink
from pytest_gpucluster.parsers.ib_tools import PERFQUERY_NAMES
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = [
    "FabricFinding",
    "findings_checks",
    "judge_counters",
    "judge_links",
    "judge_rails",
    "judge_shape",
    "judge_sm",
    "judge_topology",
    "rails_of",
]

REPLACE_CABLE = "replace cable"
_TOOL_NAMES = {v: k for k, v in PERFQUERY_NAMES.items()}
_PHYSICAL = {
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "local_link_integrity_errors",
    "port_rcv_errors",
}


@dataclass(frozen=True, slots=True)
class FabricFinding:
    """One thing wrong with the fabric: ``where`` names the cable (both ends) or the switch/host."""

    kind: str
    where: str
    detail: str
    action: str
    rung: str = "reseat/replace cable or NIC"
    """The findings ladder's rung (results.findings.LADDER) this action sits on."""

    def line(self) -> str:
        return f"{self.where}: {self.detail} -> {self.action}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "where": self.where, "detail": self.detail, "action": self.action,
                "rung": self.rung, "line": self.line()}  # fmt: skip


def _natural(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def rails_of(model: FabricModel) -> dict[str, int]:
    """HCA node key -> rail: the position of its device among the hosts' device names, sorted."""
    devices = sorted({n.device for n in model.nodes.values() if n.device}, key=_natural)
    index = {d: i for i, d in enumerate(devices)}
    return {k: index[n.device] for k, n in model.nodes.items() if n.device in index}


def _end(model: FabricModel, end: tuple[str, int], rails: Mapping[str, int]) -> str:
    key, port = end
    node = model.nodes.get(key)
    if node is not None and node.kind == "ca":
        text = model.label(key) + (f" port {port}" if port != 1 else "")
        return text + (f" (rail {rails[key]})" if key in rails else "")
    return f"{model.label(key)} port {port}"


def _cable(
    model: FabricModel, link: IbLink, rails: Mapping[str, int], first: tuple[str, int] | None = None
) -> str:
    """``leaf-07 port 12 <-> gpu-node-017 mlx5_3 (rail 3)``: the switch end first unless ``first`` says."""
    a, b = link.a, link.b
    if first is not None:
        a, b = (a, b) if a == first else (b, a)
    elif _is_ca(model, a[0]) and not _is_ca(model, b[0]):
        a, b = b, a
    return f"{_end(model, a, rails)} <-> {_end(model, b, rails)}"


def _is_ca(model: FabricModel, key: str) -> bool:
    node = model.nodes.get(key)
    return node is not None and node.kind == "ca"


def _kind(model: FabricModel, link: IbLink) -> str:
    return "host" if _is_ca(model, link.a[0]) or _is_ca(model, link.b[0]) else "switch"


def judge_links(
    model: FabricModel, width: int | None = None, speed: str | None = None
) -> list[FabricFinding]:
    """A cable narrower or slower than rated; the rating is ``width``/``speed`` where given, else the
    most common value among cables of the same kind (host or switch-to-switch)."""
    rails = rails_of(model)
    out: list[FabricFinding] = []
    by_kind: dict[str, list[IbLink]] = defaultdict(list)
    for link in model.links:
        by_kind[_kind(model, link)].append(link)
    for kind, links in sorted(by_kind.items()):
        widths = Counter(link.width for link in links if link.width is not None)
        speeds = Counter(link.speed for link in links if link.speed is not None)
        want_w = width or (widths.most_common(1)[0][0] if widths else None)
        want_s = speed or (speeds.most_common(1)[0][0] if speeds else None)
        src_w = "rated" if width else f"as {widths[want_w]} of {sum(widths.values())} {kind} cables"
        src_s = "rated" if speed else f"as {speeds[want_s]} of {sum(speeds.values())} {kind} cables"
        for link in links:
            if want_w is not None and link.width is not None and link.width < want_w:
                out.append(FabricFinding("link-width", _cable(model, link, rails),
                                         f"trained at {link.width}X, expected {want_w}X ({src_w})", REPLACE_CABLE))  # fmt: skip
            if want_s and link.speed and LANE_SPEEDS.get(link.speed, 0) < LANE_SPEEDS.get(want_s, 0):
                out.append(FabricFinding("link-speed", _cable(model, link, rails),
                                         f"runs at {link.speed}, expected {want_s} ({src_s})", REPLACE_CABLE))  # fmt: skip
    return out


def _cables_by_label(model: FabricModel) -> dict[frozenset[tuple[str, int]], IbLink]:
    return {frozenset({(model.label(x.a[0]), x.a[1]), (model.label(x.b[0]), x.b[1])}): x for x in model.links}


def judge_topology(model: FabricModel, golden: FabricModel) -> list[FabricFinding]:
    """Every cable missing from, added to, or moved against the golden topology (matched by node
    descriptions and port numbers, so a replaced HCA with a new GUID still matches)."""
    now, then = _cables_by_label(model), _cables_by_label(golden)
    rails = rails_of(golden)
    label_rails = {golden.label(k): r for k, r in rails.items()}
    missing = {k: then[k] for k in then.keys() - now.keys()}
    extra = {k: now[k] for k in now.keys() - then.keys()}

    kind_of = {golden.label(k): n.kind for k, n in golden.nodes.items()}
    key_now = {model.label(k): k for k in model.nodes}

    def name(end: tuple[str, int]) -> str:
        label, port = end
        if kind_of.get(label) == "ca":
            return (
                label
                + (f" port {port}" if port != 1 else "")
                + (f" (rail {label_rails[label]})" if label in label_rails else "")
            )
        return f"{label} port {port}"

    def state(end: tuple[str, int]) -> str:
        key = key_now.get(end[0])
        got = model.port_states.get((key, end[1])) if key else None
        return f"{got[0]}/{got[1]}" if got else ("not on the fabric" if key is None else "no cable")

    out: list[FabricFinding] = []
    for ends in sorted(extra, key=lambda e: sorted(e)):
        # The end both cables share is what moved; an HCA end first (the HCA is what was re-plugged).
        moved_from = sorted(
            (m for m in missing if m & ends),
            key=lambda m: not any(kind_of.get(e[0]) == "ca" for e in m & ends),
        )
        if moved_from:
            anchor = sorted(moved_from[0] & ends, key=lambda e: kind_of.get(e[0]) != "ca")[0]
            (was,) = moved_from[0] - {anchor}
            (now_at,) = ends - {anchor}
            del missing[moved_from[0]]
            out.append(FabricFinding("moved-cable", f"{name(anchor)} <-> {name(now_at)}",
                                     f"the golden topology has {name(anchor)} cabled to {name(was)}",
                                     f"move the cable back to {name(was)}"))  # fmt: skip
        else:
            a, b = sorted(ends, key=lambda e: kind_of.get(e[0]) == "ca")
            out.append(FabricFinding("extra-cable", f"{name(a)} <-> {name(b)}",
                                     "cabled, but not in the golden topology",
                                     "check the cabling plan; remove the cable or update the golden topology"))  # fmt: skip
    for ends in sorted(missing, key=lambda e: sorted(e)):
        a, b = sorted(ends, key=lambda e: kind_of.get(e[0]) == "ca")
        out.append(FabricFinding("missing-cable", f"{name(a)} <-> {name(b)}",
                                 f"in the golden topology, not found ({name(a)}: {state(a)}; {name(b)}: {state(b)})",
                                 "reseat or replace the cable"))  # fmt: skip
    return out


def judge_shape(model: FabricModel, rails: int | None = None) -> list[FabricFinding]:
    """Without a golden topology: leaves (switches with HCAs) with fewer uplinks than most leaves,
    and hosts with fewer HCAs than ``rails`` (else than most hosts)."""
    out: list[FabricFinding] = []
    uplinks: dict[str, int] = defaultdict(int)
    leaves = {x.a[0] for x in model.links if _is_ca(model, x.b[0])} | {
        x.b[0] for x in model.links if _is_ca(model, x.a[0])}  # fmt: skip
    leaves = {k for k in leaves if not _is_ca(model, k)}
    for link in model.links:
        if _kind(model, link) == "switch":
            for key, _ in (link.a, link.b):
                if key in leaves:
                    uplinks[key] += 1
    counts = Counter(uplinks.get(k, 0) for k in leaves)
    if counts:
        usual = counts.most_common(1)[0][0]
        for leaf in sorted(leaves, key=lambda k: _natural(model.label(k))):
            have = uplinks.get(leaf, 0)
            if have < usual:
                down = [
                    p for (k, p), (s, _) in sorted(model.port_states.items()) if k == leaf and s == "Down"
                ]
                hint = f"; its ports Down: {', '.join(map(str, down))}" if down else ""
                out.append(FabricFinding("leaf-uplinks", model.label(leaf),
                                         f"{have} uplinks, {counts[usual]} of {len(leaves)} leaves have {usual}{hint}",
                                         "find the uplink cable that is missing or down and reseat or replace it"))  # fmt: skip
    hosts: dict[str, list[str]] = defaultdict(list)
    for node in model.nodes.values():
        if node.host:
            hosts[node.host].append(node.device or node.description)
    if hosts:
        want = rails or Counter(len(d) for d in hosts.values()).most_common(1)[0][0]
        src = "the profile's rails" if rails else "most hosts"
        for host, devices in sorted(hosts.items(), key=lambda h: _natural(h[0])):
            if len(devices) < want:
                out.append(FabricFinding("hca-count", host,
                                         f"{len(devices)} HCA(s) on the fabric ({', '.join(sorted(devices, key=_natural))}), "
                                         f"{src}: {want}",
                                         "find the HCA whose cable is missing or down (ibstat on the host) and reseat or "
                                         "replace that cable"))  # fmt: skip
    return out


def judge_rails(model: FabricModel) -> list[FabricFinding]:
    """On a rail-optimized fabric: every HCA on a leaf of its own rail (the leaf's majority rail)."""
    rails = rails_of(model)
    on_leaf: dict[str, list[tuple[str, IbLink]]] = defaultdict(list)
    for link in model.links:
        for ca, sw in ((link.a, link.b), (link.b, link.a)):
            if ca[0] in rails and not _is_ca(model, sw[0]):
                on_leaf[sw[0]].append((ca[0], link))
    out: list[FabricFinding] = []
    for _leaf, hcas in sorted(on_leaf.items(), key=lambda x: _natural(model.label(x[0]))):
        votes = Counter(rails[ca] for ca, _ in hcas)
        (leaf_rail, n), *rest = votes.most_common()
        if rest and rest[0][1] == n:
            continue  # no majority: cannot say which rail the leaf serves
        for ca, link in hcas:
            if rails[ca] != leaf_rail:
                out.append(FabricFinding("rail", _cable(model, link, rails),
                                         f"a rail-{rails[ca]} HCA on a rail-{leaf_rail} leaf ({n} of its {len(hcas)} "
                                         f"HCAs are rail {leaf_rail})",
                                         f"re-cable {model.label(ca)} to a rail-{rails[ca]} leaf"))  # fmt: skip
    return out


def judge_sm(model: FabricModel) -> list[FabricFinding]:
    if model.sm is not None and model.sm.state == "SMINFO_MASTER":
        return []
    got = "no SM answered sminfo" if model.sm is None else f"the SM at lid {model.sm.lid} is {model.sm.state}"
    return [FabricFinding("subnet-manager", "fabric", f"no master subnet manager: {got}",
                          "start a subnet manager (opensm, or the switches' SM) and scan again", "rerun")]  # fmt: skip


def _ports(model: FabricModel, keys: Iterable[tuple[str, int]], names: set[str]) -> list[IbPort]:
    out = []
    for key, port in keys:
        values = {n: 0 for n in names} | dict(model.counters.get((key, port), {}))
        out.append(IbPort(node=model.label(key), device="", port=port, state=None, phys_state=None,
                          rate_gbps=None, rate_text=None, link_layer=None, counters=values, source="ibqueryerrors"))  # fmt: skip
    return out


def judge_counters(
    before: FabricModel,
    after: FabricModel,
    max_error_increase: int = 0,
    allowed_increase: Mapping[str, int] | None = None,
    max_drop_increase: int | None = None,
    saturated: str = "fail",
) -> list[FabricFinding]:
    """Error counters that grew between two scans on any port, named by both ends of its cable.

    Link-class counters (symbol errors, link downed, recovery, receive errors...) may grow by
    ``max_error_increase`` (or ``allowed_increase[name]``); drop-class ones are judged only when
    ``max_drop_increase`` is set; a counter pinned at its maximum fails unless ``saturated='warn'``.
    These are the profile's ``fabric:`` keys, the same as the node-side fabric check's."""
    allowed = dict(allowed_increase or {})
    names = {n for c in (*before.counters.values(), *after.counters.values()) for n in c}
    keys = sorted(set(before.counters) | set(after.counters))
    diff = diff_ports(_ports(before, keys, names), _ports(after, keys, names))
    rails = rails_of(after)
    by_label = {(after.label(k), p): (k, p) for k, p in keys}
    out: list[FabricFinding] = []
    for change in diff.errors():
        cls = COUNTER_CLASSES.get(change.counter)
        end = by_label.get((change.node or "", change.port or 0))
        if end is None:
            continue
        # symbol errors are a bit-error rate on the node side (fabric_diff's "ber" class), but a scan
        # reads error counters only (ibqueryerrors), not the bits each switch port moved: a count here
        link_like = cls in ("link", "ber")
        limit = allowed.get(change.counter, max_error_increase if link_like else max_drop_increase)
        tool_name = _TOOL_NAMES.get(change.counter, change.counter)
        peer = after.peer(end)
        where = (
            _cable(after, IbLink(end, peer, None, None), rails, first=end)
            if peer
            else _end(after, end, rails)
        )
        if change.saturated and not (change.increase or 0) > (limit or 0):
            if saturated == "fail":
                out.append(FabricFinding("counter-saturated", where, f"{tool_name} pinned at its maximum {change.after}",
                                         f"clear the port's counters (perfquery -R {after.nodes[end[0]].lid or '<lid>'} "
                                         f"{end[1]}) and scan again", "rerun"))  # fmt: skip
            continue
        if change.went_down:
            out.append(FabricFinding("counter-reset", where,
                                     f"{tool_name} went down from {change.before} to {change.after} (cleared between "
                                     "the scans): its growth is unknown", "take both scans again without clearing", "rerun"))  # fmt: skip
            continue
        if limit is None or change.at_least <= limit:
            continue
        action = (
            REPLACE_CABLE if change.counter in _PHYSICAL else "reseat or replace the cable, then the port"
        )
        out.append(FabricFinding("counter", where,
                                 f"{tool_name} +{change.increase} ({change.before} -> {change.after}, allowed {limit})",
                                 action))  # fmt: skip
    return out


def findings_checks(findings: Iterable[FabricFinding], profile: str | None = None) -> list[Check]:
    """The scan as checks for the acceptance run: one per finding (``fabric.ib.<kind>``, labelled with
    the cable as its ``pair``, so the report lists findings by link), and their count (recorded only)."""
    found = list(findings)
    ref = ThresholdRef(profile, ("fabric", "max_error_increase")) if profile else None
    checks = [
        Check("fabric.ib.findings", len(found), "", scope="fabric",
              hint="gpucluster fabric scan's findings over the run (recorded; each is its own check)")
    ]  # fmt: skip
    for f in found:
        # a cable is the finding's "pair" (a link between two ends); a host or a switch is named as such
        who = {"hca-count": "host", "leaf-uplinks": "device", "subnet-manager": None}.get(f.kind, "pair")
        checks.append(
            Check(f"fabric.ib.{f.kind}", 1, "", threshold=0, comparison="<=", ref=ref if f.kind == "counter" else None,
                  scope="fabric", labels={who: f.where} if who else {}, hint=f"{f.detail} -> {f.action}")
        )  # fmt: skip
    return checks
