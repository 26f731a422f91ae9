"""The InfiniBand tools' text outputs as :class:`~.fabric_ports.IbPort` values.

``ibstat``, ``ibstatus``, ``ibv_devinfo [-v]``, ``perfquery [-x]`` and pasted sysfs counter dumps
(``grep . /sys/class/infiniband/*/ports/*/counters/*`` or a ``cat`` loop printing ``=== ./name ===``)
as people paste them: tabs or spaces, ``ibwarn:``/``ibpanic:`` lines, shell prompts, ``pdsh``'s
``host: `` prefix (the node then names the port), and output cut off mid-port (the port keeps what
was read). :func:`parse_ib_text` recognises which tool printed a text.

Pure: text in, values out; no I/O, no pytest/torch imports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_ports import (
    FabricSnapshot,
    IbPort,
    parse_counter_value,
    parse_phys_state,
    parse_port_state,
    parse_rate_gbps,
    parse_snapshot,
)

__all__ = [
    "PERFQUERY_NAMES",
    "detect_format",
    "parse_fabric",
    "parse_ib_text",
    "parse_ibstat",
    "parse_ibstatus",
    "parse_ibv_devinfo",
    "parse_perfquery",
    "parse_sysfs_dump",
    "to_json",
]

PERFQUERY_NAMES: dict[str, str] = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
    "PortXmitWait": "port_xmit_wait",
    "PortUnicastXmitPkts": "unicast_xmit_packets",
    "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets",
    "PortMulticastRcvPkts": "multicast_rcv_packets",
    "QP1Dropped": "qp1_dropped",
}
"""perfquery's field names -> the sysfs counter names, so both diff the same way."""

# "node001: CA 'mlx5_0'" / "node001: Infiniband device 'mlx5_0' port 1 status:" -- pdsh/clush output.
_PDSH = re.compile(r"^(?P<host>[A-Za-z0-9][\w.\-]*):\s(?=\s*\S)")
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z][\w ./\[\]-]*?)\s*:\s*(?P<value>.*?)\s*$")


@dataclass
class _Port:
    """A port being read; frozen into an IbPort once its block ends."""

    node: str | None
    device: str
    port: int
    fields: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    def freeze(self, source: str, derived_rate: tuple[str | None, float | None] | None = None) -> IbPort:
        """The port as a value; ``derived_rate`` is (text, Gb/s) when the tool prints no single rate field."""
        if derived_rate is not None:
            text, rate = derived_rate
        else:
            text, rate = self.fields.get("rate"), None
            if text is not None:
                try:
                    rate = parse_rate_gbps(text)
                except ParseError as exc:
                    self.unreadable["rate"] = str(exc)
        return IbPort(
            node=self.node,
            device=self.device,
            port=self.port,
            state=parse_port_state(self.fields.get("state")),
            phys_state=parse_phys_state(self.fields.get("phys_state")),
            rate_gbps=rate,
            rate_text=text or None,
            link_layer=self.fields.get("link_layer") or None,
            counters=dict(self.counters),
            unreadable=dict(self.unreadable),
            source=source,
        )


def _split_host(lines: list[str], needle: re.Pattern[str]) -> list[tuple[str | None, str]]:
    """(host, line) pairs: when the first line holding ``needle`` starts with a pdsh ``host: `` prefix,
    strip that prefix from every line that has one."""
    for line in lines:
        if m := needle.search(line):
            prefix = _PDSH.match(line[: m.start()] + "x")  # "x": the lookahead needs text after the prefix
            if not prefix or prefix.end() != m.start():
                break
            out = []
            for ln in lines:
                pm = _PDSH.match(ln)
                out.append((pm.group("host"), ln[pm.end() :]) if pm else (None, ln))
            return out
    return [(None, ln) for ln in lines]


_IBSTAT_CA = re.compile(r"^\s*CA '(?P<dev>[^']+)'")
_IBSTAT_PORT = re.compile(r"^\s*[Pp]ort (?P<port>\d+):\s*$")
_IBSTAT_FIELDS = {
    "state": "state",
    "physical state": "phys_state",
    "rate": "rate",
    "link layer": "link_layer",
}


