"""Verdicts of node readiness: what the per-node probe read (`cluster.readiness`) against the
profile's ``readiness:`` section, one `Check` per node (per GPU or PCIe device where that is the
unit), each naming the node, what it has, and the action that fixes it.

Every metric has a `Remedy` (`REMEDIES`): the reason class and rung of the action ladder its
failure gets in the report (`results.findings`), the concrete fix (``start nvidia-fabricmanager``,
``load nvidia_peermem``...), and the symptoms it explains: a failed NVLink, GPUDirect or busbw
check on a node with a readiness failure says which cause is the likely one (`cause_of`). A key
the profile sets whose reading could not be taken on a node (root needed, a program missing) is a
NOT MEASURED check naming what the reading needs: never a silent pass. Pure; no pytest, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_gpucluster.checks.readiness_domain import Scope, judge_domains
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.cluster.preflight import PreflightFinding
from pytest_gpucluster.cluster.readiness import NodeReadiness
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = [
    "PREFIX", "REMEDIES", "Remedy", "cause_of", "explainer", "readiness_causes", "readiness_checks",
    "readiness_preflight", "remedy_of",
]  # fmt: skip

PREFIX = "readiness."
NVLINK_SYMPTOMS = ("nvlink.", "collectives.", "nccl.nvls", "nccl.p2p", "burnin.p2p")
"""Failed values an NVLink fabric problem explains: NVLink checks, busbw, NCCL's NVLS/P2P transports."""
GDR_SYMPTOMS = ("collectives.", "nccl.gdr", "nccl.network", "fabric.", "burnin.pair_", "burnin.soak.")
"""Failed values a GPUDirect RDMA problem explains: busbw, NCCL's GDR and network, fabric, pairs, soak."""


@dataclass(frozen=True, slots=True)
class Remedy:
    """What a failed readiness check means and what to do (docs/reference/readiness.md)."""

    reason: str
    """``node setup`` (a service, module, limit or BIOS setting to fix) or ``hardware``."""
    action: str
    """A rung of `results.findings.LADDER`."""
    fix: str
    """The concrete action, as an operator types or does it."""
    cause: str
    """How a symptom's message names this cause: ``GPUDirect off``."""
    symptoms: tuple[str, ...] = ()
    """Metric prefixes of the checks this cause explains when they fail on the same node."""


