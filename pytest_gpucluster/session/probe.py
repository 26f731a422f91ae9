"""Stage 2 of the session's start: the nodes -> what each node is (`ClusterFacts`), by the
per-node probe (`cluster.probe`), and the small rules around it.

``--hw=auto`` must pick a profile from the GPUs of the nodes, not of the machine pytest runs on
(a login node): `probe_for_auto` probes them through a provisional cluster (the listed hosts,
one rank each, gloo, the settings' launcher) before there is a profile. With a profile, the
session probes through its own cluster; either way each node on its own (`cluster.probe.probe_each`).
`all_local` says when no launch is
needed at all (every host is this machine: the pytest process reads itself), and
`allocation_cpus` what a Slurm allocation grants per node until the probe says more.

Plain values in and out (no pytest); imports only `session.spec` of `session/`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gpucluster.cluster import probe as cluster_probe
from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.cluster.probe import (
    PROBE_WORK_S,
    PROBE_WORKLOAD,
    probe_options,
    read_probe_file,
)
from pytest_gpucluster.session.spec import NodeList

if TYPE_CHECKING:
    from pytest_gpucluster.options import Settings

__all__ = [
    "PROBE_WORK_S",
    "all_local",
    "allocation_cpus",
    "probe_commands",
    "probe_for_auto",
    "provisional_cluster",
]


def all_local(hosts: list[str] | tuple[str, ...]) -> bool:
    from pytest_gpucluster.launch.base import is_local_host

    return all(is_local_host(h) for h in hosts)


def allocation_cpus() -> int | None:
    """``SLURM_CPUS_ON_NODE`` of the allocation pytest runs in (salloc/sbatch), until the probe says."""
    value = os.environ.get("SLURM_CPUS_ON_NODE", "")
    return int(value) if value.isdigit() and os.environ.get("SLURM_JOB_ID") else None


def probe_commands(cluster: Any, options: dict[str, Any]) -> list[Any]:
    """What the probe would launch on each node (a dry run prints them)."""
    return cluster.commands_for(PROBE_WORKLOAD, nproc_per_node=1, options=options)


def probe_for_auto(
    settings: Settings, nodes: NodeList, results_dir: Path, worker: bool, session_tag: str
) -> ClusterFacts | None:
    """``--hw=auto`` needs the nodes' GPUs before there is a profile: the controller probes through a
    provisional cluster (one rank per node, gloo, the settings' launcher); a worker reads the
    controller's ``probe.json``; a rank reads its own node."""
    from pytest_gpucluster.launch.forward_env import forward_patterns

    options = probe_options(forward_patterns(settings.forward_env))
    if worker:
        return read_probe_file(results_dir) or cluster_probe.probe_here(options)
    cluster = provisional_cluster(settings, nodes, results_dir, session_tag)
    if cluster is None:
        return cluster_probe.probe_here(options)
    if settings.dry_run:
        return None
    from pytest_gpucluster.launch.job import rendezvous_deadline

    deadline = rendezvous_deadline(1, settings.rendezvous_timeout) + PROBE_WORK_S
    facts = cluster_probe.probe_each(cluster, options, timeout_s=deadline)
    if settings.launcher == "slurm":  # several Slurm nodes and no GPU: an error, not cpu-local
        from pytest_gpucluster.cluster.slurm_gpus import no_gpu_error
        from pytest_gpucluster.errors import ProfileError

        if problem := no_gpu_error(facts, cluster.launcher.extra_args):
            raise ProfileError(problem)
    return facts


def provisional_cluster(settings: Settings, nodes: NodeList, results_dir: Path, session_tag: str) -> Any:
    """The listed hosts with one rank each; None when every host is this machine (no launch
    needed). A hostfile that cannot be read is the error it is (``--hw=auto`` cannot choose)."""
    from pytest_gpucluster.cluster.spec import ClusterSpec
    from pytest_gpucluster.launch import get_launcher
    from pytest_gpucluster.launch.forward_env import forward_patterns
    from pytest_gpucluster.launch.job import Cluster

    if nodes.error is not None:
        raise nodes.error
    if nodes.local:
        return None
    if nodes.hostfile is not None:
        spec = ClusterSpec.from_hostfile(nodes.hostfile, 1, "gloo")
    elif nodes.source.startswith("Slurm"):
        spec = replace(ClusterSpec.from_slurm_env(backend="gloo"), nproc_per_node=1)
    else:
        return None
    spec = replace(spec, hosts=tuple(h for h in spec.hosts if h[0] in nodes.hosts))
    kwargs: dict[str, Any] = {"extra_args": list(settings.launcher_args)} if settings.launcher_args else {}
    if settings.launcher == "slurm":  # the nodes' GPUs asked for, or the step gets none (slurm_gpus)
        from pytest_gpucluster.cluster.slurm_gpus import probe_gpu_request

        site = list(settings.launcher_args or ())
        gpus = probe_gpu_request(spec.host_names, site).args
        kwargs |= {"mode": settings.slurm_mode, "overcommit": False, "extra_args": [*site, *gpus]}
    return Cluster(
        spec,
        get_launcher(settings.launcher, **kwargs),
        results_dir / "jobs",
        remote_exec=settings.remote_exec,
        session_tag=session_tag,
        rendezvous_timeout=settings.rendezvous_timeout,
        forward_env=forward_patterns(settings.forward_env),
    )
