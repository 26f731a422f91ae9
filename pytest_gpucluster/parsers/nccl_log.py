"""Facts from ``NCCL_DEBUG=INFO`` output: version, network, net plugin, transports, GDR, NVLS, ranks, WARNs.

Text in, dataclasses out, no I/O; imports only the standard library and ``pytest_gpucluster.errors``.

Real logs are messy, and the parser takes them as they come: one rank or many interleaved; with the
``host:pid:tid [dev] NCCL INFO`` prefix, with only ``NCCL INFO``, or with nothing at all; behind launcher
or collector prefixes (Open MPI ``[1,3]<stdout>:``, pdsh ``host: ``, ``[155]`` labels, timestamps, the
CloudWatch ``| time | message`` table); NCCL 2.0 to 2.27 wordings (``INFO``/``WARN`` without ``NCCL``
in old releases); and cut off anywhere (a last line with no line end is dropped as cut mid-write). A
line it does not recognise is skipped, never an error.

Every fact keeps the line it came from (:class:`Evidence`), so an acceptance test can quote the line that
contradicts its expectation. Facts are kept per rank (:class:`RankFacts`, one per ``host:pid[dev]``) so
that :func:`disagreements` can name the rank that loaded another plugin or fell back to sockets.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from pytest_gpucluster.errors import ParseError

__all__ = [
    "Disagreement",
    "Evidence",
    "Fact",
    "Facts",
    "NcclLog",
    "NetPlugin",
    "RankFacts",
    "disagreements",
    "parse_nccl_log",
    "to_json",
]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Where a fact was read: the 1-based line number and the line as it appeared in the input."""

    line_no: int
    text: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.text.strip()}"


@dataclass(frozen=True, slots=True)
class Fact:
    """One value read from the log, with the line that says it.

    ``note`` says how the value was read when it was inferred rather than stated ("from the channel
    lines"), an interface's role ("bootstrap", "ib", "oob"), or where NCCL printed a WARN ("proxy.cc:1485").
    """

    value: Any
    evidence: Evidence
    note: str = ""


@dataclass(frozen=True, slots=True)
class NetPlugin:
    """An external NCCL net plugin that loaded: project name, its own version, NCCL plugin API."""

    name: str
    version: str | None = None
    api: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "version": self.version, "api": self.api}


