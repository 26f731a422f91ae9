"""Network namespaces standing in for cluster nodes on one Linux machine (root and iproute2).

``with netns_testbed(4, controller=True) as bed:`` makes, per FEASIBILITY §1 (variant B):

- a **switch** namespace holding a bridge, so the host's own network is never touched;
- N **node** namespaces ``<tag>n<i>``, each on the bridge through a veth pair (its end named
  ``gpc0``, address ``<subnet>.<i+1>/24``, ``lo`` up), with ``/etc/netns/<ns>/hosts`` naming every
  node, which ``ip netns exec`` mounts over /etc/hosts; the ``netns`` remote-exec preset
  (``bed.remote_exec``) gives each its own hostname, the namespace's name;
- optionally a **controller** namespace ``<tag>ctl`` (``<subnet>.254``), a login node to run
  pytest from (``bed.exec_argv(bed.controller, [...])``).

Each node's link can be throttled with ``tc tbf`` in both directions and the rate changed while
jobs run (`NetnsTestbed.set_rate`); `NetnsTestbed.counters` reads its interface counters.
``netem`` is not available on the CI machines, so delay cannot be injected, only bandwidth.

Names carry the pid and the pytest-xdist worker, so runs side by side never collide;
`NetnsTestbed.close` (called by the context manager, in a ``finally``) stops every process
still inside the namespaces (they are this testbed's) and deletes them, which also removes
the veth pairs. Where namespaces cannot be made, `NetnsUnavailable` says why, for a test to
skip with. Commands are argv lists; nothing goes through a shell but the preset's fixed script.

Standard library only; importable by tests and benchmarks alike. No pytest.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.launch.base import REMOTE_PRESETS, RemoteExec

__all__ = [
    "INTERFACE",
    "LinkCounters",
    "NetnsNode",
    "NetnsTestbed",
    "NetnsUnavailable",
    "TestbedError",
    "create_testbed",
    "netns_testbed",
    "parse_rate",
    "tbf_args",
    "unavailable_reason",
]

INTERFACE = "gpc0"
ETC_NETNS = Path("/etc/netns")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)?\s*$", re.IGNORECASE)
_RATE_SCALE = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_counter = itertools.count()


class NetnsUnavailable(RuntimeError):
    """Namespaces (or tc) cannot be used here; the message is the reason, for a skip."""


class TestbedError(RuntimeError):
    """A command that builds or changes the testbed failed; the message quotes it."""

    __test__ = False  # not a pytest test class, despite the name


def unavailable_reason(*, shaping: bool = False) -> str | None:
    """Why namespaces cannot stand in for nodes here, or None. ``shaping``: tc is needed too."""
    tools = ("ip", "unshare", "tc") if shaping else ("ip", "unshare")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"'{missing[0]}' is not installed (iproute2/util-linux), so network namespaces cannot stand in for nodes"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "network namespaces need root (ip netns add), and this runs as an ordinary user"
    return None


def parse_rate(rate: str | int) -> int:
    """``"100mbit"``, ``"1.5gbit"``, ``"800kbit"`` or an int (bit/s) -> bit/s.

    Only bit units: tc reads ``100mbps`` as megaBYTES per second, an easy factor-8 mistake.
    """
    if isinstance(rate, int) and not isinstance(rate, bool):
        value = rate
    else:
        match = _RATE.match(str(rate))
        if match is None:
            raise ValueError(
                f"link rate {rate!r} is not a rate in bits per second such as '100mbit', '2.5gbit' or 800000"
            )
        value = int(float(match.group(1)) * _RATE_SCALE[(match.group(2) or "bit").lower()])
    if value <= 0:
        raise ValueError(f"link rate {rate!r} must be positive")
    return value


def tbf_args(rate: str | int, *, burst: int | None = None, limit: int | None = None) -> list[str]:
    """``tbf rate R burst B latency 100ms``. By default a 5 ms bucket (at least 32 KiB, so a
    full-size frame always fits) and at most 100 ms of queue; ``burst``/``limit`` (bytes) set
    the bucket and the queue instead, e.g. a tiny queue that overflows on purpose."""
    bits = parse_rate(rate)
    bucket = max(bits // 8 // 200, 32 * 1024) if burst is None else burst
    queue = ["latency", "100ms"] if limit is None else ["limit", str(limit)]
    return ["tbf", "rate", f"{bits}bit", "burst", str(bucket), *queue]


def default_tag() -> str:
    """Unique per xdist worker, process and testbed: ``g<worker>p<pid>c<k>``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = worker[2:] if worker[2:].isdigit() else "m"
    return f"g{index}p{os.getpid() % 100000}c{next(_counter)}"


