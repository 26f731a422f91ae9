"""The preflight: the profile and the session's settings held against what every node has, before
any job is launched.

A site profile's ``NCCL_SOCKET_IFNAME=bond0`` on a node without ``bond0`` fails every NCCL job at
init; eight ranks on a one-GPU node die in NCCL with "Duplicate GPU detected", once per job. Both
are known from the per-node probe (`cluster.probe`) before anything runs. `preflight` lists every
mismatch on every node (not the first), each naming the node, the variable or requirement, the
value asked and what the node has:

- ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA`` (the profile's ``nccl_env``, the user's own ``NCCL_*``
  winning) read as NCCL reads them: a comma list of prefixes; ``=`` first makes the entries exact
  names, ``^`` first excludes them (``^=`` both); an HCA entry may carry ``:port``. An interface
  selection that leaves no interface, or only ones that are down, is an error; so is an HCA list
  that selects no RDMA port, and an exact HCA entry the node lacks. An HCA list that leaves the node
  fewer active ports than it has is a warning (NCCL runs on part of the fabric);
- ranks per node at most the GPUs the node can use (a CUDA profile): the smaller of what NVML
  lists and what CUDA enumerates in the rank's environment (``CUDA_VISIBLE_DEVICES``, MIG), named;
- the usable GPU count and part the profile names (``cluster.gpus_per_node``, ``cluster.gpu_model``);
- MIG disabled where the profile measures NVLink (CUDA sees MIG instances, not GPUs);
- for information, the NCCL torch loaded on the node against the ``NCCL_VERSION`` its environment
  names (NVIDIA's images set it to their libnccl package; NCCL does not read it, and a pip torch
  loads its own: 2.28.9 loaded under ``NCCL_VERSION=2.28.3`` on the real H200 run).

Under a CUDA profile, a node without the ``cuda`` capability (no GPU listed, or a torch that cannot
use them) launches nothing: its GPU tests skip naming why, and the inventory judges it. A node
whose probe failed is the probe's failure. Pure: facts in, findings
out; no pytest, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_gpucluster.cluster.node_facts import ClusterFacts, NetLink, NodeFacts
from pytest_gpucluster.profiles.devices import same_part
from pytest_gpucluster.profiles.nccl_env import NicSelection, nic_selection
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check

__all__ = ["PreflightFinding", "preflight", "preflight_checks", "selects"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True, slots=True)
class PreflightFinding:
    """One mismatch between what the session asks and what a node has."""

    host: str
    requirement: str
    """``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``ranks per node``, ``GPU count``, ``GPU model``."""
    asked: str
    """The value asked, with where it comes from."""
    found: str
    """What the node has."""
    message: str
    """The whole sentence, starting with the node's name."""
    severity: Severity = "error"

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def selects(selection: NicSelection, device: str, port: int | None = None) -> bool:
    """Whether NCCL's list ``selection`` keeps ``device`` (and ``port``), as NCCL's ``matchIfList``:
    each entry ``name[:port]`` matches a device whose name starts with ``name`` (equals it with
    ``=``) and, where the entry gives a port, that port; ``^`` inverts the outcome."""
    hit = False
    for entry in selection.entries:
        name, _, port_text = entry.partition(":")
        if not (device == name if selection.exact else device.startswith(name)):
            continue
        if port_text.strip() and port is not None and port_text.strip() != str(port):
            continue
        hit = True
        break
    return not hit if selection.exclude else hit


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def _usable(link: NetLink) -> bool:
    """Whether NCCL can take the interface: not down, and holding an address where that was read."""
    return link.operstate != "down" and link.has_address is not False


