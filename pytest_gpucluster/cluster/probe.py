"""Run the per-node probe: each node on its own, all at once, before any test.

`probe_each` launches `workloads.node_probe.probe` through the session's cluster (its launcher,
its environment forwarding) as one short one-rank job per node, all in parallel, each with its own
deadline, no process group and no GPU taken, and turns what every rank returned into
`ClusterFacts`: an unreachable node costs one deadline, not the run, and holds no other node's
job. Each node's probe also tries a TCP connect to a few of its peers (`REACH_PEERS`), so a node
its peers cannot reach is known before the first multi-node job. A node whose rank did not come
back gets a `NodeFacts` with ``error`` set (its job's report in the reason). `probe_cluster` is
the same reading as one job of one rank per node.
`probe_here` reads this machine in the pytest process itself, for a session whose every host is
this machine: the same reading, without a launch.

``GPUCLUSTER_SYSFS_ROOT`` (``{host}`` is replaced by each node's name) points the probe's sysfs
reading at a recorded tree: the test bed's way to give each network-namespace node the ports of a
real machine. No pytest, no torch.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts, node_facts
from pytest_gpucluster.errors import GpuClusterError, JobFailed

REACH_PEERS = 8
"""How many peers each node's probe tries to reach (the next ones in host order, round the ring):
every node is tried by as many as it tries, so a node cut off is told from a healthy one by the
majority on both sides."""
PARALLEL_PROBES = 32
"""Probe jobs started at once (the launchers start a few processes each on the controller)."""

__all__ = [
    "FM_LOG_ENV",
    "PROBE_FILE",
    "PROBE_WORKLOAD",
    "PROC_ROOT_ENV",
    "REACH_PEERS",
    "SYSFS_ROOT_ENV",
    "probe_cluster",
    "probe_each",
    "probe_here",
    "probe_options",
    "reach_peers",
    "read_probe_file",
]

PROBE_WORKLOAD = "pytest_gpucluster.workloads.node_probe:probe"
PROBE_FILE = "probe.json"
"""Where the controller leaves the facts in the results directory (pytest-xdist workers read it)."""
SYSFS_ROOT_ENV = "GPUCLUSTER_SYSFS_ROOT"
PROC_ROOT_ENV = "GPUCLUSTER_PROC_ROOT"
"""As ``GPUCLUSTER_SYSFS_ROOT``, for the procfs the readiness probe reads (limits, D state, driver)."""
FM_LOG_ENV = "GPUCLUSTER_FM_LOG"
"""Fabric Manager's log file on the nodes (default ``/var/log/fabricmanager.log``; ``{host}`` replaced)."""
PROBE_WORK_S = 60.0
"""The probe's own work on a node (nvidia-smi, sysfs, importing torch), past the start-up deadline."""


