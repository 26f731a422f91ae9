"""What every node of the cluster is, as the per-node probe found it: `NodeFacts` and `ClusterFacts`.

The probe's rank on each node (`workloads.node_probe`) returns plain JSON; `node_facts` turns one
node's into a `NodeFacts` (the ``nvidia-smi`` table parsed with `parsers.nvidia_smi`, the sysfs
ports with `parsers.fabric_ports`, secrets redacted), and `ClusterFacts` holds every node's plus the
nodes the probe could not read. Capability marks (``needs=``, ``min_gpus_per_node``), ``--hw=auto``
and the inventory tests judge these facts, never the machine pytest runs on (a login node).

A capability a node has (`NodeFacts.capabilities`), and why not where it has not:

- ``cuda``: GPUs listed (NVML or nvidia-smi) **and** this node's torch can use them;
- ``nccl``: cuda, and torch has its NCCL backend;
- ``nvml``: NVML answered; ``nvlink``: NVML reports an active NVLink;
- ``ib`` / ``roce`` / ``efa``: a port of that kind under ``/sys/class/infiniband``.

Pure (facts in, facts out) and JSON round-trippable (``to_json``/``from_json``): the controller
writes them to ``probe.json`` for pytest-xdist workers and into results.json. No pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.cluster.nccl_names import redact_env
from pytest_gpucluster.cluster.readiness import NodeReadiness, node_readiness
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.fabric_ports import IbPort, parse_snapshot
from pytest_gpucluster.parsers.nvidia_smi import parse_smi_processes, parse_smi_table

__all__ = ["NODE_CAPABILITIES", "ClusterFacts", "GpuFact", "NetLink", "NodeFacts", "node_facts"]

NODE_CAPABILITIES = ("cuda", "nccl", "nvml", "nvlink", "ib", "roce", "efa")
"""The capabilities judged per node; ``slurm``, ``mpi`` and ``multi-node`` are the controller's."""
_MIB = 2**20


@dataclass(frozen=True, slots=True)
class GpuFact:
    index: int
    name: str
    uuid: str | None
    memory_bytes: int | None
    bus_id: str | None

    @property
    def name_cut(self) -> bool:
        """nvidia-smi's table cuts long names (``Tesla P100-SXM2...``): such a name is not the part's."""
        return self.name.endswith("...")


