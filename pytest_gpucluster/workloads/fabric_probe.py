"""Rank side: read every fabric port of this node from sysfs, as plain JSON-able data.

Runs on the node (one rank per node, or ``python -m pytest_gpucluster.workloads.fabric_probe`` under
``ip netns exec`` / ``srun``) and depends on the standard library only. It reads, under a sysfs root
(default ``/sys``):

- every InfiniBand/RoCE port ``class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}``
  and every file in its ``counters/`` and ``hw_counters/``;
- every network interface ``class/net/<if>/{operstate,speed,mtu}`` and every file in ``statistics/``;
- optionally (``qdisc=True``) the interface's queueing disciplines, ``tc -s -j qdisc show dev <if>``.

Values are the files' stripped text; turning them into numbers is the parsers' job
(:func:`pytest_gpucluster.parsers.fabric_ports.parse_snapshot`). A file that is missing or cannot be
read is recorded under ``errors`` with the reason (``speed`` raises EINVAL on a down link or a
virtual device) and never stops the reading.

Why the qdisc drops: which counter grows when a ``tbf`` qdisc drops packets was measured on this
project's VM (kernel 6.18.44, iproute2 6.1.0): two network namespaces joined by a veth pair,
``tc qdisc add dev X root tbf rate 1mbit burst 1kb limit 1kb`` on one end, UDP sent from Python.
With 1200-byte datagrams (larger than the 1 kB bucket) all 851062 sent in 3 s were dropped; with
100-byte ones, 703458 of 706113 were dropped and 2655 let through. The qdisc counted every drop
(``tc -s qdisc``: ``dropped``, and ``overlimits``), while **no file in
``/sys/class/net/X/statistics/`` moved** on either end: ``tx_dropped``, ``tx_errors`` and every other
error counter stayed 0, and ``tx_packets`` grew only by what tbf let through. (The sender's
``/proc/net/snmp`` ``Udp: SndbufErrors`` grew instead: the drop is reported to the socket, not to
the device.) So interface statistics alone miss queue drops, and the reader keeps the root qdisc's
counters. ``tests/integration/test_fabric_netns.py`` repeats the measurement on every run.

Must not import pytest, torch, or anything outside the standard library: it runs where only Python is.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "IB_PORT_ATTRS",
    "NET_ATTRS",
    "node_snapshot",
    "read_interface",
    "read_links",
    "read_qdisc",
    "snapshot",
]

IB_PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
NET_ATTRS = ("operstate", "speed", "mtu")
QDISC_TIMEOUT_S = 10.0


def _why(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return f"{name}: {exc.strerror or exc}"


def _read(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, why it could not be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip(), None
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, _why(exc)


def _read_attrs(base: Path, names: Sequence[str], errors: dict[str, str], where: str = "") -> dict[str, str]:
    """The files ``names`` of ``base``; each one that cannot be read goes to ``errors`` as
    ``<where><name>``."""
    out: dict[str, str] = {}
    for name in names:
        value, why = _read(base / name)
        if why is None and value is not None:
            out[name] = value
        else:
            errors[where + name] = why or "missing"
    return out


def _read_dir(base: Path, group: str, errors: dict[str, str]) -> dict[str, str]:
    """Every regular file of ``base/group``; an absent directory is simply empty (not every driver has one)."""
    folder = base / group
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file())
    except FileNotFoundError:
        return {}
    except OSError as exc:
        errors[group] = _why(exc)
        return {}
    return _read_attrs(folder, names, errors, where=f"{group}/")


def _list(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(folder))
    except OSError:
        return []


def read_ib_ports(sysfs_root: Path) -> dict[str, Any]:
    """``class/infiniband/<dev>/ports/<n>/...`` for every device and port under ``sysfs_root``."""
    devices: dict[str, Any] = {}
    for dev in _list(sysfs_root / "class" / "infiniband"):
        ports: dict[str, Any] = {}
        for port in _list(sysfs_root / "class" / "infiniband" / dev / "ports"):
            base = sysfs_root / "class" / "infiniband" / dev / "ports" / port
            errors: dict[str, str] = {}
            ports[port] = {
                "attrs": _read_attrs(base, IB_PORT_ATTRS, errors),
                "counters": _read_dir(base, "counters", errors),
                "hw_counters": _read_dir(base, "hw_counters", errors),
                "errors": errors,
            }
        devices[dev] = {"ports": ports}
    return devices


def read_qdisc(interface: str, tc: str = "tc", timeout_s: float = QDISC_TIMEOUT_S) -> dict[str, str]:
    """``{"json": <tc output>}`` or ``{"error": <why>}`` for ``tc -s -j qdisc show dev <interface>``."""
    argv = [tc, "-s", "-j", "qdisc", "show", "dev", interface]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return {"error": f"'{tc}' is not installed, so queue drops cannot be read"}
    except subprocess.TimeoutExpired:
        return {"error": f"'{' '.join(argv)}' did not answer within {timeout_s:g} s"}
    if done.returncode != 0:
        return {
            "error": f"'{' '.join(argv)}' exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
        }
    return {"json": done.stdout.strip()}


def _shaped_rate(qdisc_json: str) -> int | None:
    """The root qdisc's rate in bytes/s (``tc -j`` prints ``tbf``'s ``options.rate`` so), if any."""
    try:
        entries = json.loads(qdisc_json)
    except ValueError:
        return None
    for entry in entries if isinstance(entries, list) else ():
        rate = (entry.get("options") or {}).get("rate") if isinstance(entry, dict) else None
        if isinstance(entry, dict) and entry.get("root") and isinstance(rate, int):
            return rate
    return None


def addressed_interfaces() -> set[str]:
    """The interfaces of this machine that hold an IPv4 or IPv6 address, as NCCL takes them
    (``ncclFindInterfaces`` walks ``getifaddrs`` and keeps interfaces with an AF_INET/AF_INET6
    address): IPv6 from ``/proc/net/if_inet6``, IPv4 through ``SIOCGIFADDR`` per interface."""
    import fcntl
    import struct

    named: set[str] = set()
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6:
                named.add(parts[5])
    except OSError:
        pass
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # EADDRNOTAVAIL: no IPv4 address
            named.add(name)
    return named


def read_links(sysfs_root: Path, *, shaping: bool, tc: str = "tc") -> dict[str, dict[str, Any]]:
    """Per network interface but ``lo``: its operstate, its speed in Mb/s (None where the driver
    has none: veth, or a link that is down) and, with ``shaping``, the rate its root qdisc holds it
    to (``tc``; only for the live /sys, whose interfaces are this node's). A link that negotiated
    down or was shaped is a change of environment the regression gate names."""
    links: dict[str, dict[str, Any]] = {}
    addressed = addressed_interfaces() if shaping else None  # only the live /sys is this machine's
    for name in _list(sysfs_root / "class" / "net"):
        if name == "lo":
            continue
        base = sysfs_root / "class" / "net" / name
        speed, _ = _read(base / "speed")
        state, _ = _read(base / "operstate")
        shaped = None
        if shaping:
            qdisc = read_qdisc(name, tc)
            shaped = _shaped_rate(qdisc["json"]) if "json" in qdisc else None
        links[name] = {
            "operstate": state,
            "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
            "shaped_bytes_per_s": shaped,
            "has_address": None if addressed is None else name in addressed,
        }
    return links


def read_interface(sysfs_root: Path, name: str, *, qdisc: bool = False, tc: str = "tc") -> dict[str, Any]:
    base = sysfs_root / "class" / "net" / name
    errors: dict[str, str] = {}
    reading: dict[str, Any] = {
        "attrs": _read_attrs(base, NET_ATTRS, errors),
        "statistics": _read_dir(base, "statistics", errors),
        "errors": errors,
    }
    if qdisc:
        reading["qdisc"] = read_qdisc(name, tc)
    return reading


def snapshot(
    sysfs_root: str | os.PathLike[str] = "/sys",
    *,
    qdisc: bool = False,
    tc: str = "tc",
    node: str | None = None,
    interfaces: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Read every IB port and network interface once; JSON-able, for ``parse_snapshot``.

    ``interfaces`` limits the network interfaces read (default: all); ``qdisc`` also runs
    ``tc -s -j qdisc show`` per interface (argv only, never a shell); ``node`` defaults to the
    host name.
    """
    root = Path(sysfs_root)
    names = _list(root / "class" / "net") if interfaces is None else list(interfaces)
    tc_path = shutil.which(tc) or tc
    return {
        "node": node or socket.gethostname(),
        "taken_at": time.time(),
        "root": os.geteuid() == 0,  # only root can clear the port counters (a saturated one stays so)
        "sysfs_root": str(root),
        "infiniband": read_ib_ports(root),
        "net": {name: read_interface(root, name, qdisc=qdisc, tc=tc_path) for name in names},
    }


def node_snapshot(ctx: Any) -> dict[str, Any]:
    """The workload (``pytest_gpucluster.workloads.fabric_probe:node_snapshot``, one rank per node):
    this node's reading, named by the rank's host name. Options: ``sysfs_root``, ``qdisc``."""
    options = ctx.options
    return snapshot(
        str(options.get("sysfs_root", "/sys")), qdisc=bool(options.get("qdisc", True)), node=ctx.host
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sysfs-root", default="/sys")
    parser.add_argument("--qdisc", action="store_true", help="also read 'tc -s -j qdisc show' per interface")
    parser.add_argument("--node", help="name of this node in the reading (default: the host name)")
    parser.add_argument("--interface", action="append", help="read only this interface (repeatable)")
    args = parser.parse_args(argv)
    data = snapshot(args.sysfs_root, qdisc=args.qdisc, node=args.node, interfaces=args.interface)
    json.dump(data, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