def _interfaces(node: NodeFacts, value: str, origin: str, multi_node: bool) -> list[PreflightFinding]:
    if not node.links:  # not read on this node (a stand-in, an old probe): nothing to judge
        return []
    selection = nic_selection({"NCCL_SOCKET_IFNAME": value}, "NCCL_SOCKET_IFNAME")
    # The probe leaves out lo, which every node has and NCCL may be told to use (one-node jobs).
    links = [*node.links, NetLink("lo", "unknown")]
    names = [link.name for link in links]
    chosen = [link for link in links if selects(selection, link.name)]
    asked = f"NCCL_SOCKET_IFNAME={value} ({origin})"
    if not chosen:
        return [
            PreflightFinding(
                node.host, "NCCL_SOCKET_IFNAME", asked, _listed(names),
                f"{node.host}: NCCL_SOCKET_IFNAME={value} matches no interface (has {_listed(names)}); "
                f"NCCL's bootstrap fails at init on every job ({origin})",
            )
        ]  # fmt: skip
    usable = [link for link in chosen if _usable(link)]
    if not usable:
        why = ", ".join(
            f"{link.name} is down" if link.operstate == "down" else f"{link.name} has no IP address"
            for link in chosen
        )
        return [
            PreflightFinding(
                node.host, "NCCL_SOCKET_IFNAME", asked, why,
                f"{node.host}: NCCL_SOCKET_IFNAME={value} selects only interfaces NCCL cannot take ({why}; "
                f"NCCL takes interfaces that are up and hold an address; the node has {_listed(names)}) ({origin})",
            )
        ]  # fmt: skip
    if multi_node and all(link.name == "lo" for link in usable):
        return [
            PreflightFinding(
                node.host, "NCCL_SOCKET_IFNAME", asked, "lo",
                f"{node.host}: NCCL_SOCKET_IFNAME={value} leaves NCCL only lo, the loopback, on a multi-node run: "
                f"it reaches no other node, so the bootstrap cannot connect (the node has {_listed(names)}) ({origin})",
            )
        ]  # fmt: skip
    return []


def _hcas(node: NodeFacts, value: str, origin: str) -> list[PreflightFinding]:
    selection = nic_selection({"NCCL_IB_HCA": value})
    ports = [(p.device, p.port) for p in node.ib_ports]
    devices = sorted({device for device, _ in ports})
    has = f"has {_listed(devices)}" if devices else "has no RDMA device under /sys/class/infiniband"
    asked = f"NCCL_IB_HCA={value} ({origin})"
    out: list[PreflightFinding] = []
    if selection.exact and not selection.exclude:
        for entry in selection.entries:
            name, _, port = entry.partition(":")
            if not any(d == name and (not port or str(p) == port) for d, p in ports):
                out.append(
                    PreflightFinding(
                        node.host, "NCCL_IB_HCA", asked, has,
                        f"{node.host}: NCCL_IB_HCA={value} names {entry}, which this node does not have "
                        f"({has}) ({origin})",
                    )
                )  # fmt: skip
    chosen = [(d, p) for d, p in ports if selects(selection, d, p)]
    if not chosen and not out:
        out.append(
            PreflightFinding(
                node.host, "NCCL_IB_HCA", asked, has,
                f"{node.host}: NCCL_IB_HCA={value} matches no RDMA device ({has}); NCCL falls back to "
                f"TCP sockets or fails ({origin})",
            )
        )  # fmt: skip
    active = {(p.device, p.port) for p in node.ib_ports if (p.state or "").upper().endswith("ACTIVE")}
    used = [port for port in chosen if port in active]
    shown = ", ".join(f"{d}:{p}" for d, p in chosen)
    if chosen and not used and not out:
        out.append(
            PreflightFinding(
                node.host, "NCCL_IB_HCA", asked, f"every selected port DOWN ({shown})",
                f"{node.host}: NCCL_IB_HCA={value} selects {len(chosen)} RDMA port(s), all of them DOWN ({shown}): "
                f"NCCL falls back to TCP sockets and every collective runs on the wrong transport; look at the "
                f"cables and the subnet manager (ibstat) ({origin})",
            )
        )  # fmt: skip
    elif chosen and len(used) < len(chosen) and not out:
        down = ", ".join(f"{d}:{p}" for d, p in chosen if (d, p) not in active)
        out.append(
            PreflightFinding(
                node.host, "NCCL_IB_HCA", asked, f"{len(used)} of {len(chosen)} selected ports active",
                f"{node.host}: NCCL_IB_HCA={value} selects {len(chosen)} RDMA ports and {len(used)} are active "
                f"({down} not): NCCL runs on part of the fabric ({origin})",
                "warning",
            )
        )  # fmt: skip
    return out


