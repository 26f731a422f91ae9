"""The values an NCCL log parse returns: facts with the line that states them, per rank and agreed.

Only data and its JSON form live here; reading lines is ``records``/``reader``, agreeing across
ranks is ``summary``. Imports only the standard library.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Connection",
    "Disagreement",
    "Evidence",
    "Fact",
    "Facts",
    "NcclLog",
    "NetPlugin",
    "RankFacts",
    "disagreements",
]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Where a fact was read: the 1-based line number and the record as it appeared in the input.

    ``text`` is the whole physical line, or -- when one physical line holds several NCCL records glued
    together -- the one record the fact came from.
    """

    line_no: int
    text: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.text.strip()}"


@dataclass(frozen=True, slots=True)
class Fact:
    """One value read from the log, with the line that says it.

    ``note`` says how the value was read when it was inferred rather than stated ("from the channel
    lines"), an interface's role ("bootstrap", "ib", "oob"), or where NCCL printed a WARN
    ("proxy.cc:1485").
    """

    value: Any
    evidence: Evidence
    note: str = ""


@dataclass(frozen=True, slots=True)
class NetPlugin:
    """An external NCCL net plugin that loaded, named as NCCL names it.

    ``name`` is the name in ``NET/Plugin: Loaded net plugin <name> (v8)`` without a trailing
    version ("NCCL RDMA Plugin", "Libfabric", "AWS Libfabric"); when NCCL printed no such line,
    the plugin's own name for itself ("aws-ofi-nccl") or its library file. ``version`` is the
    version in that name ("v8" of "NCCL RDMA Plugin v8") or, for aws-ofi-nccl, the release it
    reports when its name carries none (``NET/OFI Initializing aws-ofi-nccl 1.16.2``: "1.16.2"); None
    otherwise (a rank whose log lacks the load line). ``api`` is NCCL's plugin
    API version in parentheses. ``library`` is the shared object NCCL loaded, as the log names it
    (``/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so`` or just ``libnccl-net.so``).
    ``release`` is what the plugin says of its own build ("1.16.2", "1.3@Tencent Cloud").
    ``project`` is the open-source project that ships a plugin of that name, when the log makes it
    certain: aws-ofi-nccl (the only plugin calling itself "Libfabric" or "AWS Libfabric" or printing
    ``NET/OFI``) or nccl-rdma-sharp-plugins (HPC-X; "NCCL RDMA Plugin", ``nccl_rdma_sharp_plugin``).
    """

    name: str
    version: str | None = None
    api: str | None = None
    library: str | None = None
    release: str | None = None
    project: str | None = None

    def matches(self, wanted: str) -> bool:
        """Whether a profile's plugin name means this plugin: its name, project or library file."""
        key = wanted.strip().casefold()
        names = {self.name, self.project or "", *self._library_names()}
        return key in {n.casefold() for n in names if n}

    @property
    def named(self) -> bool:
        """False when the log named no plugin and ``name`` stands in with the library file's name."""
        return self.name not in self._library_names()

    def _library_names(self) -> tuple[str, ...]:
        if not self.library:
            return ()
        base = self.library.rsplit("/", 1)[-1]
        return (base, base.split(".so", 1)[0])

    @property
    def label(self) -> str:
        """``"aws-ofi-nccl 1.16.2 (Libfabric)"``: project and version first, NCCL's name after."""
        head = self.project or self.name
        text = f"{head} {self.version}" if self.version else head
        return text if head == self.name else f"{text} ({self.name})"

    def to_json(self) -> dict[str, str | None]:
        return {
            "name": self.name,
            "version": self.version,
            "api": self.api,
            "library": self.library,
            "release": self.release,
            "project": self.project,
        }


@dataclass(frozen=True, slots=True)
class Connection:
    """One channel/connection line: which transport NCCL set up between two ranks.

    ``transport`` is normalised: ``P2P/IPC``, ``P2P/CUMEM``, ``P2P/direct pointer``, ``SHM``,
    ``NET/IB``, ``NET/IB/GDRDMA``, ``NET/Libfabric``, ``CollNet/SHARP/GDRDMA``, ``NVLS``. ``peers`` is
    ``(from rank, to rank)`` where the line names both. NVLS has no per-peer line: an ``NVLS``
    connection stands for a line saying NVLS buffers or channels were set up for the communicator.
    """

    transport: str
    evidence: Evidence
    channel: int | None = None
    peers: tuple[int, int] | None = None

    @property
    def family(self) -> str:
        """``P2P``, ``SHM``, ``NET``, ``CollNet`` or ``NVLS``."""
        return self.transport.split("/", 1)[0]

    @property
    def gdr(self) -> bool:
        return self.transport.endswith("/GDRDMA")