def parse_ibstat(text: str) -> list[IbPort]:
    """``ibstat``: ``CA 'mlx5_0'`` blocks, each with ``Port N:`` and ``State``/``Physical state``/``Rate``/``Link layer``.

    ``Rate`` is in Gb/s (``200``, ``2.5``). ``ibwarn:``/``ibpanic:`` lines are skipped; ``ibpanic``
    means ibstat stopped early, so the ports before it are all there is.
    """
    ports: list[_Port] = []
    device: str | None = None
    node: str | None = None
    for host, line in _split_host(text.splitlines(), re.compile(r"CA '")):
        if m := _IBSTAT_CA.match(line):
            device, node = m.group("dev"), host
            continue
        if device is None or line.lstrip().startswith(("ibwarn:", "ibpanic:")):
            continue
        if m := _IBSTAT_PORT.match(line):
            ports.append(_Port(node, device, int(m.group("port"))))
            continue
        kv = _KEY_VALUE.match(line)
        key = kv.group("key").lower() if kv else ""
        if kv and kv.group("value") and ports and ports[-1].device == device and key in _IBSTAT_FIELDS:
            ports[-1].fields[_IBSTAT_FIELDS[key]] = kv.group("value")
    if not ports:
        raise ParseError("ibstat output holds no \"CA '<device>'\" block with a 'Port N:' section")
    return [p.freeze("ibstat") for p in ports]


_IBSTATUS_HEAD = re.compile(r"^\s*Infiniband device '(?P<dev>[^']+)' port (?P<port>\d+) status:")
_IBSTATUS_FIELDS = {"state": "state", "phys state": "phys_state", "rate": "rate", "link_layer": "link_layer"}


def parse_ibstatus(text: str) -> list[IbPort]:
    """``ibstatus``: ``Infiniband device 'mlx5_0' port 1 status:`` then ``state: 4: ACTIVE``, ``rate: 200 Gb/sec (4X HDR)``..."""
    ports: list[_Port] = []
    for host, line in _split_host(text.splitlines(), re.compile(r"Infiniband device '")):
        if m := _IBSTATUS_HEAD.match(line):
            ports.append(_Port(host, m.group("dev"), int(m.group("port"))))
            continue
        kv = _KEY_VALUE.match(line)
        if kv and ports and kv.group("key").lower() in _IBSTATUS_FIELDS and kv.group("value"):
            ports[-1].fields[_IBSTATUS_FIELDS[kv.group("key").lower()]] = kv.group("value")
    if not ports:
        raise ParseError("ibstatus output holds no \"Infiniband device '<dev>' port N status:\" line")
    return [p.freeze("ibstatus") for p in ports]


_DEVINFO_HCA = re.compile(r"^\s*hca_id:\s*(?P<dev>\S+)")
_DEVINFO_PORT = re.compile(r"^\s*port:\s*(?P<port>\d+)\s*$")
_WIDTH = re.compile(r"^\s*(\d+)X\b")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gbps")


def _devinfo_rate(fields: dict[str, str]) -> tuple[str | None, float | None]:
    """ibv_devinfo -v prints width and per-lane speed (``4X (2)``, ``50.0 Gbps (64)``): the rate is their product."""
    width, speed = fields.get("active_width", ""), fields.get("active_speed", "")
    if not width and not speed:
        return None, None
    text = f"{width} x {speed}"
    w, s = _WIDTH.match(width), _SPEED.match(speed)
    return text, (int(w.group(1)) * float(s.group(1)) if w and s else None)


