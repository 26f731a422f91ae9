"""What the fail-closed rule expects of a cluster: its nodes and GPUs, and the capabilities it lacks.

NOT MEASURED has one excuse: a capability the cluster lacks, named by the profile (a CPU profile has
no GPUs; a profile naming no RDMA fabric has no ports to check) or by the probe (one node cannot
run an inter-node test). A skip is never an excuse by itself: not a test that ran on another
pytest-xdist worker, not a missing Python package, not one rank's skip.

- ``cuda``: the profile's ``cluster.device`` is ``cuda``;
- ``nvlink``: the profile's ``cluster.interconnects`` names ``nvlink``;
- ``rdma``: it names ``ib``, ``roce`` or ``efa``;
- ``multi-node``: the probe found 2 or more nodes;
- ``multi-gpu``: a node has 2 or more GPUs (the probe's count; on a CPU profile, 2+ ranks per node),
  so there is intra-node traffic (NVLink, an intra-node collective) to measure;
- ``multi-rank``: the cluster runs 2 or more ranks in all;
- ``soak``: soak mode is on (``--gpucluster-soak``): off, its thresholds are not run, like a
  deselected test.

A node whose probe did not come back is not expected to measure anything: its probe check fails,
naming it once (``inventory.node_probed``).

Pure: the profile model and the probe's facts in, a frozen value out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["Inventory", "gpu_id"]

_RDMA = ("ib", "roce", "efa")
_GPU = re.compile(r"^(?:gpu\s*)?(\d+)\b", re.IGNORECASE)
_BUS = re.compile(r"([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2})", re.IGNORECASE)


def gpu_id(label: Any, bus_ids: Mapping[str, str] | None = None) -> str:
    """A GPU label as the inventory's index: ``GPU 3 (0000:3b:00.0)``, ``GPU 3`` and ``3`` are ``3``;
    a PCI address alone is looked up in ``bus_ids`` (address -> index)."""
    text = str(label).strip()
    bus = _BUS.search(text)
    if bus and bus_ids:
        found = bus_ids.get(_bus_key(bus.group(1)))
        if found is not None:
            return found
    match = _GPU.match(text)
    return match.group(1) if match else text


def _bus_key(address: str) -> str:
    domain, bus, device = address.lower().split(":")[-3:]
    return f"{int(domain, 16):x}:{int(bus, 16):x}:{int(device.split('.')[0], 16):x}"


@dataclass(frozen=True, slots=True)
class Inventory:
    """The nodes and GPUs a run must cover, and the capabilities the cluster lacks (with why)."""

    hosts: tuple[str, ...] = ()
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """host -> its GPUs' indices, as strings (empty: a node without GPUs)."""
    bus_ids: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """host -> PCI address -> GPU index, to match labels that name a GPU by its address."""
    lacking: Mapping[str, str] = field(default_factory=dict)
    """capability -> why the cluster lacks it (the profile's or the probe's words)."""
    unprobed: tuple[str, ...] = ()
    """Nodes the probe could not read: named once by their probe check, expected nothing else."""

    @classmethod
    def of(cls, model: ProfileModel, facts: ClusterFacts | None, *, soak: bool | None = None) -> Inventory:
        """The inventory of ``facts`` under ``model``; ``soak``: whether soak mode was on (None:
        unknown, taken as on)."""
        nodes = [n for n in (facts.nodes if facts else ()) if not n.error]
        lacking: dict[str, str] = {}
        cluster = model.cluster
        if cluster.device != "cuda":
            lacking["cuda"] = f"profile {model.name} is a CPU profile (cluster.device: {cluster.device})"
        if "nvlink" not in cluster.interconnects:
            lacking["nvlink"] = f"profile {model.name} names no NVLink in cluster.interconnects"
        if not any(f in cluster.interconnects for f in _RDMA):
            lacking["rdma"] = (
                f"profile {model.name} names no RDMA fabric (ib, roce, efa) in cluster.interconnects"
            )
        if facts is not None and len(facts.nodes) < 2:
            lacking["multi-node"] = f"the cluster has {len(facts.nodes)} node(s)"
        if cluster.device == "cuda" and nodes:
            per_node, what = max(n.gpu_count for n in nodes), "GPU(s)"  # the probe's word
        else:
            per_node, what = cluster.ranks_per_node or cluster.gpus_per_node, "rank(s) (the profile's)"
        if per_node < 2:
            lacking["multi-gpu"] = f"no node has more than {per_node} {what}: nothing intra-node to measure"
            if facts is not None and len(facts.nodes) * per_node < 2:
                lacking["multi-rank"] = f"the cluster has {len(facts.nodes) * per_node} rank(s) in all"
        if soak is False:
            lacking["soak"] = "soak mode is off (--gpucluster-soak)"
        return cls(
            hosts=tuple(n.host for n in nodes),
            gpus={n.host: tuple(str(g.index) for g in n.gpus) for n in nodes},
            bus_ids={
                n.host: {
                    _bus_key(g.bus_id): str(g.index) for g in n.gpus if g.bus_id and _BUS.search(g.bus_id)
                }
                for n in nodes
            },
            lacking=lacking,
            unprobed=tuple(n.host for n in (facts.nodes if facts else ()) if n.error),
        )

    def lacks(self, needs: Sequence[str]) -> list[str]:
        """Why the cluster cannot measure a threshold whose tests need ``needs`` (empty: it can)."""
        return [self.lacking[n] for n in needs if n in self.lacking]

    @property
    def known(self) -> bool:
        """Whether the nodes are known (no probe: the rule falls back to one value per key)."""
        return bool(self.hosts)