def _mig(node: NodeFacts, model: ProfileModel, profile: str) -> list[PreflightFinding]:
    """MIG enabled where the profile measures NVLink: CUDA sees MIG instances, not whole GPUs, and
    no NVLink runs between them."""
    if not node.mig_enabled or model.nvlink is None:
        return []
    gpus = ", ".join(map(str, node.mig_enabled))
    view = node.cuda_view() or f"CUDA can use {node.usable_gpu_count} of {node.gpu_count}"
    return [
        PreflightFinding(
            node.host, "MIG mode", f"MIG disabled (profile {profile} measures NVLink)", f"MIG enabled on GPU {gpus}",
            f"{node.host}: MIG is enabled on GPU {gpus}: {view}, and NVLink does not run between MIG instances "
            f"(profile {profile} measures NVLink; disable MIG: nvidia-smi -mig 0)",
        )
    ]  # fmt: skip


def _gpus(node: NodeFacts, model: ProfileModel, profile: str, ranks_per_node: int, ranks_origin: str) -> list[PreflightFinding]:  # fmt: skip
    cluster = model.cluster
    count = node.usable_gpu_count
    if cluster.device != "cuda" or node.gpu_count == 0:
        return []
    view = node.cuda_view()
    usable = f"{count} GPU{'s' if count != 1 else ''} usable" + (f" ({view})" if view else "")
    out = []
    if ranks_per_node > count:
        out.append(
            PreflightFinding(
                node.host, "ranks per node", f"{ranks_per_node} ({ranks_origin})", f"{count} GPU(s)",
                f"{node.host}: {ranks_per_node} ranks per node asked ({ranks_origin}), "
                + (f"{usable}" if view else f"{count} GPU{'s' if count != 1 else ''} present")
                + ": ranks would share a GPU and NCCL refuses that ('Duplicate GPU detected')",
            )
        )  # fmt: skip
    if count != cluster.gpus_per_node:
        out.append(
            PreflightFinding(
                node.host, "GPU count", f"{cluster.gpus_per_node} (profile {profile}: cluster.gpus_per_node)",
                f"{count}",
                f"{node.host}: {count} GPU{'s' if count != 1 else ''}" + (f" usable ({view})" if view else "")
                + f", profile {profile} wants {cluster.gpus_per_node} (cluster.gpus_per_node)",
            )
        )  # fmt: skip
    if cluster.gpu_model:
        others = sorted({g.name for g in node.gpus if not same_part(cluster.gpu_model, g.name)})
        if others:
            out.append(
                PreflightFinding(
                    node.host, "GPU model", f"{cluster.gpu_model} (profile {profile}: cluster.gpu_model)",
                    ", ".join(others),
                    f"{node.host}: GPU {', '.join(others)} is not the part profile {profile} names "
                    f"({cluster.gpu_model!r}, cluster.gpu_model)",
                )
            )  # fmt: skip
    return out


NVML_FIX = "pip install nvidia-ml-py  (a dependency of pytest-gpucluster: pip install -e . in its checkout brings it)"
"""The one line that gives a node NVML's Python binding (``pynvml``)."""


