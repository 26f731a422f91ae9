"""The InfiniBand fabric as values: switches and HCAs (:class:`IbNode`), cables (:class:`IbLink`),
the subnet manager (:class:`SmInfo`) and :class:`FabricModel`, which holds them with every port's
state and error counters and serializes to ``fabric.json``. Built by :mod:`.ib_fabric` from the
tools' text. Pure: no I/O, no pytest/torch imports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_gpucluster.errors import ParseError

__all__ = [
    "LANE_SPEEDS",
    "FabricModel",
    "IbLink",
    "IbNode",
    "LinkInfoRow",
    "NodeKind",
    "SmInfo",
    "guid",
    "speed_name",
]

NodeKind = Literal["switch", "ca", "router"]

LANE_SPEEDS: Mapping[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.3125, "FDR": 14.0625,
    "EDR": 25.78125, "HDR": 53.125, "NDR": 106.25, "XDR": 212.5,
}  # fmt: skip
"""Per-lane signalling rate (Gb/s) by IBTA speed name: iblinkinfo prints the rate, ibnetdiscover the name."""


def speed_name(text: str) -> str:
    """``2.5`` / ``25.78125 Gbps`` / ``HDR`` -> the IBTA name (``SDR``, ``EDR``, ``HDR``); unknown: as given."""
    word = text.strip().upper().removesuffix("GBPS").strip()
    if word in LANE_SPEEDS:
        return word
    try:
        rate = float(word)
    except ValueError:
        return text.strip()
    for name, value in LANE_SPEEDS.items():
        if abs(value - rate) < 1e-3:
            return name
    return f"{rate:g} Gbps"


def guid(text: str) -> str:
    """A GUID as ``0x`` and 16 hex digits, however the tool printed it (``0x200001``, ``S-000...``)."""
    return f"0x{int(text.removeprefix('S-').removeprefix('H-').removeprefix('R-'), 16):016x}"


@dataclass(frozen=True, slots=True)
class IbNode:
    """A switch or HCA (a router too): ``key`` is its GUID where the text gives one, else its name."""

    key: str
    kind: NodeKind
    description: str
    ports: int
    lid: int | None = None

    @property
    def host(self) -> str | None:
        """The HCA's host (first word of its description); None for a switch."""
        return self.description.split(None, 1)[0] if self.kind == "ca" and self.description.strip() else None

    @property
    def device(self) -> str | None:
        """The HCA's device (``mlx5_3``), the rest of its description; None when it has one word only."""
        parts = self.description.split(None, 1)
        return parts[1] if self.kind == "ca" and len(parts) == 2 else None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "description": self.description, "ports": self.ports,
                "lid": self.lid}  # fmt: skip


@dataclass(frozen=True, slots=True)
class IbLink:
    """One cable: (node key, port) at each end (``a`` sorted first), its width in lanes and lane speed."""

    a: tuple[str, int]
    b: tuple[str, int]
    width: int | None
    speed: str | None

    def to_json(self) -> dict[str, Any]:
        return {"a": list(self.a), "b": list(self.b), "width": self.width, "speed": self.speed}


@dataclass(frozen=True, slots=True)
class LinkInfoRow:
    """One port as iblinkinfo prints it: ``node`` is a GUID (node or, in a CA block, port) or None."""

    node: str | None
    description: str | None
    lid: int | None
    port: int
    width: int | None
    speed: str | None
    state: str
    phys: str
    peer_lid: int | None
    peer_port: int | None
    peer_description: str | None


@dataclass(frozen=True, slots=True)
class SmInfo:
    lid: int
    guid: str
    priority: int
    state: str  # SMINFO_MASTER, SMINFO_STANDBY, ...


@dataclass(frozen=True, slots=True)
class FabricModel:
    """Nodes by key, cables, every port's (state, physical state), error counters per port, the SM."""

    nodes: Mapping[str, IbNode]
    links: tuple[IbLink, ...]
    port_states: Mapping[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    counters: Mapping[tuple[str, int], Mapping[str, int]] = field(default_factory=dict)
    sm: SmInfo | None = None
    _labels: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        repeated = _duplicates(self.nodes.values())
        labels = {
            key: f"{n.description} ({n.key})".strip()
            if repeated[n.description] > 1 or not n.description
            else n.description
            for key, n in self.nodes.items()
        }
        object.__setattr__(self, "_labels", labels)

    def label(self, key: str) -> str:
        """How a person names a node: its description, with the GUID only where descriptions repeat."""
        return self._labels.get(key, key)

    def key_of(self, label: str) -> str | None:
        """The node a label names (the inverse of `label`), or None."""
        for key, text in self._labels.items():
            if text == label:
                return key
        return None

    def peer(self, end: tuple[str, int]) -> tuple[str, int] | None:
        for link in self.links:
            if link.a == end:
                return link.b
            if link.b == end:
                return link.a
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_json() for n in self.nodes.values()],
            "links": [link.to_json() for link in self.links],
            "port_states": [[k, p, s, ph] for (k, p), (s, ph) in sorted(self.port_states.items())],
            "counters": [[k, p, dict(c)] for (k, p), c in sorted(self.counters.items())],
            "sm": None if self.sm is None else {"lid": self.sm.lid, "guid": self.sm.guid,
                                                "priority": self.sm.priority, "state": self.sm.state},
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "fabric.json") -> FabricModel:
        try:
            nodes = {n["key"]: IbNode(n["key"], n["kind"], n["description"], int(n["ports"]), n.get("lid"))
                     for n in data["nodes"]}  # fmt: skip
            links = tuple(IbLink(tuple(x["a"]), tuple(x["b"]), x["width"], x["speed"]) for x in data["links"])  # type: ignore[arg-type]
            states = {(k, int(p)): (s, ph) for k, p, s, ph in data.get("port_states", [])}
            counters = {
                (k, int(p)): {n: int(v) for n, v in c.items()} for k, p, c in data.get("counters", [])
            }
            sm = data.get("sm")
            return cls(nodes, links, states, counters,
                       None if sm is None else SmInfo(sm["lid"], sm["guid"], sm["priority"], sm["state"]))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(
                f"{where}: not a fabric scan's fabric.json ({type(exc).__name__}: {exc})"
            ) from exc


def _duplicates(nodes: Iterable[IbNode]) -> Counter[str]:
    return Counter(n.description for n in nodes)
