"""The InfiniBand fabric as the subnet tools print it: ``ibnetdiscover``, ``iblinkinfo``,
``ibqueryerrors`` and ``sminfo`` text in, a :class:`FabricModel` out.

``ibnetdiscover`` gives the nodes (switches and HCAs: GUID, port count, node description, LID) and
every cable with the width and speed it trained at (``4xHDR``); it also reads ibsim's topology
files, which are the same format without the comments. ``iblinkinfo`` (its default blocks, its
``--line`` form, or lines grepped out of either) gives every port's state, cabled or not
(``Down/ Polling``). ``ibqueryerrors`` lists the ports whose error counters exceed its thresholds
(run with a threshold file of zeros, every non-zero counter); ``sminfo`` names the master SM.

An HCA's node description is ``<host> <device>`` (the kernel sets it so: ``gpu-node-017 mlx5_3``):
:attr:`IbNode.host` and :attr:`IbNode.device` split it. Counter names are the sysfs names the
node-side parsers use (:data:`~.ib_tools.PERFQUERY_NAMES`), so :mod:`.fabric_diff` judges both.

Pure: text in, values out; no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import re

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.ib_fabric_model import (
    LANE_SPEEDS,
    FabricModel,
    IbLink,
    IbNode,
    LinkInfoRow,
    NodeKind,
    SmInfo,
    speed_name,
)
from pytest_gpucluster.parsers.ib_fabric_model import guid as _guid
from pytest_gpucluster.parsers.ib_tools import PERFQUERY_NAMES

__all__ = [
    "LANE_SPEEDS",
    "FabricModel",
    "IbLink",
    "IbNode",
    "LinkInfoRow",
    "SmInfo",
    "build_fabric",
    "parse_iblinkinfo",
    "parse_ibnetdiscover",
    "parse_ibqueryerrors",
    "parse_sminfo",
    "speed_name",
]

# ---- prefixes ---------------------------------------------------------------------------------------

_PDSH = re.compile(r"^\s*[A-Za-z0-9][\w.\-]*:\s")


def _match(pattern: re.Pattern[str], line: str) -> re.Match[str] | None:
    """``pattern`` on the line, or on it without a pdsh/clush ``host: `` prefix."""
    if m := pattern.match(line):
        return m
    if p := _PDSH.match(line):
        return pattern.match(line[p.end() :])
    return None


# ---- ibnetdiscover ---------------------------------------------------------------------------------

_HEADER = re.compile(
    r'^(?P<kind>Switch|Ca|Hca|Rt)\s+(?P<ports>\d+)\s+"(?P<id>[^"]+)"(?:\s*#\s*"(?P<desc>[^"]*)"(?P<rest>.*))?$'
)
_GUID_LINE = re.compile(r"^(?:switchguid|caguid|rtguid)=(?P<guid>0x[0-9a-fA-F]+)")
_PORT = re.compile(
    r'^\[(?P<port>\d+)\](?:\((?P<pguid>[0-9a-fA-F]+)\))?\s+"(?P<peer>[^"]+)"\[(?P<pport>\d+)\]'
    r"(?:\((?P<ppguid>[0-9a-fA-F]+)\))?(?P<rest>.*)$"
)
_LID = re.compile(r"\blid (\d+)")
_WIDTH_SPEED = re.compile(r"\b(\d+)x([A-Z][A-Z0-9]*)\b")
_SIM_WIDTH = re.compile(r"(?:^|\s)w=(\d+)")
_SIM_SPEED = re.compile(r"(?:^|\s)s=(\d+)")
_SIM_SPEEDS = {1: "SDR", 2: "DDR", 4: "QDR"}
"""ibsim's ``s=`` codes (IBTA LinkSpeedActive): an ibsim topology file states speeds this way."""