def probe_options(env_patterns: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    return {
        "env_patterns": list(env_patterns),
        "sysfs_root": env.get(SYSFS_ROOT_ENV) or None,
        "proc_root": env.get(PROC_ROOT_ENV) or None,
        "fm_log": env.get(FM_LOG_ENV) or None,
    }


def probe_here(options: Mapping[str, Any]) -> ClusterFacts:
    """This machine's facts, read in this process (every host of the session is this machine)."""
    from pytest_gpucluster.workloads.node_probe import read_node

    record = read_node(
        socket.gethostname(),
        env_patterns=options.get("env_patterns") or (),
        sysfs_root=options.get("sysfs_root"),
        proc_root=options.get("proc_root"),
        fm_log=options.get("fm_log"),
    )
    return ClusterFacts(
        (node_facts(record),), "this machine (read in the pytest process: every host is local)"
    )


def read_probe_file(results_dir: Path) -> ClusterFacts | None:
    """The controller's facts, left in ``probe.json`` for the xdist workers; None when absent."""
    path = results_dir / PROBE_FILE
    if not path.is_file():
        return None
    return ClusterFacts.from_json(json.loads(path.read_text(encoding="utf-8")))


def _salvage(hosts: Sequence[str], exc: GpuClusterError) -> ClusterFacts:
    """The nodes whose probe rank answered, and an error entry for every other host."""
    result = getattr(exc, "result", None)
    nodes: list[NodeFacts] = []
    seen: set[str] = set()
    for rank in getattr(result, "ranks", ()) or ():
        if rank.ok and isinstance(rank.value, dict):
            facts = node_facts(rank.value, rank.host)
            nodes.append(facts)
            seen.add(facts.host)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for host in hosts:
        if host not in seen and not any(_same_host(host, name) for name in seen):
            nodes.append(NodeFacts(host=host, error=f"its probe rank did not answer: {first}"))
    where = (
        f"probe job {result.job_id} ({result.job_dir})" if result is not None else "probe job (not started)"
    )
    return ClusterFacts(tuple(_in_host_order(nodes, hosts)), where, problem=str(exc))


def _same_host(listed: str, reported: str) -> bool:
    """``node01`` in the hostfile and ``node01.cluster.local`` as the node calls itself are one node."""
    return listed.split(".")[0] == reported.split(".")[0]


def probe_cluster(cluster: Any, options: Mapping[str, Any], *, timeout_s: float) -> ClusterFacts:
    """Every node's facts from one job of one rank per node (see the module docstring)."""
    hosts = list(cluster.spec.host_names)
    try:
        job = cluster.run(
            PROBE_WORKLOAD,
            nproc_per_node=1,
            timeout=timeout_s,
            options=dict(options),
            name="node-probe",
            init_process_group=False,
            pick_device=False,
        )
    except JobFailed as exc:
        return _salvage(hosts, exc)
    except GpuClusterError as exc:  # could not launch at all
        return _salvage(hosts, exc)
    nodes = [node_facts(rank.value, rank.host) for rank in job.ranks]
    return ClusterFacts(tuple(_in_host_order(nodes, hosts)), f"probe job {job.job_id} ({job.job_dir})")


def _in_host_order(nodes: Sequence[NodeFacts], hosts: Sequence[str]) -> list[NodeFacts]:
    """Nodes in the order the hosts were given (c10d numbers torchrun's nodes as they arrive)."""

    def position(node: NodeFacts) -> int:
        return next((i for i, h in enumerate(hosts) if _same_host(h, node.host)), len(hosts))

    return sorted(nodes, key=position)


def reach_peers(hosts: Sequence[str], host: str, count: int = REACH_PEERS) -> list[str]:
    """The peers ``host`` tries to reach: the next ``count`` hosts after it, round the ring."""
    if host not in hosts or len(hosts) < 2:
        return []
    start = list(hosts).index(host)
    return [hosts[(start + i) % len(hosts)] for i in range(1, min(count, len(hosts) - 1) + 1)]


def probe_each(cluster: Any, options: Mapping[str, Any], *, timeout_s: float) -> ClusterFacts:
    """Every node's facts, one one-rank job per node, all in parallel (the module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    hosts = list(cluster.spec.host_names)

    def one(host: str) -> tuple[list[NodeFacts], str | None]:
        try:
            job = cluster.run(
                PROBE_WORKLOAD,
                nodes=[host],
                nproc_per_node=1,
                timeout=timeout_s,
                options={**options, "peers": reach_peers(hosts, host)},
                name=f"node-probe-{host}",
                init_process_group=False,
                pick_device=False,
            )
        except GpuClusterError as exc:  # a failed or hung job (JobFailed), or no launch at all
            return list(_salvage([host], exc).nodes), str(exc)
        return [node_facts(rank.value, rank.host) for rank in job.ranks], None

    with ThreadPoolExecutor(max_workers=max(1, min(len(hosts), PARALLEL_PROBES))) as pool:
        done = list(pool.map(one, hosts))
    nodes = [n for found, _ in done for n in found]
    problems = [p for _, p in done if p]
    where = f"probe jobs, one per node, in parallel ({cluster.results_dir}/node-probe-*)"
    return ClusterFacts(tuple(_in_host_order(nodes, hosts)), where, problem="\n".join(problems) or None)