_SCALARS = (
    "nccl_version",
    "cuda_driver_version",
    "network",
    "net_plugin",
    "net_plugin_error",
    "provider",
    "gdr",
    "nvls",
)
_COUNTS = ("nranks", "nnodes", "local_ranks")  # the largest communicator wins: sub-communicators are smaller
_SETS = ("transports", "interfaces", "link_layers")  # distinct values, each with its first line
_EVENTS = ("warnings", "errors")  # every occurrence, in log order


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What NCCL said, each value with its line; ``None`` or empty where the log does not say."""

    nccl_version: Fact | None = None  # "2.27.3+cuda12.9"
    cuda_driver_version: Fact | None = None  # 13000
    network: Fact | None = None  # as in "Using network X": "IB", "Socket", "Libfabric", "IBext_v8"...
    net_plugin: Fact | None = None  # a NetPlugin
    net_plugin_error: Fact | None = None  # why no external net plugin loaded
    provider: Fact | None = None  # libfabric provider: "efa"
    gdr: Fact | None = None  # GPUDirect RDMA used on the network path
    nvls: Fact | None = None  # NVLS multicast (NVLink SHARP) support
    nranks: Fact | None = None
    nnodes: Fact | None = None
    local_ranks: Fact | None = None
    transports: tuple[Fact, ...] = ()  # "P2P/CUMEM", "SHM", "NET/IB/GDRDMA", "NVLS", "CollNet/SHARP"...
    interfaces: tuple[Fact, ...] = ()  # "eth0", "mlx5_0:1"; note: the role (bootstrap, socket, ib, oob...)
    link_layers: tuple[Fact, ...] = ()  # (hca, "IB" | "RoCE")
    warnings: tuple[Fact, ...] = ()  # every NCCL WARN; note: where NCCL printed it
    errors: tuple[Fact, ...] = ()  # NCCL error/failure lines (ncclInternalError, "NCCL error in: ...")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFacts(Facts):
    """What one NCCL process/device said about itself. ``key`` is ``host:pid[dev]``."""

    key: str
    host: str | None = None
    pid: int | None = None
    device: int | None = None
    rank: Fact | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank.value} ({self.key})" if self.rank else self.key


@dataclass(frozen=True, slots=True)
class Disagreement:
    """A fact on which ranks differ: the majority value and each rank that says otherwise."""

    fact: str
    majority: Any
    majority_count: int
    odd: tuple[tuple[RankFacts, Fact], ...]

    def __str__(self) -> str:
        others = "; ".join(f"{r.label} says {f.value!r} ({f.evidence})" for r, f in self.odd)
        return f"ranks disagree on {self.fact}: {self.majority_count} say {self.majority!r}; {others}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclLog(Facts):
    """The whole log: facts agreed across ranks, then every rank's own (:func:`disagreements` compares)."""

    per_rank: tuple[RankFacts, ...] = ()  # ranks named by a host:pid:tid prefix, by rank number
    unattributed: RankFacts | None = None  # lines without that prefix
    nccl_lines: int = 0

    def to_json(self) -> dict[str, Any]:
        """One JSON object; ``null`` for what the log does not say, WARNs and errors de-duplicated."""
        out: dict[str, Any] = {name: getattr(self, name) and getattr(self, name).value for name in _SCALARS}
        out["net_plugin"] = out["net_plugin"] and out["net_plugin"].to_json()
        out.update({name: getattr(self, name) and getattr(self, name).value for name in _COUNTS})
        out["transports"] = [f.value for f in self.transports]
        out["interfaces"] = [f.value for f in self.interfaces]
        out["link_layers"] = sorted({f.value[1] for f in self.link_layers})
        out.update({name: list(dict.fromkeys(f.value for f in getattr(self, name))) for name in _EVENTS})
        out["disagreements"] = [str(d) for d in disagreements(self)]
        return out


# --- line shapes --------------------------------------------------------------------------------------
_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# A leading timestamp, bare, bracketed or in a CloudWatch table cell: "  | 2025-05-16T16:39:51.208-07:00 | ".
_LEADING_TS = re.compile(rf"^\s*(?:\|\s*)?\[?{_TS}\]?\s*(?:\|\s*)?")
# [dev] [file.cc:123] [NCCL] LEVEL message -- searched anywhere, so launcher prefixes don't matter --
# and the host:pid:tid just before it, when there is one.
_HEAD = re.compile(
    r"\[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?(?:NCCL )?(?P<level>INFO|WARN|TRACE|ERROR|ABORT)\b ?(?P<msg>.*)$"
)
_HOST_PID_TID = re.compile(r"([^\s:\[\]|]+):(\d+):(\d+) $")
# Prefix stripped down to "NCCL INFO ..." or "file.cc:12 NCCL WARN ..."; or an old "socket.h:344 WARN ...".
_BARE = re.compile(
    r"(?:^|\s)(?:(?P<src>[\w./-]+\.\w+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE) ?(?P<msg>.*)$"
    r"|^(?P<src2>[\w./-]+\.(?:cc|cu|c|h|cpp|hpp):\d+) (?P<level2>WARN|INFO) (?P<msg2>.*)$"
)
# The whole version or none: a line cut inside "2.27.3+cuda12.9" must not yield "2.27" or "+cuda12".
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+(?:\+cuda\d+(?:\.\d+)*)?)(?=$|[\s,;:)\]'\"]|\.(?:\s|$))")
_ERROR = re.compile(r"\bNCCL (?:error|failure)\b|\bnccl[A-Z]\w*Error\b|\bCuda failure\b|\bDistBackendError\b")