def _nvml(node: NodeFacts, model: ProfileModel) -> list[PreflightFinding]:
    """Under a CUDA profile, a node whose GPUs NVML could not read: without ``pynvml`` every NVLink
    test, the ECC/XID counters and the GPU health readings would have nothing to read there. Not a
    capability the cluster lacks (the GPUs are there), so never an excuse: an error with its fix."""
    why = node.capabilities()["nvml"]
    if model.cluster.device != "cuda" or not node.gpus or why is None or "pynvml" not in why:
        return []  # only the missing package; a driver whose NVML fails is the inventory's to judge
    return [
        PreflightFinding(
            node.host, "NVML", "NVML's Python binding (NVLink state, ECC/XID counters, GPU health)", why,
            f"{node.host}: NVML cannot be read ({why}); the NVLink, counter and GPU health tests would have "
            f"nothing to read on this GPU node. Fix: {NVML_FIX}",
        )
    ]  # fmt: skip


def _version_core(text: str) -> str:
    """``2.17.1-1+cuda12.1`` -> ``2.17.1``: the NCCL release, without the package's build suffixes."""
    return text.strip().split("-", 1)[0].split("+", 1)[0]


def _nccl_versions(node: NodeFacts) -> list[PreflightFinding]:
    named = node.env.get("NCCL_VERSION", "").strip()
    if not named or not node.nccl:
        return []
    same = _version_core(named) == _version_core(node.nccl)
    relation = (
        "the same release" if same else "a different release: the image's libnccl is not the one in use"
    )
    return [
        PreflightFinding(
            node.host, "NCCL version", f"NCCL_VERSION={named} (the environment)", node.nccl,
            f"{node.host}: torch loaded NCCL {node.nccl}; the environment's NCCL_VERSION={named} (set by the "
            f"container image, not read by NCCL) names {relation}",
            "info",
        )
    ]  # fmt: skip


def preflight(
    facts: ClusterFacts,
    model: ProfileModel,
    *,
    env: Mapping[str, str],
    env_origin: Mapping[str, str],
    ranks_per_node: int,
    ranks_origin: str,
) -> list[PreflightFinding]:
    """Every finding on every node, node by node. ``env`` is the NCCL environment the jobs get;
    ``env_origin`` names where each variable comes from (``profile h200-spectrumx: nccl_env``)."""
    findings: list[PreflightFinding] = []
    nccl = model.cluster.backend == "nccl"
    multi_node = len(facts.nodes) > 1
    for node in facts.nodes:
        if node.error or (model.cluster.device == "cuda" and node.capabilities()["cuda"] is not None):
            continue  # the probe's failure, or a node whose GPU tests skip naming why: nothing launches there
        if nccl and (value := env.get("NCCL_SOCKET_IFNAME", "").strip()):
            findings += _interfaces(node, value, env_origin.get("NCCL_SOCKET_IFNAME", "?"), multi_node)
        if nccl and (value := env.get("NCCL_IB_HCA", "").strip()):
            findings += _hcas(node, value, env_origin.get("NCCL_IB_HCA", "?"))
        findings += _gpus(node, model, model.name, ranks_per_node, ranks_origin)
        findings += _nvml(node, model)
        if model.cluster.device == "cuda":
            findings += _mig(node, model, model.name)
        if nccl:
            findings += _nccl_versions(node)
    return findings


def preflight_checks(findings: Sequence[PreflightFinding], hosts: Sequence[str]) -> list[Check]:
    """One check per judged node: its preflight errors, none allowed (the rule itself, no profile
    key); warnings and information in the hint. A run with an error stops before its tests, so this
    fails only in a dry run, which shows the findings and goes on."""
    out = []
    for host in hosts:
        mine = [f for f in findings if f.host == host]
        errors = [f.message for f in mine if f.severity == "error"]
        notes = [f"{f.severity}: {f.message}" for f in mine if f.severity != "error"]
        hint = "; ".join(errors + notes) or f"{host}: the profile's NCCL interfaces/HCAs, ranks and GPUs fit"
        out.append(
            Check("preflight.errors", len(errors), "findings", 0, "==", None, None, {"host": host}, hint=hint)
        )
    return out
