"""Fabric ports as values: InfiniBand/RoCE ports and Ethernet interfaces, and the words that describe them.

This module owns the dataclasses every fabric parser returns (:class:`IbPort`, :class:`NetInterface`,
:class:`FabricSnapshot`), the readers of the words the tools print for a port's state, physical state
and rate, and :func:`parse_snapshot`, which turns what ``workloads/fabric_probe.py`` read from sysfs
into those values. The text formats (``ibstat``, ``ibstatus``, ``ibv_devinfo``, ``perfquery``, pasted
sysfs dumps) live in :mod:`.ib_tools`; counter differences in :mod:`.fabric_diff`.

Pure: no I/O, no subprocess, no pytest/torch imports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.tc_qdisc import parse_tc_qdisc_json, root_drops

__all__ = [
    "PHYS_STATES",
    "PORT_STATES",
    "FabricSnapshot",
    "IbPort",
    "NetInterface",
    "parse_counter_value",
    "parse_phys_state",
    "parse_port_state",
    "parse_rate_gbps",
    "parse_snapshot",
    "to_json",
]

# IBTA port states by number, as sysfs ("4: ACTIVE"), ibstatus and ibv_devinfo ("PORT_ACTIVE (4)") print them.
PORT_STATES: dict[int, str] = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# ibstat spells them as words; "Initializing" is its INIT.
_PORT_STATE_WORDS = {
    "initializing": "INIT",
    "initialize": "INIT",
    "init": "INIT",
    "active_defer": "ACTIVE_DEFER",
}
# IBTA physical port states by number ("5: LinkUp", "LINK_UP (5)").
PHYS_STATES: dict[int, str] = {
    0: "NoStateChange",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
_PHYS_BY_KEY = {re.sub(r"[^a-z]", "", name.lower()): name for name in PHYS_STATES.values()}

_LEADING_NUMBER = re.compile(r"^\s*(\d+)\s*:\s*(.*)$")  # "4: ACTIVE"
_TRAILING_NUMBER = re.compile(r"^\s*(.*?)\s*\((\d+)\)\s*$")  # "PORT_ACTIVE (4)"
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:Gb/sec|Gbps|Gb/s)?\s*(?:\((.*)\))?\s*$", re.IGNORECASE)


def _number_and_word(text: str) -> tuple[int | None, str]:
    m = _LEADING_NUMBER.match(text)
    if m:
        return int(m.group(1)), m.group(2).strip()
    m = _TRAILING_NUMBER.match(text)
    if m:
        return int(m.group(2)), m.group(1).strip()
    return None, text.strip()


def parse_port_state(text: str | None) -> str | None:
    """``"4: ACTIVE"``, ``"Active"``, ``"PORT_ACTIVE (4)"``, ``"Initializing"`` -> ``"ACTIVE"``/``"INIT"``...

    The number wins when both are printed. A word no table knows is returned upper-cased as it was
    printed, so a check comparing against ``"ACTIVE"`` fails and shows it — never a guess.
    """
    if text is None or not text.strip():
        return None
    number, word = _number_and_word(text)
    if number is not None and number in PORT_STATES:
        return PORT_STATES[number]
    word = re.sub(r"^PORT_", "", word.strip(), flags=re.IGNORECASE)
    return _PORT_STATE_WORDS.get(word.lower(), word.upper())


def parse_phys_state(text: str | None) -> str | None:
    """``"5: LinkUp"``, ``"LINK_UP (5)"``, ``"Polling"``, ``"DISABLED (3)"`` -> ``"LinkUp"``/``"Polling"``/...

    ``ibv_devinfo`` prints ``invalid physical state (0)`` for ports it cannot read: that is None.
    """
    if text is None or not text.strip():
        return None
    number, word = _number_and_word(text)
    if "invalid" in word.lower():
        return None
    if number is not None and number in PHYS_STATES and number != 0:
        return PHYS_STATES[number]
    return _PHYS_BY_KEY.get(re.sub(r"[^a-z]", "", word.lower()), word)


def parse_rate_gbps(text: str | None) -> float | None:
    """The port rate in Gb/s from ``"400 Gb/sec (4X NDR)"`` (sysfs, ibstatus), ``"200"`` (ibstat) or ``"2.5"``.

    Returns None for an empty value; raises :class:`ParseError` for text that is not a rate, so a
    format change is seen rather than read as a slow link.
    """
    if text is None or not text.strip():
        return None
    m = _RATE.match(text)
    if not m:
        raise ParseError(
            f"port rate {text.strip()!r}: expected a number of Gb/s such as '400 Gb/sec (4X NDR)' or '200'"
        )
    return float(m.group(1))


def parse_counter_value(text: str) -> int | None:
    """A sysfs counter file's content as an int; None when it holds something else (``N/A (no PMA)``)."""
    value = text.strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True, slots=True)