# --- message shapes -----------------------------------------------------------------------------------
_CUDA_DRIVER = re.compile(r"\bcudaDriverVersion (\d+)|NET/OFI Using CUDA driver version (\d+)")
_NETWORK = re.compile(r"^Using (?:network|internal Network) (\S.*?)\s*$")
_RANKS = re.compile(r"\brank (\d+) n[rR]anks (\d+)|^nranks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
_VIA = re.compile(r"^(?:Channel|Ring|Tree|CollNet|NVLS)\b.*?\bvia (\S.*?)\s*$")
_NVLS_CHANNELS = re.compile(r"\b(\d+) nvls channels\b")
_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available")
_GDR_ON = re.compile(r"\bGDR 1\b|GPU Direct RDMA Enabled")
_GDR_OFF = re.compile(r"\bGDR 0\b|GPU Direct RDMA Disabled|disabling GDR|GDR not supported")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,;(]+)")
_PROVIDER_FILTER = re.compile(r"NET/OFI Setting provider_filter to ([^\s,;(]+)")
_OFI_VERSION = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_LOADED_PLUGIN = re.compile(r"Loaded net plugin (.+?)(?: v\d+)? \((v\d+)\)")
_PLUGIN_PATH = re.compile(r"Plugin Path : (\S+\.so\S*)")
_EXTERNAL_LOADED = re.compile(r"Successfully loaded external plugin (\S+)")
_PLUGIN_FAILED = re.compile(
    r"NET/Plugin ?: (?:No plugin found|Plugin load|dlerror=|Could not find: libnccl-net)"
    r"|Unable to load libnccl-net|Failed to open libnccl-net"
)
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

_CANONICAL_PLUGIN = {
    "Libfabric": "aws-ofi-nccl",
    "AWS Libfabric": "aws-ofi-nccl",
    "NCCL RDMA Plugin": "nccl-rdma-sharp-plugins",
}


def _transport(via: str) -> str:
    """'NET/IB/3(1)/GDRDMA' -> 'NET/IB/GDRDMA', 'P2P/CUMEM/read' -> 'P2P/CUMEM', 'SHM/direct/direct' -> 'SHM'."""
    head, _, rest = via.partition("/")
    if head in ("NET", "COLLNET"):
        m = re.match(r"(.+?)/\d+(?:\(\d+\))?(/.*)?$", rest)
        name, tail = (m.group(1), m.group(2) or "") if m else (rest.split("/")[0], rest)
        return ("NET/" if head == "NET" else "CollNet/") + name + ("/GDRDMA" if "GDRDMA" in tail else "")
    if head == "P2P":
        return "P2P/" + rest.split("/")[0].split()[0]
    if head == "SHM" or "shared memory" in via:
        return "SHM"
    return head


@dataclass
class _Acc:
    """Mutable facts for one source while lines stream in; first occurrence wins."""

    host: str | None = None
    pid: int | None = None
    device: int | None = None
    one: dict[str, Fact] = field(default_factory=dict)
    many: dict[str, dict[Any, Fact]] = field(default_factory=dict)
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

    def freeze(self, key: str) -> RankFacts:
        o = self.one.get
        return RankFacts(
            key=key,
            host=self.host,
            pid=self.pid,
            device=self.device,
            rank=o("rank"),
            nccl_version=o("nccl_version"),
            cuda_driver_version=o("cuda_driver") or o("cuda_driver_ofi"),
            network=self._network(),
            net_plugin=self._plugin(),
            net_plugin_error=self._plugin_error(),
            provider=o("provider") or o("provider_filter"),
            gdr=self._gdr(),
            nvls=o("nvls") or o("nvls_channels"),
            **{name: self._max(name) for name in _COUNTS},
            transports=self.seen("transport"),
            interfaces=self.seen("interface"),
            link_layers=self.seen("link_layer"),
            warnings=tuple(self.warnings),
            errors=tuple(self.errors),
        )

    def _max(self, kind: str) -> Fact | None:
        return max(self.seen(kind), key=lambda f: f.value, default=None)

    def _network(self) -> Fact | None:
        o = self.one.get
        if o("network"):
            return o("network")
        net = next((t for t in self.seen("transport") if t.value.startswith("NET/")), None)
        if net:
            return Fact(net.value.split("/")[1], net.evidence, "from the channel lines")
        if o("ib_devices"):
            return Fact("IB", o("ib_devices").evidence, "from the NET/IB init line")
        if o("socket_init") and o("ib_unavailable"):
            return Fact("Socket", o("socket_init").evidence, "from the NET/Socket init line, IB unavailable")
        return None

    def _plugin(self) -> Fact | None:
        o = self.one.get
        named = o("plugin_ofi") or o("plugin_loaded") or o("plugin_path") or o("plugin_external")
        if not named:
            return None
        api = o("plugin_api")
        version = o("plugin_ofi").value[1] if o("plugin_ofi") else None
        return Fact(NetPlugin(named.value[0], version, api.value if api else None), named.evidence)

    def _plugin_error(self) -> Fact | None:
        return None if self._plugin() else self.one.get("plugin_failed")

    def _gdr(self) -> Fact | None:
        gdr = next((t for t in self.seen("transport") if t.value.endswith("/GDRDMA")), None)
        if gdr:
            return Fact(True, gdr.evidence, "a channel uses GDRDMA")
        if self.one.get("gdr_on") or self.one.get("gdr_off"):
            return self.one.get("gdr_on") or self.one["gdr_off"]
        net = next((t for t in self.seen("transport") if t.value.startswith(("NET/", "CollNet/"))), None)
        return Fact(False, net.evidence, "network channels without GDRDMA") if net else None