@dataclass(frozen=True, slots=True)
class NetLink:
    """One network interface of a node: state, negotiated speed and any rate it is shaped to."""

    name: str
    operstate: str | None = None
    speed_mbps: int | None = None
    shaped_bytes_per_s: int | None = None
    has_address: bool | None = None
    """Whether it holds an IP address (NCCL takes only such interfaces); None: not read (a
    recorded sysfs tree, an older probe)."""

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One node, as its probe rank saw it (or, with ``error``, why it could not)."""

    host: str
    gpus: tuple[GpuFact, ...] = ()
    gpu_source: str | None = None
    """``nvml`` or ``nvidia-smi``; None when neither answered (``gpu_problem`` says why)."""
    gpu_problem: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    nccl: str | None = None
    cuda_available: bool | None = None
    """What this node's torch says; None where torch was not asked (no GPUs listed)."""
    nccl_available: bool | None = None
    torch_problem: str | None = None
    nvlink_active: bool | None = None
    ib_ports: tuple[IbPort, ...] = ()
    links: tuple[NetLink, ...] = ()
    processes: tuple[Mapping[str, Any], ...] = ()
    """GPU processes in `workloads.gpu_processes`' record form (gpu, uuid, pid, used_bytes, name)."""
    processes_problem: str | None = None
    probe_pid: int | None = None
    cpus: int | None = None
    """CPUs a job may use here: ``SLURM_CPUS_ON_NODE`` inside a Slurm step, else the node's count."""
    env: Mapping[str, str] = field(default_factory=dict)
    cuda_device_count: int | None = None
    """``torch.cuda.device_count()`` in the probe rank's environment; None where torch was not asked."""
    cuda_visible_devices: str | None = None
    """``CUDA_VISIBLE_DEVICES`` as the probe rank had it (None: unset, CUDA sees every GPU)."""
    mig_enabled: tuple[int, ...] = ()
    """The GPUs (indices) whose MIG mode is enabled: CUDA sees MIG instances there, not the GPU."""
    gpus_skipped: tuple[str, ...] = ()
    """GPUs NVML would not read (``NO_PERMISSION``: a GPU of another job's cgroup), each with why."""
    reach: Mapping[str, str | None] = field(default_factory=dict)
    """Peer -> None when it answered the probe's TCP connect, else why not (`workloads.node_probe.reach`)."""
    error: str | None = None
    """Set when the probe did not come back from this node; every other field is then empty."""
    readiness: NodeReadiness | None = None
    """Fabric Manager, GPUDirect plumbing, memory health, host hazards (`cluster.readiness`);
    None where the probe did not read them (an older probe, a stand-in)."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def usable_gpu_count(self) -> int:
        """The GPUs jobs can use here: the smaller of what NVML lists and what CUDA enumerates in the
        rank's environment (``CUDA_VISIBLE_DEVICES``, MIG); NVML's count where CUDA was not asked."""
        if self.cuda_device_count is None or not self.cuda_available:
            return self.gpu_count
        return min(self.gpu_count, self.cuda_device_count)

    def cuda_view(self) -> str:
        """What CUDA can use, when it is fewer than NVML lists: ``CUDA can use 2 (CUDA_VISIBLE_DEVICES=0,1)``;
        empty when CUDA uses every GPU listed."""
        if self.usable_gpu_count >= self.gpu_count:
            return ""
        why = []
        if self.cuda_visible_devices is not None:
            why.append(f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}")
        if self.mig_enabled:
            why.append(f"MIG enabled on GPU {', '.join(map(str, self.mig_enabled))}")
        return f"CUDA can use {self.usable_gpu_count} of {self.gpu_count}" + (
            f" ({'; '.join(why)})" if why else ""
        )

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gpus)

    def capabilities(self) -> dict[str, str | None]:
        """Each of `NODE_CAPABILITIES` -> None when this node has it, else why not, as a clause
        without the node's name (`ClusterFacts.missing` groups nodes that lack it alike)."""
        if self.error:
            return dict.fromkeys(NODE_CAPABILITIES, f"could not be probed ({self.error})")
        out: dict[str, str | None] = {"cuda": self._cuda_gap()}
        out["nccl"] = out["cuda"] or (None if self.nccl_available else "this torch build has no NCCL backend")
        nvml_why = self.processes_problem if self.gpu_source == "nvidia-smi" else self.gpu_problem
        out["nvml"] = None if self.gpu_source == "nvml" else (nvml_why or "NVML unavailable")
        if out["nvml"]:
            out["nvlink"] = f"NVLink state needs NVML ({out['nvml']})"
        else:
            out["nvlink"] = None if self.nvlink_active else "NVML reports no active NVLink"
        layers = {_kind(p) for p in self.ib_ports}
        for kind in ("ib", "roce", "efa"):
            out[kind] = None if kind in layers else f"no {kind.upper()} device under /sys/class/infiniband"
        return out

    def _cuda_gap(self) -> str | None:
        if not self.gpus:
            return f"lists no GPU ({self.gpu_problem or 'no NVML, no nvidia-smi output'})"
        if self.cuda_available is False:
            build = (
                "a CPU-only torch build (torch.version.cuda is None)"
                if not self.torch_cuda
                else f"torch is built for CUDA {self.torch_cuda}: is the driver too old for it?"
            )
            return (
                f"lists GPUs ({self.gpu_source}), but its torch {self.torch or '?'} cannot use them "
                f"(torch.cuda.is_available() is False: {build})"
            )
        if self.cuda_available is None:
            return f"torch could not be asked about its GPUs ({self.torch_problem or 'unknown'})"
        return None

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["gpus"] = [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_bytes": g.memory_bytes,
                "bus_id": g.bus_id,
            }
            for g in self.gpus
        ]
        data["ib_ports"] = [p.to_json() for p in self.ib_ports]
        data["links"] = [link.to_json() for link in self.links]
        data["processes"] = [dict(p) for p in self.processes]
        data["env"] = dict(self.env)
        data["reach"] = dict(self.reach)
        data["mig_enabled"] = list(self.mig_enabled)
        data["gpus_skipped"] = list(self.gpus_skipped)
        data["readiness"] = self.readiness.to_json() if self.readiness is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeFacts:
        values = dict(data)
        values["gpus"] = tuple(GpuFact(**g) for g in data.get("gpus") or ())
        values["ib_ports"] = tuple(_port_from_json(p) for p in data.get("ib_ports") or ())
        values["links"] = tuple(NetLink(**link) for link in data.get("links") or ())
        values["processes"] = tuple(dict(p) for p in data.get("processes") or ())
        values["env"] = dict(data.get("env") or {})
        values["reach"] = dict(data.get("reach") or {})
        values["mig_enabled"] = tuple(data.get("mig_enabled") or ())
        values["gpus_skipped"] = tuple(data.get("gpus_skipped") or ())
        ready = data.get("readiness")
        values["readiness"] = NodeReadiness.from_json(ready) if ready else None
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