def parse_ibv_devinfo(text: str) -> list[IbPort]:
    """``ibv_devinfo [-v]``: ``hca_id:`` blocks with ``port: N`` and ``state: PORT_ACTIVE (4)``, ``link_layer``.

    Only ``-v`` prints ``phys_state``, ``active_width`` and ``active_speed`` (per lane): without them
    the port has no rate. ``invalid speed (0)`` on a disabled port gives rate None with the reason.
    """
    ports: list[_Port] = []
    device: str | None = None
    node: str | None = None
    for host, line in _split_host(text.splitlines(), re.compile(r"hca_id:")):
        if m := _DEVINFO_HCA.match(line):
            device, node = m.group("dev"), host
            continue
        if device is None:
            continue
        if m := _DEVINFO_PORT.match(line):
            ports.append(_Port(node, device, int(m.group("port"))))
            continue
        kv = _KEY_VALUE.match(line)
        key = kv.group("key") if kv else ""
        if (
            ports
            and ports[-1].device == device
            and key
            in {
                "state",
                "phys_state",
                "link_layer",
                "active_width",
                "active_speed",
            }
        ):
            ports[-1].fields[key] = kv.group("value")
    if not ports:
        raise ParseError("ibv_devinfo output holds no 'hca_id:' block with a 'port: N' line")
    out = []
    for p in ports:
        rate_text, rate = _devinfo_rate(p.fields)
        if rate_text and rate is None:
            p.unreadable["rate"] = f"no rate from active_width/active_speed {rate_text!r}"
        out.append(p.freeze("ibv_devinfo", derived_rate=(rate_text, rate)))
    return out


_PQ_HEADER = re.compile(
    r"^#\s*Port (?:extended )?counters:\s*Lid (?P<lid>\d+) port (?P<port>\d+)", re.IGNORECASE
)
_PQ_FIELD = re.compile(r"^\s*(?P<name>[A-Za-z0-9]+):\.*(?P<value>\S+)\s*$")


def parse_perfquery(text: str) -> list[IbPort]:
    """``perfquery [-x] [lid port]``: ``SymbolErrorCounter:.......0`` lines, one block per ``# Port counters:`` header.

    perfquery addresses ports by LID, not device name: ``device`` is ``lid<N>`` when the header gives
    the LID, else ``perfquery``; the port comes from the header or ``PortSelect``.
    """
    ports: list[_Port] = []
    for line in text.splitlines():
        if m := _PQ_HEADER.match(line.strip()):
            ports.append(_Port(None, f"lid{m.group('lid')}", int(m.group("port"))))
            continue
        m = _PQ_FIELD.match(line)
        if not m:
            continue
        name, value = m.group("name"), m.group("value")
        if name == "PortSelect" and value.isdigit():
            if not ports or ports[-1].counters or ports[-1].fields.get("port_select"):
                ports.append(_Port(None, "perfquery", int(value)))
            ports[-1].fields["port_select"] = value
        elif name in PERFQUERY_NAMES:
            if not ports:
                ports.append(_Port(None, "perfquery", 0))
            number = parse_counter_value(value)
            if number is None:
                ports[-1].unreadable[PERFQUERY_NAMES[name]] = f"not a counter: {value!r}"
            else:
                ports[-1].counters[PERFQUERY_NAMES[name]] = number
    ports = [p for p in ports if p.counters or p.unreadable]
    if not ports:
        raise ParseError("perfquery output holds no 'SymbolErrorCounter:....<n>'-style counter line")
    return [p.freeze("perfquery") for p in ports]


_SYSFS_LINE = re.compile(
    r"infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>\d+)/(?:(?P<group>counters|hw_counters)/)?(?P<name>[A-Za-z0-9_]+):(?P<value>.*)$"
)
_LOOP_PROMPT = re.compile(r"infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>\d+)/(?P<group>counters|hw_counters)")
_LOOP_HEAD = re.compile(r"^=== \./(?P<name>[A-Za-z0-9_]+) ===\s*$")