def _read_message(acc: _Acc, msg: str, ev: Evidence) -> None:
    """Every fact one NCCL message can state, recorded on its source.

    Each pattern is tried only when a plain substring says it could match: most lines state nothing,
    and a multi-rank log runs to megabytes.
    """
    if "ersion" in msg and (m := _CUDA_DRIVER.search(msg)):
        acc.set("cuda_driver" if m.group(1) else "cuda_driver_ofi", int(m.group(1) or m.group(2)), ev)
    if msg.startswith("Using ") and (m := _NETWORK.search(msg)):
        acc.set("network", m.group(1), ev)
    if "anks" in msg:
        if m := _RANKS.search(msg):
            if m.group(1) is not None:
                acc.set("rank", int(m.group(1)), ev)
            acc.add("nranks", int(m.group(2) or m.group(3)), ev)
        if m := _NNODES.search(msg):
            acc.add("nnodes", int(m.group(1)), ev)
        if m := _LOCAL_RANKS.search(msg):
            acc.add("local_ranks", int(m.group(1)), ev)
    if " via " in msg and (m := _VIA.search(msg)):
        acc.add("transport", _transport(m.group(1)), ev)
    if "nvls" in msg or "NVLS" in msg:
        if (m := _NVLS_CHANNELS.search(msg)) and int(m.group(1)) > 0:
            acc.add("transport", "NVLS", ev)
            acc.set("nvls_channels", True, ev, f"{m.group(1)} NVLS channels")
        if msg.startswith("NVLS comm "):
            acc.add("transport", "NVLS", ev)
        if m := _NVLS_SUPPORT.search(msg):
            acc.set("nvls", m.group(1) is None, ev)
    if "GDR" in msg or "GPU Direct" in msg:
        if _GDR_ON.search(msg):
            acc.set("gdr_on", True, ev)
        elif _GDR_OFF.search(msg):
            acc.set("gdr_off", False, ev)
    if "NET/OFI" in msg:
        if m := _PROVIDER.search(msg):
            acc.set("provider", m.group(1), ev)
        if m := _PROVIDER_FILTER.search(msg):
            acc.set("provider_filter", m.group(1), ev, "from provider_filter")
    if "lugin" in msg or "aws-ofi-nccl" in msg or "libnccl-net" in msg:
        _read_plugin(acc, msg, ev)
    if (
        "Using" in msg
        or "OOB" in msg
        or "NET/" in msg
        or "SHARP rank" in msg
        or "ibverbs" in msg
        or "IB_DISABLE" in msg
    ):
        _read_interfaces(acc, msg, ev)


def _read_plugin(acc: _Acc, msg: str, ev: Evidence) -> None:
    if m := _OFI_VERSION.search(msg):
        acc.set("plugin_ofi", ("aws-ofi-nccl", m.group(1)), ev)
    elif m := _LOADED_PLUGIN.search(msg):
        acc.set("plugin_loaded", (_CANONICAL_PLUGIN.get(m.group(1), m.group(1)),), ev)
        acc.set("plugin_api", m.group(2), ev)
    elif m := _PLUGIN_PATH.search(msg):
        path = m.group(1)
        name = "nccl-rdma-sharp-plugins" if "nccl_rdma_sharp_plugin" in path else path.rsplit("/", 1)[-1]
        acc.set("plugin_path", (name,), ev)
    elif m := _EXTERNAL_LOADED.search(msg):
        acc.set("plugin_external", (m.group(1),), ev)
    elif _PLUGIN_FAILED.search(msg):
        acc.set("plugin_failed", msg.strip(), ev)


