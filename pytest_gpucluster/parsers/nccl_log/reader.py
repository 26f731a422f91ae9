"""Read NCCL messages into per-source accumulators: one per ``host:pid[dev]``, one for prefix-less lines.

One job: turn :class:`~.records.Record` values into facts on an :class:`Accumulator`, which
``summary`` freezes and compares. Imports only the standard library and this package's modules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.parsers.nccl_log.interfaces import interface_items
from pytest_gpucluster.parsers.nccl_log.model import Connection, Evidence, Fact, RankFacts
from pytest_gpucluster.parsers.nccl_log.plugins import PluginLines, read_plugin_line
from pytest_gpucluster.parsers.nccl_log.records import Key, Record
from pytest_gpucluster.parsers.nccl_log.severity import ERROR_LINE, benign_reason, is_torch_nccl_deprecation
from pytest_gpucluster.parsers.nccl_log.transports import GdrLines, decide_gdr, nvls_line, read_connection

__all__ = ["Accumulator", "read_records"]

# The whole version or none: a line cut inside "2.27.3+cuda12.9" must not yield "2.27" or "+cuda12".
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+(?:\+cuda\w+(?:\.\w+)*)?)(?=$|[\s,;:)\]'\"]|\.(?:\s|$))")
_CUDA_DRIVER = re.compile(r"\bcudaDriverVersion (\d+)|NET/OFI Using CUDA driver version (\d+)")
_NETWORK = re.compile(r"^Using (?:network|internal Network) (\S.*?)\s*$")
_RANKS = re.compile(r"\brank (\d+) n[rR]anks (\d+)|^nranks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,;(]+)")
_PROVIDER_FILTER = re.compile(r"NET/OFI Setting provider_filter to ([^\s,;(]+)")
_ENV = re.compile(r"^(NCCL_\w+) set (?:by environment )?to (.*?)\.?\s*$")


@dataclass
class Accumulator:
    """Mutable facts for one source while records stream in; first occurrence wins."""

    host: str | None = None
    pid: int | None = None
    device: int | None = None
    one: dict[str, Fact] = field(default_factory=dict)
    many: dict[str, dict[Any, Fact]] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)
    plugin: PluginLines = field(default_factory=PluginLines)
    gdr: GdrLines = field(default_factory=GdrLines)
    warnings: list[Fact] = field(default_factory=list)
    errors: list[Fact] = field(default_factory=list)
    hits: int = 0  # facts offered so far, to tell whether a prefix-less line said anything

    def set(self, name: str, value: Any, ev: Evidence, note: str = "") -> None:
        self.hits += 1
        self.one.setdefault(name, Fact(value, ev, note))

    def add(self, kind: str, value: Any, ev: Evidence, note: str = "") -> None:
        self.hits += 1
        self.many.setdefault(kind, {}).setdefault(value, Fact(value, ev, note))

    def seen(self, kind: str) -> tuple[Fact, ...]:
        return tuple(self.many.get(kind, {}).values())

    def absorb(self, other: Accumulator) -> None:
        """Take in another source's facts (the same process, named twice); the earlier line wins."""
        for name, fact in other.one.items():
            mine = self.one.get(name)
            if mine is None or fact.evidence.line_no < mine.evidence.line_no:
                self.one[name] = fact
        for kind, facts in other.many.items():
            for value, fact in facts.items():
                self.many.setdefault(kind, {}).setdefault(value, fact)
        self.connections = sorted([*self.connections, *other.connections], key=lambda c: c.evidence.line_no)
        for name in ("warnings", "errors"):
            merged = [*getattr(self, name), *getattr(other, name)]
            setattr(self, name, sorted(merged, key=lambda f: f.evidence.line_no))
        self.plugin.absorb(other.plugin)
        self.gdr.absorb(other.gdr)
        self.hits += other.hits

    def freeze(self, key: str) -> RankFacts:
        o = self.one.get
        transports = {}
        for conn in self.connections:
            transports.setdefault(conn.transport, Fact(conn.transport, conn.evidence))
        return RankFacts(
            key=key,
            host=self.host,
            pid=self.pid,
            device=self.device,
            rank=o("rank"),
            nccl_version=o("nccl_version"),
            cuda_driver_version=o("cuda_driver") or o("cuda_driver_ofi"),
            network=self._network(),
            net_plugin=self.plugin.plugin(),
            net_plugin_error=self.plugin.error(),
            provider=o("provider") or o("provider_filter"),
            gdr=decide_gdr(self.connections, self.gdr),
            nvls=o("nvls_support") or (o("nvls_used") if o("nvls_used") and o("nvls_used").value else None),
            nvls_used=self._nvls_used(),
            nranks=self._max("nranks"),
            nnodes=self._max("nnodes"),
            local_ranks=self._max("local_ranks"),
            transports=tuple(transports.values()),
            connections=tuple(self.connections),
            interfaces=self.seen("interface"),
            link_layers=self.seen("link_layer"),
            environment=self.seen("env"),
            warnings=tuple(self.warnings),
            errors=tuple(self.errors),
        )

    def _max(self, kind: str) -> Fact | None:
        return max(self.seen(kind), key=lambda f: f.value, default=None)

    def _nvls_used(self) -> Fact | None:
        used = next((c for c in self.connections if c.transport == "NVLS"), None)
        if used:
            return Fact(True, used.evidence, "NVLS set up")
        support = self.one.get("nvls_support")
        if support is not None and not support.value:
            return Fact(False, support.evidence, "NVLS not supported")
        return self.one.get("nvls_used")  # "0 nvls channels", or None

    def _network(self) -> Fact | None:
        o = self.one.get
        if o("network"):
            return o("network")
        net = next((c for c in self.connections if c.family == "NET"), None)
        if net:
            return Fact(net.transport.split("/")[1], net.evidence, "from the channel lines")
        if o("ib_devices"):
            return Fact("IB", o("ib_devices").evidence, "from the NET/IB init line")
        if o("socket_init") and o("ib_unavailable"):
            return Fact("Socket", o("socket_init").evidence, "from the NET/Socket init line, IB unavailable")
        return None