def parse_sysfs_dump(text: str) -> list[IbPort]:
    """Pasted sysfs: ``grep . .../infiniband/<dev>/ports/<n>/counters/*`` (``path:value`` lines, any path
    prefix such as ``/sys/devices/pci...``) or a ``cat`` loop printing ``=== ./name ===`` then the value,
    run inside ``.../infiniband/<dev>/ports/<n>/counters`` (the prompt names the port).

    Non-numeric values (``N/A (no PMA)`` from iWARP devices) go to ``unreadable``.
    """
    ports: dict[tuple[str, int], _Port] = {}

    def port(dev: str, num: str) -> _Port:
        return ports.setdefault((dev, int(num)), _Port(None, dev, int(num)))

    def put(p: _Port, group: str | None, name: str, value: str) -> None:
        if group is None:
            p.fields[name] = value.strip()
            return
        key = ("hw_" if group == "hw_counters" else "") + name
        number = parse_counter_value(value)
        if number is None:
            p.unreadable[f"{group}/{name}"] = f"not a counter: {value.strip()!r}"
        else:
            p.counters[key] = number

    loop_dir = ("unknown", "0", "counters")  # a cat loop's directory, from the prompt before it
    pending: str | None = None
    for line in text.splitlines():
        if m := _SYSFS_LINE.search(line):
            put(port(m.group("dev"), m.group("port")), m.group("group"), m.group("name"), m.group("value"))
        elif m := _LOOP_PROMPT.search(line):
            loop_dir = (m.group("dev"), m.group("port"), m.group("group"))
        elif m := _LOOP_HEAD.match(line):
            pending = m.group("name")
        elif pending is not None and line.strip():
            put(port(loop_dir[0], loop_dir[1]), loop_dir[2], pending, line)
            pending = None
    if not ports:
        raise ParseError(
            "no sysfs InfiniBand port lines ('.../infiniband/<dev>/ports/<n>/counters/<name>:<value>')"
        )
    return [p.freeze("sysfs dump") for _, p in sorted(ports.items())]


_DETECTORS: list[tuple[str, re.Pattern[str], Callable[[str], list[IbPort]]]] = [
    ("ibstatus", re.compile(r"Infiniband device '[^']+' port \d+ status:"), parse_ibstatus),
    ("ibstat", re.compile(r"CA '[^']+'"), parse_ibstat),
    ("ibv_devinfo", re.compile(r"hca_id:"), parse_ibv_devinfo),
    ("perfquery", re.compile(r"(SymbolErrorCounter|PortXmitData|PortRcvErrors):\.+"), parse_perfquery),
    ("sysfs", re.compile(r"infiniband/[^/\s]+/ports/\d+/|^=== \./\w+ ===", re.MULTILINE), parse_sysfs_dump),
]


def detect_format(text: str) -> str | None:
    """Which tool printed ``text``: ``snapshot`` (fabric_probe JSON), ``ibstatus``, ``ibstat``, ``ibv_devinfo``,
    ``perfquery`` or ``sysfs``; None when none of them."""
    if text.lstrip().startswith("{"):
        return "snapshot"
    for name, pattern, _ in _DETECTORS:
        if pattern.search(text):
            return name
    return None


def parse_fabric(text: str, source: str = "input") -> FabricSnapshot:
    """Any supported format (see :func:`detect_format`) as a snapshot; a tool's text gives ports only.

    Raises :class:`ParseError` naming ``source`` when the format is unknown or it holds no port.
    """
    kind = detect_format(text)
    if kind is None:
        raise ParseError(
            f"{source}: not an ibstat, ibstatus, ibv_devinfo, perfquery, sysfs counter dump or fabric "
            "snapshot output (no \"CA '...'\", \"Infiniband device\", 'hca_id:', 'SymbolErrorCounter:' "
            "or '.../infiniband/<dev>/ports/<n>/' line)"
        )
    try:
        if kind == "snapshot":
            snap = parse_snapshot(json.loads(text), source)
        else:
            ports = next(parse for name, _, parse in _DETECTORS if name == kind)(text)
            snap = FabricSnapshot(node=None, taken_at=None, ib_ports=tuple(ports), interfaces=())
    except json.JSONDecodeError as exc:
        raise ParseError(f"{source}: not JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ParseError as exc:
        message = str(exc)
        raise ParseError(message if message.startswith(source) else f"{source}: {message}") from None
    if not snap.ib_ports and not snap.interfaces:
        raise ParseError(f"{source}: the {kind} reading holds no InfiniBand port and no network interface")
    return snap


def parse_ib_text(text: str, source: str = "input") -> list[IbPort]:
    """The InfiniBand ports of any supported format; errors name ``source``."""
    ports = list(parse_fabric(text, source).ib_ports)
    if not ports:
        raise ParseError(f"{source}: holds no InfiniBand/RoCE port")
    return ports


def to_json(snapshot: FabricSnapshot) -> dict[str, object]:
    return snapshot.to_json()