def _read_interfaces(acc: _Acc, msg: str, ev: Evidence) -> None:
    if m := _IB_DEVICES.search(msg):
        devices = _IB_DEVICE.findall(m.group(1))
        if devices:
            acc.set("ib_devices", True, ev)
        for hca, port, layer in devices:
            acc.add("interface", f"{hca}:{port}", ev, "ib")
            acc.add("link_layer", (f"{hca}:{port}", layer), ev)
    elif m := _IB_OLD_DEVICE.search(msg):
        acc.set("ib_devices", True, ev)
        acc.add("interface", f"{m.group(1)}:{m.group(2)}", ev, "ib")
        acc.add("link_layer", (f"{m.group(1)}:{m.group(2)}", m.group(3)), ev)
    elif m := _IP_IFACES.search(msg):
        role = "bootstrap" if m.group(1) in ("Bootstrap", "NET") else "socket"
        if m.group(1) == "NET/Socket":
            acc.set("socket_init", True, ev)
        for name in _IP_IFACE.findall(m.group(2)):
            acc.add("interface", name, ev, role)
    if m := _OOB.search(msg):
        acc.add("interface", m.group(1) or m.group(2), ev, "oob")
    if m := _OTHER_IFACE.search(msg):
        acc.add("interface", m.group(1) or m.group(2), ev, "ofi" if m.group(1) else "sharp")
    if _IB_UNAVAILABLE.search(msg):
        acc.set("ib_unavailable", True, ev)


def parse_nccl_log(text: str) -> NcclLog:
    """Read every NCCL fact in ``text``; raise ParseError when it holds no NCCL line at all."""
    sources: dict[tuple[str, int, int] | None, _Acc] = {}
    nccl_lines = 0
    lines = text.splitlines()
    if len(lines) > 1 and not text.endswith(("\n", "\r")):
        lines.pop()  # a last line with no line end was cut mid-write: its values may be cut too
    for line_no, raw in enumerate(lines, start=1):
        line = _LEADING_TS.sub("", raw, count=1)
        half = (len(line) - 3) // 2  # CloudWatch repeats the message: "msg | msg"
        if len(line) > 3 and line[half : half + 3] == " | " and line[:half] == line[half + 3 :]:
            line = line[:half]
        ev = Evidence(line_no, raw.rstrip())
        key: tuple[str, int, int] | None = None
        level = None
        if m := _HEAD.search(line):
            level, msg, src = m.group("level"), m.group("msg"), m.group("src")
            if who := _HOST_PID_TID.search(line, 0, m.start()):
                key = (who.group(1), int(who.group(2)), int(m.group("dev")))
        elif m := _BARE.search(line):
            level = m.group("level") or m.group("level2")
            msg, src = m.group("msg") or m.group("msg2") or "", m.group("src") or m.group("src2")
        else:
            msg, src = line.strip(), None
        version = _VERSION.search(line) if "NCCL version" in line else None
        if level is None and version is None:
            # Not an NCCL line by its shape; a log stripped of every prefix still says things, though.
            acc = sources.get(None) or _Acc()
            before = acc.hits
            _read_message(acc, msg, ev)
            if acc.hits > before:
                nccl_lines += 1
            if ("rror" in line or "ailure" in line) and _ERROR.search(line):
                acc.errors.append(Fact(line.strip(), ev))
            if acc.hits > before or acc.errors:
                sources[None] = acc
            continue
        nccl_lines += 1
        acc = sources.get(key)
        if acc is None:
            acc = sources[key] = _Acc(*key) if key else _Acc()
        if version:
            acc.set("nccl_version", version.group(1), ev)
        if level in ("WARN", "ERROR", "ABORT"):
            (acc.warnings if level == "WARN" else acc.errors).append(Fact(msg.strip(), ev, src or ""))
        elif ("rror" in msg or "ailure" in msg) and _ERROR.search(msg):
            acc.errors.append(Fact(msg.strip(), ev))
        _read_message(acc, msg, ev)
    if nccl_lines == 0:
        raise ParseError(
            f"No NCCL debug output found in {len(lines)} lines: expected lines such as "
            "'host:pid:tid [0] NCCL INFO ...' or 'NCCL version 2.x'. Was the job run with NCCL_DEBUG=INFO, "
            "and was stderr captured?"
        )
    return _summarise(sources, nccl_lines)