def _nodes(hosts: Sequence[str], shown: int = 4) -> str:
    more = len(hosts) - shown
    listed = ", ".join(hosts[:shown]) + (f" and {more} more" if more > 0 else "")
    return f"node{'s' if len(hosts) > 1 else ''} {listed}"


def _some(items: Sequence[str], shown: int = 3) -> str:
    more = len(items) - shown
    return "; ".join(items[:shown]) + (
        f"; and {more} more node{'s' if more != 1 else ''}" if more > 0 else ""
    )


def _kind(port: IbPort) -> str:
    if port.device.startswith(("efa", "rdmap")):
        return "efa"
    return "ib" if (port.link_layer or "").lower() == "infiniband" else "roce"


def _port_from_json(data: Mapping[str, Any]) -> IbPort:
    keys = ("node", "device", "port", "state", "phys_state", "rate_gbps", "rate_text", "link_layer")
    return IbPort(**{k: data.get(k) for k in keys}, counters=dict(data.get("counters") or {}),
                  unreadable=dict(data.get("unreadable") or {}))  # fmt: skip


def _smi_gpus(gpu: Mapping[str, Any], host: str) -> tuple[tuple[GpuFact, ...], dict[str, Any]]:
    """GPUs, versions and processes from the ``nvidia-smi`` table a node printed."""
    text = gpu.get("text") or ""
    if gpu.get("returncode") not in (0, None) or not text.strip():
        said = (gpu.get("stderr") or text).strip().splitlines()
        why = f"{gpu.get('program', 'nvidia-smi')} exited with code {gpu.get('returncode')}: {said[-1] if said else 'no output'}"
        return (), {"gpu_problem": why}
    try:
        table = parse_smi_table(text)
    except ParseError as exc:
        return (), {"gpu_problem": f"the nvidia-smi output of {host} could not be read: {exc}"}
    gpus = tuple(
        GpuFact(g.index, g.name, None, g.memory_total_mib * _MIB if g.memory_total_mib else None, g.bus_id)
        for g in table.gpus
    )
    processes = tuple(
        {"gpu": p.gpu, "uuid": f"GPU {p.gpu}", "pid": p.pid, "name": p.name,
         "used_bytes": p.memory_mib * _MIB if p.memory_mib is not None else None}
        for p in parse_smi_processes(text)
        if "C" in p.kind  # graphics-only clients hold no CUDA context, as NVML's compute list
    )  # fmt: skip
    mig = tuple(g.index for g in table.gpus if g.mig_mode == "Enabled")
    return gpus, {"driver": table.driver_version, "cuda_driver": table.cuda_version, "processes": processes,
                  "mig_enabled": mig}  # fmt: skip