@dataclass(frozen=True, slots=True)
class NetnsNode:
    name: str
    """The namespace, and the node's hostname."""
    address: str
    switch_port: str
    """Its veth end inside the switch namespace (where traffic towards the node is shaped)."""
    interface: str = INTERFACE


@dataclass(frozen=True, slots=True)
class LinkCounters:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


def _run(argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{' '.join(argv)} failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise TestbedError(f"{' '.join(argv)} failed: {said}")
    return done


class NetnsTestbed:
    """Nodes (and a controller) on one bridge; see the module docstring. Build with `create_testbed`."""

    def __init__(self, tag: str, subnet: str) -> None:
        self.tag = tag
        self.subnet = subnet
        self.switch = f"{tag}sw"
        self.nodes: tuple[NetnsNode, ...] = ()
        self.controller: NetnsNode | None = None
        self.rates: dict[str, int | None] = {}
        self._namespaces: list[str] = []
        self._etc_dirs: list[Path] = []

    # ------------------------------------------------------------------ using it

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes)

    @property
    def remote_exec(self) -> RemoteExec:
        """The ``netns`` preset: ``ip netns exec <ns> unshare --uts`` with the node's hostname."""
        return RemoteExec.parse("netns")

    @property
    def remote_exec_template(self) -> tuple[str, ...]:
        """The same as an argv template (``--remote-exec``); a template does not know the
        namespaces share this machine's /proc, so the launch treats them as truly remote."""
        return REMOTE_PRESETS["netns"]

    def node(self, name: str | NetnsNode) -> NetnsNode:
        wanted = name.name if isinstance(name, NetnsNode) else name
        for node in (*self.nodes, *((self.controller,) if self.controller else ())):
            if node.name == wanted:
                return node
        raise KeyError(f"no node {wanted!r} in testbed {self.tag} (nodes: {', '.join(self.names)})")

    def exec_argv(self, node: str | NetnsNode, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``node`` with its hostname, as the launcher runs agents there."""
        return self.remote_exec.wrap(self.node(node).name, list(argv), {})

    def hostfile_text(self, slots: int = 1) -> str:
        """A DeepSpeed-style hostfile naming the nodes."""
        return "".join(f"{name} slots={slots}\n" for name in self.names)

    def set_rate(
        self,
        node: str | NetnsNode,
        rate: str | int | None,
        *,
        burst: int | None = None,
        limit: int | None = None,
    ) -> None:
        """Throttle ``node``'s link to ``rate`` in both directions (None: no limit), with `tbf_args`'
        ``burst`` and ``limit``. Works while traffic flows: ``tc qdisc replace`` swaps the queue."""
        target = self.node(node)
        ends = [(target.name, target.interface), (self.switch, target.switch_port)]
        for namespace, device in ends:
            if rate is None:
                if self.rates.get(target.name) is not None:
                    _run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"])
            else:
                shape = tbf_args(rate, burst=burst, limit=limit)
                _run(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", *shape])
        self.rates[target.name] = None if rate is None else parse_rate(rate)

    def set_link(self, node: str | NetnsNode, *, up: bool) -> None:
        """Cut (``up=False``) or restore ``node``'s link at the switch: the node keeps its address
        and can still be started through the remote-exec prefix, but no packet reaches it, as
        with a pulled cable or a dead switch port."""
        target = self.node(node)
        _run(["ip", "-n", self.switch, "link", "set", target.switch_port, "up" if up else "down"])

    def counters(self, node: str | NetnsNode) -> LinkCounters:
        """The byte and packet counters of ``node``'s interface."""
        target = self.node(node)
        done = _run(["ip", "-n", target.name, "-s", "-j", "link", "show", "dev", target.interface])
        stats = json.loads(done.stdout)[0]["stats64"]
        return LinkCounters(
            rx_bytes=int(stats["rx"]["bytes"]),
            tx_bytes=int(stats["tx"]["bytes"]),
            rx_packets=int(stats["rx"]["packets"]),
            tx_packets=int(stats["tx"]["packets"]),
        )

    # ------------------------------------------------------------------ building and removing it

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])  # a node's own address is reached over lo

    def _attach(self, name: str, address: str) -> NetnsNode:
        stem = uuid.uuid4().hex[:8]
        node_end, switch_end = f"v{stem}a", f"v{stem}b"  # interface names stay under 15 characters
        _run(["ip", "link", "add", node_end, "type", "veth", "peer", "name", switch_end])
        _run(["ip", "link", "set", node_end, "netns", name])
        _run(["ip", "link", "set", switch_end, "netns", self.switch])
        _run(["ip", "-n", name, "link", "set", node_end, "name", INTERFACE])
        _run(["ip", "-n", name, "addr", "add", f"{address}/24", "dev", INTERFACE])
        _run(["ip", "-n", name, "link", "set", INTERFACE, "up"])
        _run(["ip", "-n", self.switch, "link", "set", switch_end, "master", "br0"])
        _run(["ip", "-n", self.switch, "link", "set", switch_end, "up"])
        return NetnsNode(name=name, address=address, switch_port=switch_end)

    def _build(self, count: int, controller: bool) -> None:
        try:
            self._add_namespace(self.switch)
        except TestbedError as exc:
            raise NetnsUnavailable(f"network namespaces cannot be created here ({exc})") from None
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        nodes = []
        for i in range(count):
            name = f"{self.tag}n{i}"
            self._add_namespace(name)
            nodes.append(self._attach(name, f"{self.subnet}.{i + 1}"))
        self.nodes = tuple(nodes)
        if controller:
            name = f"{self.tag}ctl"
            self._add_namespace(name)
            self.controller = self._attach(name, f"{self.subnet}.254")
        everyone = [*self.nodes, *((self.controller,) if self.controller else ())]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.name}\n" for n in everyone)
        for node in everyone:
            etc = ETC_NETNS / node.name
            etc.mkdir(parents=True, exist_ok=True)
            self._etc_dirs.append(etc)
            (etc / "hosts").write_text(hosts)

    def close(self) -> None:
        """Stop what still runs inside the namespaces, delete them and their /etc/netns files."""
        for namespace in self._namespaces:
            done = subprocess.run(
                ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
            )
            for pid in done.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for namespace in reversed(self._namespaces):  # deleting a namespace removes its veth ends
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        for etc in self._etc_dirs:
            shutil.rmtree(etc, ignore_errors=True)
        self._namespaces.clear()
        self._etc_dirs.clear()

    def __enter__(self) -> NetnsTestbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_testbed(
    nodes: int,
    *,
    controller: bool = False,
    rates: dict[int, str | int] | None = None,
    tag: str | None = None,
    subnet: str = "10.77.0",
) -> NetnsTestbed:
    """Build a testbed of ``nodes`` nodes; ``rates``: node index -> initial link rate.

    Raises `NetnsUnavailable` when namespaces (or, with ``rates``, tc) cannot be used here, and
    `TestbedError` when a step fails later; either way nothing is left behind.
    """
    if not 1 <= nodes <= 250:
        raise ValueError(f"a testbed has 1 to 250 nodes, not {nodes}")
    reason = unavailable_reason(shaping=bool(rates))
    if reason is not None:
        raise NetnsUnavailable(reason)
    bed = NetnsTestbed(tag or default_tag(), subnet)
    try:
        bed._build(nodes, controller)
        for index, rate in (rates or {}).items():
            bed.set_rate(bed.nodes[index], rate)
    except BaseException:
        bed.close()
        raise
    return bed


@contextlib.contextmanager
def netns_testbed(nodes: int, **kwargs: object) -> Iterator[NetnsTestbed]:
    """`create_testbed` as a context manager: the testbed is removed when the block ends."""
    bed = create_testbed(nodes, **kwargs)  # type: ignore[arg-type]
    try:
        yield bed
    finally:
        bed.close()