def parse_ibnetdiscover(text: str) -> tuple[dict[str, IbNode], tuple[IbLink, ...], dict[str, str]]:
    """(nodes by key, cables, port GUID -> node key) from ``ibnetdiscover`` output or an ibsim topology.

    A cable seen from one end only (the text was cut) is kept; one seen from both ends counts once.
    Raises :class:`ParseError` naming the line when a port line comes before any node header.
    """
    ids: dict[str, str] = {}  # the quoted id ("S-000..." or a name) -> node key
    nodes: dict[str, IbNode] = {}
    port_guids: dict[str, str] = {}
    raw: list[tuple[str, int, str, int, int | None, str | None]] = []
    pending_guid: str | None = None
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if m := _match(_GUID_LINE, line):
            pending_guid = _guid(m.group("guid"))
            continue
        if m := _match(_HEADER, line):
            ident, desc = m.group("id"), m.group("desc")
            if pending_guid is not None:
                key = pending_guid
            elif re.fullmatch(r"[SHR]-[0-9a-fA-F]{1,16}", ident):
                key = _guid(ident)
            else:
                key = ident
            kind: NodeKind = {"Switch": "switch", "Rt": "router"}.get(m.group("kind"), "ca")  # type: ignore[assignment]
            lid = _LID.search(m.group("rest") or "")
            nodes[key] = IbNode(key, kind, desc if desc is not None else ident, int(m.group("ports")),
                                int(lid.group(1)) if lid and kind == "switch" else None)  # fmt: skip
            ids[ident] = key
            current, pending_guid = key, None
            continue
        if m := _match(_PORT, line):
            if current is None:
                raise ParseError(
                    f"ibnetdiscover line {number}: a port line before any Switch/Ca header: {line!r}"
                )
            rest = m.group("rest")
            comment = rest.split("#", 1)[1] if "#" in rest else ""
            width = speed = None
            if ws := _WIDTH_SPEED.search(comment):
                width, speed = int(ws.group(1)), speed_name(ws.group(2))
            else:
                options = rest.split("#", 1)[0]
                if sim := _SIM_WIDTH.search(options):
                    width = int(sim.group(1))
                if sim := _SIM_SPEED.search(options):
                    speed = _SIM_SPEEDS.get(int(sim.group(1)))
            if m.group("pguid"):
                port_guids[_guid(m.group("pguid"))] = current
                if (
                    (lid := _LID.search(comment))
                    and nodes[current].kind == "ca"
                    and nodes[current].lid is None
                ):
                    nodes[current] = IbNode(current, "ca", nodes[current].description, nodes[current].ports,
                                            int(lid.group(1)))  # fmt: skip
            raw.append((current, int(m.group("port")), m.group("peer"), int(m.group("pport")), width, speed))
    links: dict[tuple[tuple[str, int], tuple[str, int]], IbLink] = {}
    for key, port, peer, peer_port, width, speed in raw:
        peer_key = ids.get(peer) or (_guid(peer) if re.fullmatch(r"[SHR]-[0-9a-fA-F]{1,16}", peer) else peer)
        a, b = sorted([(key, port), (peer_key, peer_port)])
        old = links.get((a, b))
        if old is None or (old.width is None and width is not None):
            links[a, b] = IbLink(a, b, width, speed if speed else (old.speed if old else None))
    if not nodes:
        raise ParseError("ibnetdiscover output holds no 'Switch N \"...\"' or 'Ca N \"...\"' node line")
    return nodes, tuple(sorted(links.values(), key=lambda x: (x.a, x.b))), port_guids


# ---- iblinkinfo ------------------------------------------------------------------------------------

_LI_SWITCH = re.compile(r"^\s*Switch:\s*(?P<guid>0x[0-9a-fA-F]+)\s+(?P<desc>.*?):?\s*$")
_LI_CA = re.compile(r"^\s*CA:\s*(?P<desc>.*?):\s*$")
_LI_PORT = re.compile(
    r'^\s*(?:(?P<guid>0x[0-9a-fA-F]+)\s+(?:"(?P<desc>[^"]*)"\s+)?)?(?P<lid>\d+)\s+(?P<port>\d+)\[[^\]]*\]\s*'
    r"==\(\s*(?:(?P<width>\d+)X\s+(?P<speed>[\d.]+)\s*Gbps\s+)?(?P<state>\w+)\s*/\s*(?P<phys>\w+)\s*\)==>\s*"
    r'(?:(?P<pguid>0x[0-9a-fA-F]+)\s+)?(?:(?P<plid>\d+)\s+)?(?:(?P<pport>\d+))?\[[^\]]*\]\s*"(?P<pdesc>[^"]*)"'
)