def node_facts(record: Mapping[str, Any], host: str | None = None) -> NodeFacts:
    """One probe rank's value (`workloads.node_probe.read_node`) as `NodeFacts`."""
    host = str(record.get("host") or host or "?")
    gpu = record.get("gpu") or {}
    extra: dict[str, Any] = {}
    if gpu.get("source") == "nvml":
        gpus = tuple(GpuFact(**{k: g.get(k) for k in ("index", "name", "uuid", "memory_bytes", "bus_id")})
                     for g in gpu.get("gpus") or ())  # fmt: skip
        extra = {"driver": gpu.get("driver"), "cuda_driver": gpu.get("cuda_driver"),
                 "nvlink_active": gpu.get("nvlink_active"), "processes": tuple(gpu.get("processes") or ()),
                 "processes_problem": gpu.get("processes_why"),
                 "mig_enabled": tuple(int(g["index"]) for g in gpu.get("gpus") or () if g.get("mig") == "Enabled"),
                 "gpus_skipped": tuple(str(s) for s in gpu.get("skipped") or ())}  # fmt: skip
    elif gpu.get("source") == "nvidia-smi":
        gpus, extra = _smi_gpus(gpu, host)
        if "gpu_problem" not in extra and gpu.get("why"):
            extra["gpu_problem"] = gpu["why"]
        extra.setdefault("processes_problem", f"NVML unavailable: {gpu.get('nvml_why')}")
    else:
        gpus, extra = (), {"gpu_problem": gpu.get("why") or "the probe reported no GPU reading"}
    ports = parse_snapshot({"node": host, "infiniband": record.get("infiniband") or {}, "net": {}}).ib_ports
    slurm_cpus = str(record.get("slurm_cpus_on_node") or "")
    return NodeFacts(
        host=host,
        gpus=gpus,
        gpu_source=gpu.get("source") if gpus or gpu.get("source") == "nvml" else None,
        torch=record.get("torch"),
        torch_cuda=record.get("torch_cuda"),
        nccl=record.get("nccl"),
        cuda_available=record.get("cuda_available"),
        nccl_available=record.get("nccl_available"),
        torch_problem=record.get("torch_error"),
        ib_ports=ports,
        links=tuple(
            NetLink(str(name), **{k: v for k, v in link.items() if k in NetLink.__dataclass_fields__})
            for name, link in sorted((record.get("links") or {}).items())
        ),
        probe_pid=record.get("pid"),
        cpus=int(slurm_cpus) if slurm_cpus.isdigit() else record.get("cpu_count"),
        env=redact_env({str(k): str(v) for k, v in (record.get("env") or {}).items()}),
        cuda_device_count=record.get("device_count"),
        cuda_visible_devices=record.get("cuda_visible_devices"),
        reach=dict(record.get("reach") or {}),
        readiness=node_readiness(record["readiness"]) if record.get("readiness") else None,
        **extra,
    )


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """Every node's facts, in host order, and where they come from."""

    nodes: tuple[NodeFacts, ...]
    source: str
    """``probe jobs, one per node, in parallel (<dir>/node-probe-*)``, ``probe job <id> (<dir>)`` or
    ``this machine (read in the pytest process)``."""
    problem: str | None = None
    """The probe job's failure report, when some node's probe did not come back."""

    def node(self, host: str) -> NodeFacts | None:
        return next((n for n in self.nodes if n.host == host), None)

    def missing(self, capability: str, hosts: Sequence[str] | None = None) -> list[str]:
        """Why the nodes (of ``hosts``, default all) lack ``capability``, one sentence per reason
        naming the nodes it holds for (``nodes gpu-01, gpu-02: lists no GPU (...)``); empty when
        every node has it."""
        chosen = [n for n in self.nodes if hosts is None or n.host in hosts]
        by_reason: dict[str, list[str]] = {}
        for node in chosen:
            why = node.capabilities().get(capability)
            if why:
                by_reason.setdefault(why, []).append(node.host)
        return [f"{_nodes(hosts_)}: {why}" for why, hosts_ in by_reason.items()]

    def min_gpus(self, hosts: Sequence[str] | None = None) -> tuple[int, str]:
        """The smallest GPU count of the nodes (of ``hosts``) and the node that has it."""
        chosen = [n for n in self.nodes if hosts is None or n.host in hosts] or list(self.nodes)
        fewest = min(chosen, key=lambda n: n.gpu_count)
        return fewest.gpu_count, fewest.host

    def unmet(self, *, min_gpus: int = 0, needs: Sequence[str] = ()) -> list[str]:
        """A sentence per requirement some node does not meet, naming the nodes (up to three)."""
        out = []
        if min_gpus:
            short = [f"node {n.host} has {n.gpu_count}" for n in self.nodes if n.gpu_count < min_gpus]
            if short:
                out.append(f"needs {min_gpus} GPUs per node: {_some(short)}")
        for need in needs:
            if need in NODE_CAPABILITIES and (why := self.missing(need)):
                out.append(f"needs {need}: {_some(why)}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "problem": self.problem, "nodes": [n.to_json() for n in self.nodes]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterFacts:
        return cls(tuple(NodeFacts.from_json(n) for n in data.get("nodes") or ()), str(data.get("source", "")),
                   data.get("problem"))  # fmt: skip
