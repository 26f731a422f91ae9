"""The two headers of a session: the lines pytest's report header shows (`header_lines`) and the
header record results.json keeps (`header_record`: profile, settings with their sources,
fingerprint, redacted NCCL environment, regression tolerances).

Reads a `GpuClusterSession`, changes nothing in it; `session.start` and the plugin call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gpucluster.profiles.snapshot import snapshot
from pytest_gpucluster.results.fingerprint import fingerprint, redact

if TYPE_CHECKING:
    from pytest_gpucluster.session.core import GpuClusterSession


def header_record(session: GpuClusterSession) -> dict[str, Any]:
    model = session.profile.model
    return {
        "profile": {
            "name": model.name,
            "path": str(session.profile.path),
            "chain": [str(p) for p in session.profile.chain],
            "sha256": session.profile.sha256,
            "reason": session.profile_reason,
            "model": snapshot(model),  # what `gpucluster report` re-judges the evidence under
        },
        "settings": {
            dest: {"value": _plain(s.value), "source": s.source}
            for dest, s in session.settings.recorded().items()
        },
        "fingerprint": fingerprint(
            hosts=session.hosts,
            gpu_names=list(session.machine.gpu_names),
            cuda_available=session.machine.cuda_available,
        ),
        "nccl_env": redact(session.nccl_env),
        "regression": {"tolerances": session.tolerances.to_json(), "mode": session.settings.regression_gate},
        "tier": _tier_record(session),
    }


def _tier_record(session: GpuClusterSession) -> dict[str, Any] | None:
    tier = session.tier
    if tier is None:
        return None
    return {
        "name": tier.tier,
        "sweep": tier.sweep,
        "load_s": tier.load_s,
        "numerics_s": tier.numerics_s,
        "soak_s": tier.soak_s,
        "source": tier.source,
    }


def header_lines(session: GpuClusterSession) -> list[str]:
    cluster = session.profile.model.cluster
    nodes = session.available_nodes
    lines = [
        f"gpucluster: profile {session.profile.name} ({session.profile_reason}), "
        f"{nodes} node{'s' if nodes != 1 else ''} x {session.ranks_per_node} ranks, backend {cluster.backend}, "
        f"launcher {session.settings.launcher}{_launcher_why(session)}",
        f"gpucluster: thresholds {session.profile.path} (sha256 {session.profile.sha256[:12]})",
        f"gpucluster: results -> {session.results_dir}",
    ]
    if session.history_baseline:
        lines.append(f"gpucluster: baseline {session.settings.baseline}: {session.history_baseline}")
    for warning in session.profile.warnings:
        lines.append(f"gpucluster: WARNING {warning}")
    if session.leftovers is not None:
        lines += [f"gpucluster: {line}" for line in session.leftovers.lines()]
    lines += _probe_lines(session)
    if session.tier is not None:
        lines.append(f"gpucluster: {session.tier.describe()}")
    if session.settings.dry_run:
        lines.append("gpucluster: dry run — commands are printed, nothing is launched")
    return lines


def _launcher_why(session: GpuClusterSession) -> str:
    source = session.settings.source("launcher")
    return f" ({source.removeprefix('default ')})" if source.startswith("default inside") else ""


def _probe_lines(session: GpuClusterSession) -> list[str]:
    facts = session.probed
    if facts is None:
        return [f"gpucluster: nodes not probed: {session.not_probed}"] if session.not_probed else []
    lines = [f"gpucluster: nodes probed by {facts.source}:"]
    for node in facts.nodes:
        if node.error:
            lines.append(f"gpucluster:   {node.host}: NOT PROBED: {node.error}")
            continue
        names = sorted(set(node.gpu_names))
        gpus = f"{node.gpu_count} x {', '.join(names)}" if names else "no GPU"
        via = f" ({node.gpu_source}, driver {node.driver})" if node.gpu_source else ""
        lines.append(f"gpucluster:   {node.host}: {gpus}{via}, {len(node.ib_ports)} RDMA port(s)")
    return lines


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