def to_json(log: NcclLog) -> dict[str, Any]:
    """The parsers' common entry point for ``gpucluster parse nccl-log``: :meth:`NcclLog.to_json`."""
    return log.to_json()


_by_line = attrgetter("evidence.line_no")


def _consensus(facts: list[Fact | None]) -> Fact | None:
    """The value most sources state (ties: the earliest line), with its first evidence."""
    known = sorted((f for f in facts if f is not None), key=_by_line)
    if not known:
        return None
    counts = Counter(f.value for f in known)
    best = max(counts.values())
    return next(f for f in known if counts[f.value] == best)


def _union(groups: list[tuple[Fact, ...]]) -> tuple[Fact, ...]:
    """Each distinct value once, with the earliest line that states it."""
    first: dict[Any, Fact] = {}
    for fact in sorted((f for g in groups for f in g), key=_by_line):
        first.setdefault(fact.value, fact)
    return tuple(first.values())


def _summarise(sources: dict[tuple[str, int, int] | None, _Acc], nccl_lines: int) -> NcclLog:
    ranks = [acc.freeze(f"{k[0]}:{k[1]}[{k[2]}]") for k, acc in sources.items() if k is not None]
    ranks.sort(key=lambda r: (r.rank is None, r.rank.value if r.rank else 0, r.key))
    unattributed = sources[None].freeze("(no host:pid prefix)") if None in sources else None
    everyone = [*ranks, *([unattributed] if unattributed else [])]
    agreed: dict[str, Any] = {name: _consensus([getattr(r, name) for r in everyone]) for name in _SCALARS}
    stated = [r.network for r in everyone if r.network and not r.network.note]
    if stated:  # a rank that says "Using network X" outweighs ranks whose network was inferred
        agreed["network"] = _consensus(stated)
    for name in _COUNTS:
        agreed[name] = max(
            (getattr(r, name) for r in everyone if getattr(r, name)), key=lambda f: f.value, default=None
        )
    for name in _SETS:
        agreed[name] = _union([getattr(r, name) for r in everyone])
    for name in _EVENTS:
        agreed[name] = tuple(sorted((f for r in everyone for f in getattr(r, name)), key=_by_line))
    return NcclLog(**agreed, per_rank=tuple(ranks), unattributed=unattributed, nccl_lines=nccl_lines)


# Facts every rank of one job should share. The plugin is compared field by field, so a rank whose log
# happens to omit the version line is "unknown", not "different".
_SHARED = {
    "nccl_version": lambda r: r.nccl_version,
    "cuda_driver_version": lambda r: r.cuda_driver_version,
    "network": lambda r: r.network,
    "net_plugin.name": lambda r: r.net_plugin and Fact(r.net_plugin.value.name, r.net_plugin.evidence),
    "net_plugin.version": lambda r: (
        r.net_plugin
        and r.net_plugin.value.version
        and Fact(r.net_plugin.value.version, r.net_plugin.evidence)
    ),
    "provider": lambda r: r.provider,
    "gdr": lambda r: r.gdr,
    "nvls": lambda r: r.nvls,
}


def disagreements(log: NcclLog) -> list[Disagreement]:
    """Facts on which the ranks named in the log differ; each names the ranks outside the majority."""
    found = []
    for name, get in _SHARED.items():
        said = [(r, f) for r in log.per_rank if (f := get(r))]
        counts = Counter(f.value for _, f in said)
        if len(counts) < 2:
            continue
        majority, count = counts.most_common(1)[0]
        odd = tuple((r, f) for r, f in said if f.value != majority)
        found.append(Disagreement(name, majority, count, odd))
    return found