def read_message(acc: Accumulator, msg: str, ev: Evidence) -> None:
    """Every fact one NCCL message can state, recorded on its source.

    Each pattern is tried only when a plain substring says it could match: most lines state nothing,
    and a multi-rank log runs to megabytes.
    """
    if "ersion" in msg and (m := _CUDA_DRIVER.search(msg)):
        acc.set("cuda_driver" if m.group(1) else "cuda_driver_ofi", int(m.group(1) or m.group(2)), ev)
    if msg.startswith("Using ") and (m := _NETWORK.search(msg)):
        acc.set("network", m.group(1), ev)
    if msg.startswith("NCCL_") and (m := _ENV.search(msg)):
        acc.add("env", (m.group(1), m.group(2)), ev)
    if "anks" in msg:
        _read_ranks(acc, msg, ev)
    if conn := read_connection(msg, ev):
        acc.hits += 1
        acc.connections.append(conn)
    if said := nvls_line(msg, ev):
        kind, fact = said
        if kind == "used" and fact.value:
            acc.connections.append(Connection("NVLS", ev))
        name = "nvls_support" if kind == "support" else "nvls_used"
        acc.set(name, fact.value, ev, fact.note)
    if acc.gdr.read(msg, ev):
        acc.hits += 1
    if "NET/OFI" in msg:
        if m := _PROVIDER.search(msg):
            acc.set("provider", m.group(1), ev)
        if m := _PROVIDER_FILTER.search(msg):
            acc.set("provider_filter", m.group(1), ev, "from provider_filter")
    if ("lugin" in msg or "aws-ofi-nccl" in msg or "libnccl-net" in msg) and read_plugin_line(
        acc.plugin, msg, ev
    ):
        acc.hits += 1
    for kind, value, note in interface_items(msg):
        if kind in ("interface", "link_layer"):
            acc.add(kind, value, ev, note)
        else:
            acc.set(kind, value, ev)


def _read_ranks(acc: Accumulator, msg: str, ev: Evidence) -> None:
    if m := _RANKS.search(msg):
        if m.group(1) is not None:
            acc.set("rank", int(m.group(1)), ev)
        acc.add("nranks", int(m.group(2) or m.group(3)), ev)
    if m := _NNODES.search(msg):
        acc.add("nnodes", int(m.group(1)), ev)
    if m := _LOCAL_RANKS.search(msg):
        acc.add("local_ranks", int(m.group(1)), ev)


def read_records(records: Iterable[Record]) -> tuple[dict[Key | None, Accumulator], int]:
    """Accumulators per source and the number of records that were NCCL's."""
    sources: dict[Key | None, Accumulator] = {}
    nccl_lines = 0
    for rec in records:
        ev = Evidence(rec.line_no, rec.text)
        version = _VERSION.search(rec.line) if "NCCL version" in rec.line else None
        if rec.level is None and version is None:
            # Not an NCCL line by its shape; a log stripped of every prefix still says things, though.
            acc = sources.get(None) or Accumulator()
            before, problems = acc.hits, len(acc.errors) + len(acc.warnings)
            read_message(acc, rec.msg, ev)
            nccl_lines += acc.hits > before
            _read_unshaped_problem(acc, rec.line, ev)
            if acc.hits > before or len(acc.errors) + len(acc.warnings) > problems:
                sources[None] = acc
            continue
        nccl_lines += 1
        acc = sources.get(rec.key)
        if acc is None:
            acc = sources[rec.key] = Accumulator(*rec.key) if rec.key else Accumulator()
        if version:
            acc.set("nccl_version", version.group(1), ev)
        if rec.level in ("WARN", "ERROR", "ABORT"):
            fact = Fact(rec.msg.strip(), ev, rec.src or "")
            benign = rec.level == "WARN" and benign_reason(fact.value, rec.src)
            (acc.warnings if benign else acc.errors).append(fact)
        elif ("rror" in rec.msg or "ailure" in rec.msg) and ERROR_LINE.search(rec.msg):
            acc.errors.append(Fact(rec.msg.strip(), ev))
        read_message(acc, rec.msg, ev)
    return sources, nccl_lines


def _read_unshaped_problem(acc: Accumulator, line: str, ev: Evidence) -> None:
    if ("rror" in line or "ailure" in line or "tim" in line) and ERROR_LINE.search(line):
        acc.errors.append(Fact(line.strip(), ev))
    elif is_torch_nccl_deprecation(line):
        acc.warnings.append(Fact(line.strip(), ev, "PyTorch"))