REMEDIES: Mapping[str, Remedy] = {
    "readiness.fabric_manager": Remedy(
        "node setup", "fix node setup", "start nvidia-fabricmanager (systemctl enable --now nvidia-fabricmanager)",
        "NVLink fabric not configured", NVLINK_SYMPTOMS),
    "readiness.gpu_fabric_state": Remedy(
        "node setup", "fix node setup",
        "start nvidia-fabricmanager; the GPU joins the fabric once it has configured the NVSwitches",
        "GPU not in the NVLink fabric", NVLINK_SYMPTOMS),
    "readiness.nvlink_domain": Remedy(
        "node setup", "fix node setup",
        "put the node's GPUs in the NVLink domain the others are in: check its NVLink Switch tray and Fabric "
        "Manager / IMEX configuration (nvidia-smi -q: Fabric ClusterUUID, CliqueId), then rerun",
        "GPU in another NVLink domain", NVLINK_SYMPTOMS),
    "readiness.sxid_fatal": Remedy(
        "hardware", "drain node", "drain the node, reset the GPUs and NVSwitches (reboot), rerun; RMA the baseboard if it returns",
        "fatal NVSwitch SXid", NVLINK_SYMPTOMS),
    "readiness.gpudirect_rdma": Remedy(
        "node setup", "fix node setup", "load nvidia_peermem (modprobe nvidia_peermem; add it to /etc/modules-load.d)",
        "GPUDirect off", GDR_SYMPTOMS),
    "readiness.memlock": Remedy(
        "node setup", "fix node setup",
        "raise the memlock limit to unlimited (limits.conf memlock, Slurm PropagateResourceLimits, docker --ulimit memlock=-1)",
        "memlock too low for NCCL's registrations", GDR_SYMPTOMS),
    "readiness.acs": Remedy(
        "node setup", "fix node setup", "disable ACS in BIOS (or clear ACSCtl with setpci at boot) on bare metal",
        "PCIe ACS redirects GPU<->NIC peer traffic", GDR_SYMPTOMS),
    "readiness.iommu": Remedy(
        "node setup", "fix node setup", "boot with the IOMMU in passthrough (iommu=pt, intel_iommu=on iommu=pt)",
        "IOMMU translating GPUDirect traffic", GDR_SYMPTOMS),
    "readiness.row_remap_pending": Remedy(
        "hardware", "reset GPU", "reset GPU to apply pending row remaps (drain, nvidia-smi -r -i <gpu>)",
        "row remap pending", ("burnin.", "numerics.")),
    "readiness.row_remap_failure": Remedy(
        "hardware", "RMA", "RMA the GPU: its row remapping failed (no spare rows)", "row remap failed", ("burnin.", "numerics.")),
    "readiness.retired_pages": Remedy(
        "hardware", "RMA", "RMA the GPU: its retired pages passed the profile's limit", "retired pages", ("burnin.", "numerics.")),
    "readiness.persistence_mode": Remedy(
        "node setup", "fix node setup", "enable persistence mode (nvidia-smi -pm 1, or run nvidia-persistenced)",
        "persistence mode off"),
    "readiness.stuck_processes": Remedy(
        "hardware", "drain node", "drain the node and look at the stuck processes (cat /proc/<pid>/stack)",
        "processes stuck in D state"),
    "readiness.pcie_aer": Remedy(
        "hardware", "drain node", "drain the node, reseat the GPU/NIC (RMA if the errors return)",
        "PCIe AER errors", ("burnin.h2d", "burnin.pcie", *GDR_SYMPTOMS)),
    "readiness.pcie_width": Remedy(
        "hardware", "drain node", "drain the node and reseat the card or its riser", "PCIe link below its width",
        ("burnin.h2d", "burnin.pcie", *GDR_SYMPTOMS)),
    "readiness.probed": Remedy(
        "node setup", "rerun", "update the probe on the node (install this version of the plugin there)",
        "readiness not read"),
}  # fmt: skip


def remedy_of(metric: str) -> Remedy | None:
    return REMEDIES.get(metric)


def _ref(profile: ProfileModel, key: str) -> ThresholdRef:
    return ThresholdRef(profile.name, ("readiness", key))


def _unmeasured(metric: str, profile: ProfileModel, key: str, host: str, why: str, **labels: str) -> Check:
    return Check(metric, math.nan, "bool", 1.0, "==", _ref(profile, key), labels={"host": host, **labels},
                 hint=f"{host}: not read ({why}); the profile sets readiness.{key}", problem="not measured")  # fmt: skip


def _ok(metric: str, ok: bool, profile: ProfileModel, key: str, host: str, hint: str, **labels: str) -> Check:
    remedy = REMEDIES[metric]
    text = f"{host}: {hint}" + ("" if ok else f" -> {remedy.fix}")
    return Check(
        metric, float(ok), "bool", 1.0, "==", _ref(profile, key), labels={"host": host, **labels}, hint=text
    )


def _at_most(metric: str, count: int, limit: int, unit: str, profile: ProfileModel, key: str, host: str,
             hint: str, **labels: str) -> Check:  # fmt: skip
    remedy = REMEDIES[metric]
    text = f"{host}: {hint}" + ("" if count <= limit else f" -> {remedy.fix}")
    return Check(
        metric, count, unit, limit, "<=", _ref(profile, key), labels={"host": host, **labels}, hint=text
    )


def _gpu_label(index: int, bus: str | None) -> str:
    return str(index) if not bus else f"{index} ({bus.split(':', 1)[-1] if bus.count(':') > 2 else bus})"