class IbPort:
    """One InfiniBand or RoCE port (``/sys/class/infiniband/<device>/ports/<port>``).

    ``counters`` holds the integer counters read (``counters/*`` by their sysfs names, ``hw_counters/*``
    prefixed ``hw_``); ``unreadable`` maps a file (or field) to why it has no value.
    """

    node: str | None
    device: str
    port: int
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    rate_text: str | None
    link_layer: str | None
    counters: Mapping[str, int] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)
    source: str = "sysfs"

    @property
    def key(self) -> tuple[str, str, str]:
        """(node, device, port) as strings: how a port is matched between two snapshots."""
        return (self.node or "", self.device, str(self.port))

    @property
    def name(self) -> str:
        where = f"{self.node}:" if self.node else ""
        return f"{where}{self.device}/{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "ib",
            "node": self.node,
            "device": self.device,
            "port": self.port,
            "state": self.state,
            "phys_state": self.phys_state,
            "rate_gbps": self.rate_gbps,
            "rate_text": self.rate_text,
            "link_layer": self.link_layer,
            "counters": dict(self.counters),
            "unreadable": dict(self.unreadable),
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class NetInterface:
    """One network interface (``/sys/class/net/<name>``): state, speed and ``statistics/*`` counters.

    ``speed_mbps`` is None when the kernel has no speed for the link (``speed`` raises EINVAL on a
    down link or a virtual device, or reads -1); ``unreadable`` says which. ``counters`` may also hold
    ``qdisc_drops``: packets the root queueing discipline dropped, which the interface statistics
    do not count (see :mod:`pytest_gpucluster.workloads.fabric_probe`).
    """

    node: str | None
    name: str
    operstate: str | None
    speed_mbps: int | None
    mtu: int | None
    counters: Mapping[str, int] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node or "", self.name, "")

    @property
    def rate_gbps(self) -> float | None:
        return None if self.speed_mbps is None else self.speed_mbps / 1000

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "net",
            "node": self.node,
            "name": self.name,
            "operstate": self.operstate,
            "speed_mbps": self.speed_mbps,
            "mtu": self.mtu,
            "counters": dict(self.counters),
            "unreadable": dict(self.unreadable),
        }


