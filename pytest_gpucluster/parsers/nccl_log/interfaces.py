"""Network interfaces and HCAs NCCL names: bootstrap/socket interfaces, IB devices and link layers.

One job: read the ``Bootstrap : Using ...``, ``NET/IB : Using [0]mlx5_0:1/RoCE``, ``NET/Socket :
Using ...``, OOB and plugin interface lines into ``(kind, value, note)`` items. Imports only the
standard library.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["interface_items"]

_IB_DEVICES = re.compile(r"NET/IB ?: Using (\[\d+\].*?)(?:;|$)")
_IB_DEVICE = re.compile(r"\[\d+\]\s?([\w.-]+):(\d+)/(IB|RoCE)")
_IB_OLD_DEVICE = re.compile(r"^NET/IB: \[\d+\] ([\w.-]+):(\d+)/(IB|RoCE)")
_IP_IFACES = re.compile(r"^(Bootstrap|NET/Socket|NET) ?: Using (?:interface )?(.*)$")
_IP_IFACE = re.compile(r"(?:\[\d+\])?([^\s:\[\]]+):\S*<\d+>")
_OOB = re.compile(r"\bOOB ([^\s:]+):|NET/IB : Using interface (\S+) for sideband")
_OTHER_IFACE = re.compile(r"NET/OFI GUID of (\S+):|SHARP rank \d+/\d+ initialized on (\S+)")
_IB_UNAVAILABLE = re.compile(
    r"NET/IB ?: No device found|Failed to open libibverbs|NCCL_IB_DISABLE set by environment to 1"
)
_WORTH_A_LOOK = re.compile(r"Using|OOB|NET/|SHARP rank|ibverbs|IB_DISABLE")

Item = tuple[str, object, str]  # (kind, value, note)


def interface_items(msg: str) -> Iterator[Item]:
    """What one message says about interfaces.

    Kinds: ``interface`` (name, note = role: bootstrap, socket, ib, oob, ofi, sharp), ``link_layer``
    ((hca:port, "IB" | "RoCE")), and the flags ``ib_devices``, ``socket_init``, ``ib_unavailable``
    that let the reader tell a socket fallback from a socket choice.
    """
    if not _WORTH_A_LOOK.search(msg):
        return
    if m := _IB_DEVICES.search(msg):
        devices = _IB_DEVICE.findall(m.group(1))
        if devices:
            yield "ib_devices", True, ""
        for hca, port, layer in devices:
            yield "interface", f"{hca}:{port}", "ib"
            yield "link_layer", (f"{hca}:{port}", layer), ""
    elif m := _IB_OLD_DEVICE.search(msg):
        yield "ib_devices", True, ""
        yield "interface", f"{m.group(1)}:{m.group(2)}", "ib"
        yield "link_layer", (f"{m.group(1)}:{m.group(2)}", m.group(3)), ""
    elif m := _IP_IFACES.search(msg):
        role = "bootstrap" if m.group(1) in ("Bootstrap", "NET") else "socket"
        if m.group(1) == "NET/Socket":
            yield "socket_init", True, ""
        for name in _IP_IFACE.findall(m.group(2)):
            yield "interface", name, role
    if m := _OOB.search(msg):
        yield "interface", m.group(1) or m.group(2), "oob"
    if m := _OTHER_IFACE.search(msg):
        yield "interface", m.group(1) or m.group(2), "ofi" if m.group(1) else "sharp"
    if _IB_UNAVAILABLE.search(msg):
        yield "ib_unavailable", True, ""