def _fabric(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    """The GPUs' fabric state decides when NVML reports it (all Completed: the fabric is up,
    whatever can be read of the service); the service decides on an NVSwitch node whose GPUs
    report none. A node with neither NVSwitches nor fabric states needs no Fabric Manager."""
    host = node.host
    states = [g for g in r.gpus if g.fabric_state]
    if not r.nvswitches and not states:
        if r.nvswitches == 0 or (r.gpus and "pci" in r.why):
            # judged and passed, not left unmeasured: fail-closed counts this node's answer
            return [_ok("readiness.fabric_manager", True, p, "fabric_manager", host,
                        "no NVSwitch on the PCIe bus and no GPU reports a fabric state: not needed")]  # fmt: skip
        return [_unmeasured("readiness.fabric_manager", p, "fabric_manager", host,
                            "; ".join(v for k, v in r.why.items() if k in ("pci", "gpus")) or "no reading")]  # fmt: skip
    service = r.fm_service
    said = (f"nvidia-fabricmanager is {service}" if service is not None
            else f"the service state was not read ({r.why.get('fabric_manager', 'no answer')})")  # fmt: skip
    switches = f"{r.nvswitches} NVSwitch(es) on the bus" if r.nvswitches else "NVSwitches not visible"
    out = []
    joined = [
        g
        for g in states
        if g.fabric_state == "completed" and (g.fabric_status or "success").lower() == "success"
    ]
    if states:
        ok = len(joined) == len(states) and service in (None, "active")
        waiting = sorted({f"{g.fabric_state}/{g.fabric_status or 'N/A'}" for g in states if g not in joined})
        what = (f"{len(joined)} of {len(states)} GPUs joined the NVLink fabric"
                + (f" (others: {', '.join(waiting)})" if waiting else "") + f"; {said}; {switches}")  # fmt: skip
        if len(joined) == len(states) and service not in (None, "active"):
            what += (
                " (the GPUs keep their fabric while the service is down, but a GPU reset cannot rejoin it)"
            )
        if not ok and r.fm_log_errors:
            what += f"; its log's last error: {r.fm_log_errors[-1]}"
        out.append(_ok("readiness.fabric_manager", ok, p, "fabric_manager", host, what))
        for gpu in states:
            label = _gpu_label(gpu.index, gpu.bus_id)
            uuid = f", ClusterUUID {gpu.cluster_uuid}" if gpu.cluster_uuid else ""
            out.append(_ok("readiness.gpu_fabric_state", gpu in joined, p, "fabric_manager", host,
                           f"GPU {label} fabric state {gpu.fabric_state}, status {gpu.fabric_status or 'N/A'}{uuid}",
                           gpu=label))  # fmt: skip
        return out
    if service is None:
        return [_unmeasured("readiness.fabric_manager", p, "fabric_manager", host,
                            f"{switches}, no GPU fabric state, and {said}")]  # fmt: skip
    ok = service == "active"
    return [_ok("readiness.fabric_manager", ok, p, "fabric_manager", host,
                f"{said}; {switches}" + ("" if ok else ": CUDA has no NVLink peer access"))]  # fmt: skip


def _sxid(node: NodeFacts, r: NodeReadiness, p: ProfileModel, limit: int) -> list[Check]:
    if r.nvswitches == 0 and not r.sxids:
        return [_at_most("readiness.sxid_fatal", 0, limit, "SXids", p, "max_sxid_fatal", node.host,
                         "no NVSwitch on the PCIe bus: no SXid to read")]  # fmt: skip
    if "sxid" in r.why and not r.sxids:
        return [_unmeasured("readiness.sxid_fatal", p, "max_sxid_fatal", node.host, r.why["sxid"])]
    fatal = [s for s in r.sxids if s.fatal]
    last = f"; last: {fatal[-1].line}" if fatal else ""
    hint = f"{len(fatal)} fatal NVSwitch SXid(s) in {r.sxid_source or 'the logs'}{last}"
    return [
        _at_most("readiness.sxid_fatal", len(fatal), limit, "SXids", p, "max_sxid_fatal", node.host, hint)
    ]


def _gdr(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    if r.peermem is None:
        return [
            _unmeasured(
                "readiness.gpudirect_rdma",
                p,
                "gpudirect_rdma",
                node.host,
                r.why.get("peermem", "/sys/module not read"),
            )
        ]
    ok = bool(r.peermem or r.dmabuf)
    if r.peermem:
        said = "nvidia_peermem is loaded"
    elif r.dmabuf:
        said = (
            f"nvidia_peermem not loaded, but the open kernel module on kernel {r.kernel} gives NCCL dma-buf"
        )
    else:
        module = (
            "the proprietary kernel module" if r.open_module is False else "no NVIDIA driver version read"
        )
        said = f"nvidia_peermem not loaded, and no dma-buf path ({module}, kernel {r.kernel})"
    return [_ok("readiness.gpudirect_rdma", ok, p, "gpudirect_rdma", node.host, said)]


def _memlock(node: NodeFacts, r: NodeReadiness, p: ProfileModel, want: float | str) -> list[Check]:
    if r.memlock is None:
        return [
            _unmeasured("readiness.memlock", p, "min_memlock", node.host, r.why.get("memlock", "not read"))
        ]
    have = "unlimited" if r.memlock < 0 else f"{r.memlock} bytes"
    ok = r.memlock < 0 or (want != "unlimited" and r.memlock >= float(want))
    asked = "unlimited" if want == "unlimited" else f"at least {int(float(want))} bytes"
    return [
        _ok(
            "readiness.memlock",
            ok,
            p,
            "min_memlock",
            node.host,
            f"memlock limit {have}, profile wants {asked}",
        )
    ]


def _acs(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    if "acs" in r.why:
        return [_unmeasured("readiness.acs", p, "acs_disabled", node.host, r.why["acs"])]
    bridges = list(r.acs_redirecting)
    hint = (f"ACS redirection (ReqRedir+/CmpltRedir+) on {len(bridges)} bridge(s) on the GPU<->NIC path: "
            f"{', '.join(bridges[:6])}{' ...' if len(bridges) > 6 else ''}") if bridges else "no bridge on a GPU<->NIC path redirects"  # fmt: skip
    return [_at_most("readiness.acs", len(bridges), 0, "bridges", p, "acs_disabled", node.host, hint)]


def _iommu(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    if r.iommu is None:
        return [
            _unmeasured(
                "readiness.iommu",
                p,
                "iommu_passthrough",
                node.host,
                "<sysfs>/kernel/iommu_groups is not readable",
            )
        ]
    return [
        _ok("readiness.iommu", r.iommu != "translated", p, "iommu_passthrough", node.host, f"IOMMU {r.iommu}")
    ]


def _per_gpu(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    cfg = p.readiness
    wanted = [
        cfg.max_pending_row_remaps,
        cfg.max_row_remap_failures,
        cfg.max_retired_pages,
        cfg.persistence_mode,
    ]
    if all(w is None for w in wanted):
        return []
    if not r.gpus:
        return [_unmeasured(metric, p, key, node.host, r.why.get("gpus", "no GPU listed"))
                for metric, key, value in (
                    ("readiness.row_remap_pending", "max_pending_row_remaps", cfg.max_pending_row_remaps),
                    ("readiness.row_remap_failure", "max_row_remap_failures", cfg.max_row_remap_failures),
                    ("readiness.retired_pages", "max_retired_pages", cfg.max_retired_pages),
                    ("readiness.persistence_mode", "persistence_mode", cfg.persistence_mode)) if value is not None]  # fmt: skip
    out = []
    for gpu in r.gpus:
        label = _gpu_label(gpu.index, gpu.bus_id)
        if cfg.max_pending_row_remaps is not None and gpu.remap_pending is not None:
            out.append(_at_most("readiness.row_remap_pending", int(gpu.remap_pending), cfg.max_pending_row_remaps, "GPUs", p,
                                "max_pending_row_remaps", node.host,
                                f"GPU {label} row remap {'PENDING' if gpu.remap_pending else 'none pending'}"
                                f" ({gpu.remapped_uncorrectable or 0} uncorrectable-error rows remapped)", gpu=label))  # fmt: skip
        if cfg.max_row_remap_failures is not None and gpu.remap_failure is not None:
            out.append(_at_most("readiness.row_remap_failure", int(gpu.remap_failure), cfg.max_row_remap_failures, "GPUs", p,
                                "max_row_remap_failures", node.host,
                                f"GPU {label} row remapping {'FAILED' if gpu.remap_failure else 'has not failed'}", gpu=label))  # fmt: skip
        if cfg.max_retired_pages is not None and gpu.retired_pages is not None:
            out.append(_at_most("readiness.retired_pages", gpu.retired_pages, cfg.max_retired_pages, "pages", p,
                                "max_retired_pages", node.host, f"GPU {label} has {gpu.retired_pages} retired pages", gpu=label))  # fmt: skip
        if cfg.persistence_mode is not None and gpu.persistence is not None:
            out.append(_ok("readiness.persistence_mode", gpu.persistence == cfg.persistence_mode, p, "persistence_mode",
                           node.host, f"GPU {label} persistence mode {'on' if gpu.persistence else 'off'}", gpu=label))  # fmt: skip
    return out


def _stuck(node: NodeFacts, r: NodeReadiness, p: ProfileModel, limit: int) -> list[Check]:
    if "stuck" in r.why:
        return [_unmeasured("readiness.stuck_processes", p, "max_stuck_processes", node.host, r.why["stuck"])]
    listed = ", ".join(r.stuck[:5]) or "none"
    return [_at_most("readiness.stuck_processes", len(r.stuck), limit, "processes", p, "max_stuck_processes",
                     node.host, f"processes in D state on both reads: {listed}")]  # fmt: skip


def _pcie(node: NodeFacts, r: NodeReadiness, p: ProfileModel) -> list[Check]:
    cfg = p.readiness
    if "pci" in r.why:
        keys = [k for k in ("max_aer_fatal", "pcie_full_width") if getattr(cfg, k) is not None]
        return [_unmeasured("readiness.pcie_aer" if k == "max_aer_fatal" else "readiness.pcie_width", p, k,
                            node.host, r.why["pci"]) for k in keys]  # fmt: skip
    out = []
    for dev in (d for d in r.pci if d.kind in ("gpu", "nic")):
        if cfg.max_aer_fatal is not None and (dev.aer_fatal is not None or dev.aer_nonfatal is not None):
            count = (dev.aer_fatal or 0) + (dev.aer_nonfatal or 0)
            out.append(_at_most("readiness.pcie_aer", count, cfg.max_aer_fatal, "errors", p, "max_aer_fatal", node.host,
                                f"{dev.kind} {dev.bdf}: {dev.aer_fatal or 0} fatal + {dev.aer_nonfatal or 0} non-fatal "
                                f"AER errors since boot ({dev.aer_correctable or 0} correctable)", device=dev.bdf))  # fmt: skip
        if cfg.pcie_full_width and dev.current_width is not None and dev.max_width:
            out.append(_ok("readiness.pcie_width", dev.current_width >= dev.max_width, p, "pcie_full_width", node.host,
                           f"{dev.kind} {dev.bdf}: x{dev.current_width} of x{dev.max_width} at rest "
                           f"({dev.current_speed or '?'} of {dev.max_speed or '?'}; the speed drops when idle)",
                           device=dev.bdf))  # fmt: skip
    return out


def readiness_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """Every readiness threshold the profile sets, judged on every node that answered the probe."""
    cfg = profile.readiness
    checks: list[Check] = []
    for node in (n for n in facts.nodes if not n.error):
        r = node.readiness
        if r is None:
            keys = [k for k in cfg.model_fields if k != "source" and getattr(cfg, k) is not None]
            checks += [_unmeasured("readiness.probed", profile, k, node.host,
                                   "the node's probe reported no readiness (an older plugin on the node)") for k in keys]  # fmt: skip
            continue
        if cfg.fabric_manager:
            checks += _fabric(node, r, profile)
        if cfg.max_sxid_fatal is not None:
            checks += _sxid(node, r, profile, cfg.max_sxid_fatal)
        if cfg.gpudirect_rdma:
            checks += _gdr(node, r, profile)
        if cfg.min_memlock is not None:
            checks += _memlock(node, r, profile, cfg.min_memlock)
        if cfg.acs_disabled:
            checks += _acs(node, r, profile)
        if cfg.iommu_passthrough:
            checks += _iommu(node, r, profile)
        checks += _per_gpu(node, r, profile)
        if cfg.max_stuck_processes is not None:
            checks += _stuck(node, r, profile, cfg.max_stuck_processes)
        checks += _pcie(node, r, profile)
    if cfg.nvlink_domain:
        checks += _domains(facts, profile, cfg.nvlink_domain)
    return checks


def _domains(facts: ClusterFacts, p: ProfileModel, scope: Scope) -> list[Check]:
    """``readiness.nvlink_domain``: the nodes' fabric ClusterUUID/CliqueId agree (`readiness_domain`)."""
    nodes = [(n.host, n.readiness.gpus if n.readiness else None,
              n.readiness.why.get("gpus", "") if n.readiness else "no readiness")
             for n in facts.nodes if not n.error and n.readiness is not None]  # fmt: skip
    return [
        _unmeasured("readiness.nvlink_domain", p, "nvlink_domain", v.host, v.said)
        if v.ok is None
        else _ok("readiness.nvlink_domain", v.ok, p, "nvlink_domain", v.host, v.said)
        for v in judge_domains(nodes, scope)
    ]


def readiness_causes(checks: Iterable[Check]) -> dict[str, list[tuple[Remedy, str]]]:
    """The failed readiness checks by host: each with its remedy and its sentence (the hint
    without the host and the fix), for `cause_of`."""
    causes: dict[str, list[tuple[Remedy, str]]] = {}
    for check in checks:
        remedy = REMEDIES.get(check.metric)
        if remedy is None or not check.failed or check.problem:
            continue
        host = str(check.labels.get("host"))
        said = check.hint.split(": ", 1)[-1].split(" -> ", 1)[0]
        if all(said != s for _, s in causes.get(host, [])):
            causes.setdefault(host, []).append((remedy, said))
    return causes


def cause_of(
    metric: str,
    host: str | None,
    causes: Mapping[str, Sequence[tuple[Remedy, str]]],
    hosts: Sequence[str] = (),
) -> str | None:
    """The readiness causes that explain a failed ``metric`` on ``host`` (every host of ``hosts``
    for a value that names none, such as an inter-node busbw): ``GPUDirect off on gpu-017:
    nvidia_peermem not loaded ...`` joined with ``; ``; None when none applies."""
    where = [host] if host else list(hosts or causes)
    found = [f"{remedy.cause} on {h}: {said} (-> {remedy.fix})"
             for h in where for remedy, said in causes.get(h, ()) if metric.startswith(remedy.symptoms)]  # fmt: skip
    return "; ".join(dict.fromkeys(found)) or None


def explainer(facts: ClusterFacts, profile: ProfileModel) -> Callable[[Check], str | None]:
    """``check -> likely cause`` from the nodes' readiness, for the recorder's failure lines."""
    causes = readiness_causes(readiness_checks(facts, profile))
    hosts = [n.host for n in facts.nodes]

    def explain(check: Check) -> str | None:
        if not causes or check.metric.startswith(PREFIX):
            return None
        host = check.labels.get("host") or check.labels.get("node")
        return cause_of(check.metric, str(host) if host not in (None, "", "all") else None, causes, hosts)

    return explain


def readiness_preflight(facts: ClusterFacts, profile: ProfileModel) -> list[PreflightFinding]:
    """The readiness failures as preflight warnings, before any job: each names the node, what it
    has and the fix (``gpu-017: nvidia_peermem not loaded ... -> load nvidia_peermem``). Warnings,
    not errors: the run goes on, the other tests measure what they can, and the inventory's
    ``test_node_readiness`` fails the node with its finding."""
    out = []
    for check in readiness_checks(facts, profile):
        if not check.failed:
            continue
        host = str(check.labels.get("host"))
        key = check.ref.key if check.ref is not None else check.metric
        state = "NOT MEASURED: " if check.problem else ""
        out.append(PreflightFinding(host, key, f"{check.ref}" if check.ref else key, check.hint,
                                    f"{state}{check.hint} ({check.ref})", "warning"))  # fmt: skip
    return out
