"""Which NVLink domain each node's GPUs are in, judged: the fabric ``ClusterUUID`` and ``CliqueId``
that ``nvidia-smi -q`` shows per GPU (its ``Fabric`` section, driver 550 and later; NVML's
``nvmlGpuFabricInfo``) must agree within a node, and across the nodes where the profile says they
form one NVLink domain (``readiness.nvlink_domain: cluster``, the trays of one GB200 NVL72 rack).

Why it matters: NCCL's multi-node NVLink (MNNVL) puts GPUs into one NVLink communicator only when
they report the same ClusterUUID and CliqueId; a tray that Fabric Manager put into another
partition, or that did not join at all, talks to the others over the network instead, at a
fraction of the bandwidth, without an error. Readings:

- a GPU with no fabric (``State`` N/A, no ``ClusterUUID``: a PCIe part, a VM without NVSwitch):
  nothing to judge; a node whose GPUs all have none needs no domain ("not needed", passed under the
  key so fail-closed counts its answer, as the Fabric Manager check does);
- a GPU in a fabric whose ClusterUUID is N/A or all zeros (a single-node NVSwitch system: NVML
  reports the zero UUID there, which "trivially matches" across nodes, meta-pytorch/torchcomms#1385)
  is in *no* multi-node domain: fine within a node, but not in a domain the profile spans over nodes;
- otherwise the GPU's domain is ``(ClusterUUID, CliqueId)``.

Pure: verdicts as ``(host, ok, sentence)``; `checks.readiness` makes them checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_gpucluster.parsers.nvidia_smi_fabric import GpuReadiness

__all__ = ["DomainVerdict", "Scope", "domain_of", "judge_domains"]

Domain = tuple[str, str]
Scope = Literal["node", "cluster"]


@dataclass(frozen=True, slots=True)
class DomainVerdict:
    host: str
    ok: bool | None
    """None: not measured (``said`` names why)."""
    said: str


def _zero(uuid: str) -> bool:
    return not uuid.replace("-", "").strip("0")


def domain_of(gpu: GpuReadiness) -> Domain | None:
    """``(ClusterUUID, CliqueId)`` of a GPU in a multi-node NVLink domain; None for none (module
    docstring: no fabric, N/A or an all-zero UUID)."""
    uuid = (gpu.cluster_uuid or "").strip().lower()
    if not uuid or _zero(uuid):
        return None
    return uuid, (gpu.clique_id or "N/A").strip()


def _has_fabric(gpu: GpuReadiness) -> bool:
    return gpu.fabric_state is not None or gpu.cluster_uuid is not None


def _name(domain: Domain | None) -> str:
    return "no multi-node domain" if domain is None else f"ClusterUUID {domain[0]}, CliqueId {domain[1]}"


def _groups(gpus: Sequence[GpuReadiness]) -> str:
    by: dict[Domain | None, list[str]] = {}
    for g in gpus:
        by.setdefault(domain_of(g), []).append(str(g.index))
    return "; ".join(f"GPU {','.join(ids)}: {_name(d)}" for d, ids in by.items())


def _node(host: str, gpus: Sequence[GpuReadiness]) -> tuple[DomainVerdict, Domain | None, bool]:
    """The node's own verdict, its domain (when its GPUs agree) and whether it has a fabric."""
    fabric = [g for g in gpus if _has_fabric(g)]
    if not fabric:
        said = (f"no GPU of {len(gpus)} reports an NVLink fabric (Fabric State N/A, no ClusterUUID: "
                "a PCIe part or no NVSwitch): not needed")  # fmt: skip
        return DomainVerdict(host, True, said), None, False
    domains = {domain_of(g) for g in fabric}
    if len(fabric) < len(gpus) or len(domains) > 1:
        said = f"the node's GPUs are in different NVLink domains ({_groups(gpus)})"
        return DomainVerdict(host, False, said), None, True
    [domain] = domains
    if domain is None:
        said = (f"all {len(fabric)} GPUs in a fabric with no multi-node domain (ClusterUUID N/A or "
                "all zeros: a single-node NVSwitch fabric)")  # fmt: skip
    else:
        said = f"all {len(fabric)} GPUs in one NVLink domain ({_name(domain)})"
    return DomainVerdict(host, True, said), domain, True


def judge_domains(
    nodes: Sequence[tuple[str, Sequence[GpuReadiness] | None, str]], scope: Scope
) -> list[DomainVerdict]:
    """One verdict per node: ``nodes`` as ``(host, GPUs or None when not read, why not read)``.

    ``node``: the GPUs of each node share one domain. ``cluster``: also every node is in the domain
    most GPUs of the run are in; where no GPU of the run reports a domain while some report a
    fabric, every fabric node fails (the profile says they form one domain; they report none)."""
    verdicts: dict[str, DomainVerdict] = {}
    read: dict[str, tuple[Domain | None, bool, int]] = {}
    for host, gpus, why in nodes:
        if not gpus:
            verdicts[host] = DomainVerdict(host, None, why or "no GPU listed")
            continue
        verdict, domain, fabric = _node(host, gpus)
        verdicts[host] = verdict
        if verdict.ok:
            read[host] = (domain, fabric, len(gpus))
    if scope == "cluster" and any(fabric for _, fabric, _ in read.values()):
        votes: Counter[Domain] = Counter()
        for domain, _, count in read.values():
            if domain is not None:
                votes[domain] += count
        common = votes.most_common(1)[0][0] if votes else None
        total = sum(count for _, _, count in read.values())
        for host, (domain, _, _) in read.items():
            if common is None:
                said = ("the profile says the nodes form one NVLink domain (readiness.nvlink_domain: cluster), "
                        f"but no GPU of the run reports one; this node: {verdicts[host].said}")  # fmt: skip
                verdicts[host] = DomainVerdict(host, False, said)
            elif domain != common:
                said = (f"this node is in {_name(domain)}, while {votes[common]} of {total} GPUs of the run are in "
                        f"{_name(common)} (the profile says the nodes form one NVLink domain)")  # fmt: skip
                verdicts[host] = DomainVerdict(host, False, said)
            else:
                verdicts[host] = DomainVerdict(host, True, f"{verdicts[host].said}, as the other nodes")
    return [verdicts[host] for host, _, _ in nodes]