def parse_iblinkinfo(text: str) -> list[LinkInfoRow]:
    """Every port line of ``iblinkinfo`` (default or ``--line``; grepped lines too; prompts are skipped)."""
    rows: list[LinkInfoRow] = []
    block_guid: str | None = None
    block_desc: str | None = None
    for line in text.splitlines():
        if m := _match(_LI_SWITCH, line):
            block_guid, block_desc = _guid(m.group("guid")), m.group("desc").strip()
            continue
        if m := _match(_LI_CA, line):
            block_guid, block_desc = None, m.group("desc").strip()
            continue
        m = _match(_LI_PORT, line)
        if not m:
            continue
        guid = _guid(m.group("guid")) if m.group("guid") else block_guid
        desc = m.group("desc").strip() if m.group("desc") is not None else block_desc
        rows.append(
            LinkInfoRow(
                node=guid, description=desc, lid=int(m.group("lid")), port=int(m.group("port")),
                width=int(m.group("width")) if m.group("width") else None,
                speed=speed_name(m.group("speed")) if m.group("speed") else None,
                state=m.group("state"), phys=m.group("phys"),
                peer_lid=int(m.group("plid")) if m.group("plid") else None,
                peer_port=int(m.group("pport")) if m.group("pport") else None,
                peer_description=m.group("pdesc") or None,
            )
        )  # fmt: skip
    if not rows:
        raise ParseError("iblinkinfo output holds no '<lid> <port>[ ] ==( ... )==> ...' port line")
    return rows


# ---- ibqueryerrors, sminfo ---------------------------------------------------------------------------

_QE_NODE = re.compile(r'^\s*Errors for\s+(?P<guid>0x[0-9a-fA-F]+)\s+"(?P<desc>[^"]*)"')
_QE_PORT = re.compile(r"^\s*GUID\s+(?P<guid>0x[0-9a-fA-F]+)\s+port\s+(?P<port>\d+|ALL):\s*(?P<rest>.*)$")
_QE_COUNTER = re.compile(r"\[(?P<name>\w+)\s*==\s*(?P<value>\d+)")


def parse_ibqueryerrors(text: str) -> dict[tuple[str, int], dict[str, int]]:
    """(node GUID, port) -> counters (sysfs names) for every port ``ibqueryerrors`` lists; ``port ALL``
    (the node's sum) is skipped. Ports it does not list had no counter above its thresholds."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    seen_summary = False
    for line in text.splitlines():
        if line.startswith("## Summary"):
            seen_summary = True
        m = _match(_QE_PORT, line)
        if not m or m.group("port") == "ALL":
            continue
        counters = out.setdefault((_guid(m.group("guid")), int(m.group("port"))), {})
        for c in _QE_COUNTER.finditer(m.group("rest")):
            counters[PERFQUERY_NAMES.get(c.group("name"), c.group("name"))] = int(c.group("value"))
    if not out and not seen_summary:
        raise ParseError(
            "ibqueryerrors output holds neither a 'GUID ... port N: [...]' line nor its '## Summary'"
        )
    return out


_SMINFO = re.compile(
    r"sm lid (?P<lid>\d+) sm guid (?P<guid>0x[0-9a-fA-F]+), activity count \d+ priority (?P<prio>\d+) "
    r"state \d+ (?P<state>\w+)"
)


def parse_sminfo(text: str) -> SmInfo:
    if m := _SMINFO.search(text):
        return SmInfo(int(m.group("lid")), _guid(m.group("guid")), int(m.group("prio")), m.group("state"))
    raise ParseError(
        f"sminfo output names no SM ('sm lid N sm guid 0x... state N SMINFO_...'): {text.strip()[:200]!r}"
    )


def build_fabric(
    ibnetdiscover: str,
    iblinkinfo: str | None = None,
    ibqueryerrors: str | None = None,
    sminfo: str | None = None,
) -> FabricModel:
    """One :class:`FabricModel` from the four tools' outputs (all but ibnetdiscover optional).

    iblinkinfo's width and speed, where it reports both ends' port, replace ibnetdiscover's (they
    are the same reading; iblinkinfo also covers ports with no cable)."""
    nodes, links, port_guids = parse_ibnetdiscover(ibnetdiscover)
    states: dict[tuple[str, int], tuple[str, str]] = {}
    if iblinkinfo is not None:
        for row in parse_iblinkinfo(iblinkinfo):
            key = port_guids.get(row.node or "", row.node)
            if key not in nodes:
                key = next((k for k, n in nodes.items() if n.lid == row.lid and n.lid is not None), None)
            if key is not None:
                states[key, row.port] = (row.state, row.phys)
    counters: dict[tuple[str, int], dict[str, int]] = {}
    if ibqueryerrors is not None:
        for (guid, port), values in parse_ibqueryerrors(ibqueryerrors).items():
            counters[port_guids.get(guid, guid), port] = values
    return FabricModel(nodes, links, states, counters, None if not sminfo else parse_sminfo(sminfo))
