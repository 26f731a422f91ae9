"""Which fabric ports count: NCCL's name lists (``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``) over one
reading's ports, as ``checks/fabric.py`` judges them (its module docstring says how they are picked).

Pure: no pytest, no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, IbPort, NetInterface
from pytest_gpucluster.profiles.schema import FabricSection

__all__ = ["NCCL_DEFAULT_INTERFACES", "UP_STATES", "NameSelection", "Port", "counted_ports"]

Port = IbPort | NetInterface
NCCL_DEFAULT_INTERFACES = "^docker,lo"
"""What NCCL falls back to when no interface name starts with ``ib`` (``ncclFindInterfaces``)."""
UP_STATES = ("up",)


@dataclass(frozen=True, slots=True)
class NameSelection:
    """A list in NCCL's syntax (``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``): prefixes unless it starts
    with ``=``, the complement with ``^`` (``^=`` both); an IB entry may end in ``:port``."""

    text: str
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]

    @classmethod
    def parse(cls, text: str) -> NameSelection:
        body = text.strip()
        exclude = body.startswith("^")
        body = body.removeprefix("^")
        exact = body.startswith("=")
        entries: list[tuple[str, int | None]] = []
        for item in body.removeprefix("=").split(","):
            name, _, port = item.strip().partition(":")
            if name:
                entries.append((name, int(port) if port.strip().isdigit() else None))
        return cls(text.strip(), exclude, exact, tuple(entries))

    def selects(self, name: str, port: int | None = None) -> bool:
        def hit(entry: tuple[str, int | None]) -> bool:
            wanted, wanted_port = entry
            named = name == wanted if self.exact else name.startswith(wanted)
            return named and (wanted_port is None or port is None or wanted_port == port)

        return any(hit(e) for e in self.entries) != self.exclude


def _selections(section: FabricSection, env: Mapping[str, str]) -> tuple[NameSelection | None, str | None]:
    ib = section.ib_devices or env.get("NCCL_IB_HCA") or None
    interfaces = section.interfaces or env.get("NCCL_SOCKET_IFNAME") or env.get("GLOO_SOCKET_IFNAME") or None
    return (NameSelection.parse(ib) if ib else None), interfaces


def counted_ports(
    snapshot: FabricSnapshot, section: FabricSection, env: Mapping[str, str]
) -> tuple[list[Port], str]:
    """The ports of one reading that count, and a sentence saying how they were chosen."""
    ib, interfaces = _selections(section, env)
    ports: list[Port] = [p for p in snapshot.ib_ports if ib is None or ib.selects(p.device, p.port)]
    up = [i for i in snapshot.interfaces if (i.operstate or "").lower() in UP_STATES]
    if interfaces is None:
        interfaces = "ib" if any(i.name.startswith("ib") for i in up) else NCCL_DEFAULT_INTERFACES
        how = f"interfaces as NCCL picks them ({interfaces!r})"
    else:
        how = f"interfaces {interfaces!r}"
    chosen = NameSelection.parse(interfaces)
    ports += [i for i in up if chosen.selects(i.name)]
    how += f", IB devices {ib.text!r}" if ib else ", every IB device"
    return ports, how + ", up in the first reading"