SCALAR_FACTS = (
    "nccl_version",
    "cuda_driver_version",
    "network",
    "net_plugin",
    "net_plugin_error",
    "provider",
    "gdr",
    "nvls",
    "nvls_used",
)
COUNT_FACTS = (
    "nranks",
    "nnodes",
    "local_ranks",
)  # the largest communicator wins: sub-communicators are smaller
SET_FACTS = (
    "transports",
    "interfaces",
    "link_layers",
    "environment",
)  # distinct values, each with its first line
EVENT_FACTS = ("warnings", "errors")  # every occurrence, in log order


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What NCCL said, each value with its line; ``None`` or empty where the log does not say.

    ``nvls`` is NVLS multicast *support* ("NVLS multicast support is available"); ``nvls_used`` is
    whether this job set NVLS up (``NVLS comm ...``, ``Connected NVLS tree``, ``16 nvls channels``:
    True; ``0 nvls channels`` or no support: False). ``connections`` holds every channel line, in
    log order, so a check can quote the line where a transport it forbids was used.
    """

    nccl_version: Fact | None = None  # "2.27.3+cuda12.9"
    cuda_driver_version: Fact | None = None  # 13000
    network: Fact | None = None  # as in "Using network X": "IB", "Socket", "Libfabric", "IBext_v8"...
    net_plugin: Fact | None = None  # a NetPlugin
    net_plugin_error: Fact | None = None  # why no external net plugin loaded
    provider: Fact | None = None  # libfabric provider: "efa"
    gdr: Fact | None = None  # GPUDirect RDMA used on the network path
    nvls: Fact | None = None  # NVLS multicast (NVLink SHARP) support
    nvls_used: Fact | None = None  # NVLS set up for this job's communicators
    nranks: Fact | None = None
    nnodes: Fact | None = None
    local_ranks: Fact | None = None
    transports: tuple[Fact, ...] = ()  # "P2P/CUMEM", "SHM", "NET/IB/GDRDMA", "NVLS", "CollNet/SHARP"...
    connections: tuple[Connection, ...] = ()  # every channel line, in log order
    interfaces: tuple[Fact, ...] = ()  # "eth0", "mlx5_0:1"; note: the role (bootstrap, socket, ib, oob...)
    link_layers: tuple[Fact, ...] = ()  # (hca, "IB" | "RoCE")
    environment: tuple[Fact, ...] = ()  # ("NCCL_P2P_DISABLE", "1") from "... set by environment to 1"
    warnings: tuple[Fact, ...] = ()  # benign NCCL WARNs; note: where NCCL printed it
    errors: tuple[Fact, ...] = ()  # failing WARNs and error lines; note: where NCCL printed it


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
    """The whole log: facts agreed across ranks, then every rank's own (``disagreements`` compares)."""

    per_rank: tuple[RankFacts, ...] = ()  # ranks named by a host:pid:tid prefix, by rank number
    unattributed: RankFacts | None = None  # lines without that prefix
    nccl_lines: int = 0

    def to_json(self) -> dict[str, Any]:
        """One JSON object; ``null`` for what the log does not say, WARNs and errors de-duplicated."""
        out: dict[str, Any] = {name: _value(getattr(self, name)) for name in SCALAR_FACTS}
        out["net_plugin"] = out["net_plugin"] and out["net_plugin"].to_json()
        out.update({name: _value(getattr(self, name)) for name in COUNT_FACTS})
        out["transports"] = [f.value for f in self.transports]
        out["transport_lines"] = {f.value: str(f.evidence) for f in self.transports}
        out["interfaces"] = [f.value for f in self.interfaces]
        out["link_layers"] = sorted({f.value[1] for f in self.link_layers})
        out["environment"] = dict(f.value for f in self.environment)
        out.update({name: list(dict.fromkeys(f.value for f in getattr(self, name))) for name in EVENT_FACTS})
        firsts = {}
        for fact in self.errors:
            firsts.setdefault(fact.value, str(fact.evidence))
        out["error_lines"] = list(firsts.values())  # the first line of each error, same order as "errors"
        out["disagreements"] = [str(d) for d in disagreements(self)]
        return out


def _value(fact: Fact | None) -> Any:
    return None if fact is None else fact.value


def _plugin_part(part: str) -> Any:
    def get(rank: RankFacts) -> Fact | None:
        plugin = rank.net_plugin
        if plugin is None or (part == "name" and not plugin.value.named):
            return None  # a stand-in name is "unknown", not "different"
        value = getattr(plugin.value, part)
        return Fact(value, plugin.evidence) if value else None

    return get


# Facts every rank of one job should share. The plugin is compared field by field, so a rank whose log
# happens to omit the version line is "unknown", not "different".
_SHARED = {
    "nccl_version": lambda r: r.nccl_version,
    "cuda_driver_version": lambda r: r.cuda_driver_version,
    "network": lambda r: r.network,
    "net_plugin.name": _plugin_part("name"),
    "net_plugin.version": _plugin_part("version"),
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