@dataclass(frozen=True, slots=True)
class FabricSnapshot:
    """Every port and interface of one node at one moment (what one probe returned)."""

    node: str | None
    taken_at: float | None
    ib_ports: tuple[IbPort, ...]
    interfaces: tuple[NetInterface, ...]
    root: bool | None = None
    """Whether the reader ran as root, so could clear the port counters (None: not recorded)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "taken_at": self.taken_at,
            "ib_ports": [p.to_json() for p in self.ib_ports],
            "interfaces": [i.to_json() for i in self.interfaces],
            "root": self.root,
        }


def _section(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ParseError(f"{where}: key {key!r} must map names to readings, got {type(value).__name__}")
    return value


def _counters(
    files: Mapping[str, Any], prefix: str, unreadable: dict[str, str], group: str
) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, text in files.items():
        value = parse_counter_value(str(text))
        if value is None:
            unreadable[f"{group}/{name}"] = f"not a counter: {str(text).strip()!r}"
        else:
            out[prefix + name] = value
    return out


def _ib_port(node: str | None, device: str, port: str, reading: Mapping[str, Any], where: str) -> IbPort:
    attrs = _section(reading, "attrs", where)
    unreadable = {str(k): str(v) for k, v in _section(reading, "errors", where).items()}
    counters = _counters(_section(reading, "counters", where), "", unreadable, "counters")
    counters.update(_counters(_section(reading, "hw_counters", where), "hw_", unreadable, "hw_counters"))
    rate_text = attrs.get("rate")
    try:
        rate = parse_rate_gbps(rate_text)
    except ParseError as exc:
        rate, unreadable["rate"] = None, str(exc)
    if not port.isdigit():
        raise ParseError(f"{where}: port {port!r} of {device} is not a port number")
    return IbPort(
        node=node,
        device=device,
        port=int(port),
        state=parse_port_state(attrs.get("state")),
        phys_state=parse_phys_state(attrs.get("phys_state")),
        rate_gbps=rate,
        rate_text=rate_text.strip() if isinstance(rate_text, str) else None,
        link_layer=(attrs.get("link_layer") or "").strip() or None,
        counters=counters,
        unreadable=unreadable,
    )


def _interface(node: str | None, name: str, reading: Mapping[str, Any], where: str) -> NetInterface:
    attrs = _section(reading, "attrs", where)
    unreadable = {str(k): str(v) for k, v in _section(reading, "errors", where).items()}
    counters = _counters(_section(reading, "statistics", where), "", unreadable, "statistics")
    speed_text = str(attrs.get("speed", "")).strip()
    speed = int(speed_text) if re.fullmatch(r"-?\d+", speed_text) else None
    if speed is not None and speed < 0:  # the kernel's SPEED_UNKNOWN
        unreadable.setdefault("speed", f"unknown ({speed_text})")
        speed = None
    mtu_text = str(attrs.get("mtu", "")).strip()
    qdisc = reading.get("qdisc")
    if isinstance(qdisc, Mapping) and "json" in qdisc:
        try:
            drops = root_drops(parse_tc_qdisc_json(str(qdisc["json"])))
        except ParseError as exc:
            unreadable["qdisc"] = str(exc)
        else:
            if drops is not None:
                counters["qdisc_drops"] = drops
    elif isinstance(qdisc, Mapping) and "error" in qdisc:
        unreadable["qdisc"] = str(qdisc["error"])
    return NetInterface(
        node=node,
        name=name,
        operstate=(str(attrs.get("operstate", "")).strip() or None),
        speed_mbps=speed,
        mtu=int(mtu_text) if mtu_text.isdigit() else None,
        counters=counters,
        unreadable=unreadable,
    )


def parse_snapshot(data: Mapping[str, Any], source: str = "fabric snapshot") -> FabricSnapshot:
    """Turn the JSON-able reading of :func:`pytest_gpucluster.workloads.fabric_probe.snapshot` into values.

    Raises :class:`ParseError` naming ``source`` when ``data`` is not such a reading.
    """
    if not isinstance(data, Mapping) or not ({"infiniband", "net"} & set(data)):
        raise ParseError(f"{source}: expected a fabric snapshot with 'infiniband' and 'net' sections")
    node = data.get("node")
    node = str(node) if node else None
    ib_ports: list[IbPort] = []
    for device, dev_reading in sorted(_section(data, "infiniband", source).items()):
        ports = _section(dev_reading, "ports", f"{source}: infiniband/{device}")
        for port, reading in sorted(ports.items(), key=lambda kv: (len(kv[0]), kv[0])):
            ib_ports.append(_ib_port(node, device, str(port), reading, f"{source}: {device}/{port}"))
    interfaces = [
        _interface(node, name, reading, f"{source}: net/{name}")
        for name, reading in sorted(_section(data, "net", source).items())
    ]
    taken = data.get("taken_at")
    return FabricSnapshot(
        node=node,
        taken_at=float(taken) if isinstance(taken, (int, float)) else None,
        ib_ports=tuple(ib_ports),
        interfaces=tuple(interfaces),
        root=data["root"] if isinstance(data.get("root"), bool) else None,
    )


def to_json(
    result: FabricSnapshot | list[IbPort] | tuple[IbPort, ...],
) -> dict[str, Any] | list[dict[str, Any]]:
    """JSON form of a snapshot or of the ports a text parser returned."""
    if isinstance(result, FabricSnapshot):
        return result.to_json()
    return [p.to_json() for p in result]
