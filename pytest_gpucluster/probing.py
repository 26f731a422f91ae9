"""Judging the nodes before there is a profile, and the small rules around the per-node probe.

``--hw=auto`` must pick a profile from the GPUs of the nodes, not of the machine pytest runs on
(a login node): `probe_for_auto` probes them through a provisional cluster (the hostfile's or the
Slurm allocation's hosts, one rank each, gloo, the settings' launcher) before the session exists;
`as_machine` summarises the facts for `profiles.detect.choose_profile`. `all_local` says when no
launch is needed at all (every host is this machine: the pytest process reads itself), and
`allocation_cpus` what a Slurm allocation grants per node until the probe says more.

No pytest: `session.py` calls these with plain values.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.profiles.loader import known_profiles, load_profile

if TYPE_CHECKING:
    from pytest_gpucluster.options import Settings

__all__ = [
    "PROBE_WORK_S",
    "all_local",
    "allocation_cpus",
    "as_machine",
    "gpu_models",
    "probe_for_auto",
    "provisional_cluster",
]

PROBE_WORK_S = 60.0
"""The probe's own work on a node (nvidia-smi, sysfs, importing torch), past the start-up deadline."""


def all_local(hosts: list[str]) -> bool:
    from pytest_gpucluster.launch.base import is_local_host

    return all(is_local_host(h) for h in hosts)


def allocation_cpus() -> int | None:
    """``SLURM_CPUS_ON_NODE`` of the allocation pytest runs in (salloc/sbatch), until the probe says."""
    value = os.environ.get("SLURM_CPUS_ON_NODE", "")
    return int(value) if value.isdigit() and os.environ.get("SLURM_JOB_ID") else None


def gpu_models(extra_dirs: list[Path]) -> list[tuple[str, str | None]]:
    models = []
    for name, path in known_profiles(extra_dirs).items():
        try:
            models.append((name, load_profile(str(path), extra_dirs).model.cluster.gpu_model))
        except ProfileError:
            continue  # a broken profile only matters when it is selected
    return models


def as_machine(facts: ClusterFacts | None, machine: MachineInfo) -> MachineInfo:
    """What ``--hw=auto`` chooses on: the GPUs the nodes list (all of them, so mixed parts are
    refused), not the controller's; the controller itself when nothing was probed."""
    if facts is None:
        return machine
    names = tuple(name for node in facts.nodes for name in node.gpu_names)
    why = "; ".join(
        f"node {n.host}: {n.error or n.gpu_problem or 'lists no GPU'}" for n in facts.nodes if not n.gpus
    )
    hosts = ", ".join(n.host for n in facts.nodes)
    return MachineInfo(
        hostname=hosts or machine.hostname,
        cuda_available=bool(names),
        gpu_names=names,
        reasons={"cuda": f"no GPU on the nodes ({why or 'none answered the probe'})"},
    )


def probe_for_auto(
    settings: Settings, results_dir: Path, worker: bool, session_tag: str
) -> ClusterFacts | None:
    """``--hw=auto`` needs the nodes' GPUs before there is a profile: the controller probes through a
    provisional cluster (one rank per node, gloo, the settings' launcher); a worker reads the
    controller's ``probe.json``; a rank reads its own node."""
    import json

    from pytest_gpucluster.cluster.probe import PROBE_FILE, probe_cluster, probe_here, probe_options
    from pytest_gpucluster.launch.forward_env import forward_patterns

    options = probe_options(forward_patterns(settings.forward_env))
    if worker:
        path = results_dir / PROBE_FILE
        if path.is_file():
            return ClusterFacts.from_json(json.loads(path.read_text(encoding="utf-8")))
        return probe_here(options)
    cluster = provisional_cluster(settings, results_dir, session_tag)
    if cluster is None:
        return probe_here(options)
    if settings.dry_run:
        return None
    from pytest_gpucluster.launch.job import rendezvous_deadline

    deadline = rendezvous_deadline(cluster.spec.nnodes, settings.rendezvous_timeout) + PROBE_WORK_S
    facts = probe_cluster(cluster, options, timeout_s=deadline)
    if settings.launcher == "slurm":  # several Slurm nodes and no GPU: an error, not cpu-local
        from pytest_gpucluster.cluster.slurm_gpus import no_gpu_error

        if problem := no_gpu_error(facts, cluster.launcher.extra_args):
            raise ProfileError(problem)
    return facts


def provisional_cluster(settings: Settings, results_dir: Path, session_tag: str) -> Any:
    """The hosts of --hostfile or the Slurm allocation with one rank each; None when every host is
    this machine (no launch needed)."""
    from pytest_gpucluster.cluster.hostfile import read_hostfile
    from pytest_gpucluster.cluster.spec import ClusterSpec
    from pytest_gpucluster.launch import get_launcher
    from pytest_gpucluster.launch.forward_env import forward_patterns
    from pytest_gpucluster.launch.job import Cluster

    if settings.hostfile is not None:
        spec = ClusterSpec.from_hostfile(read_hostfile(settings.hostfile), 1, "gloo")
    elif settings.launcher == "slurm" and os.environ.get("SLURM_JOB_NODELIST"):
        spec = replace(ClusterSpec.from_slurm_env(backend="gloo"), nproc_per_node=1)
    else:
        return None
    if all_local(list(spec.host_names)):
        return None
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
