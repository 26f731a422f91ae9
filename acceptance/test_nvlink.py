"""NVLink: GPUs linked as the profile says, every link up at speed, traffic really crossing the
links, and the fast path as much faster than the slow one as the profile demands.

A node with a degraded NVLink (a link down, a GPU fallen back to PCIe) passes most smoke tests
and then trains 20-70% slower. People check NVLink three ways, and so do these tests, each
against a key of the profile's ``nvlink:`` section (``checks/nvlink.py`` says how):

(a) ``test_topology``: every GPU pair in ``nvidia-smi topo -m`` shows ``nvlink.topology``.
(b) ``test_links_up``: each GPU has ``links_per_gpu`` links up at ``min_link_speed`` or faster.
(c) ``test_counters_move_during_all_reduce``: every GPU's NVLink byte counters grow during an
    intra-node all_reduce by at least ``min_counter_fraction`` of what a ring must send per GPU.
(d) ``test_speedup``: one intra-node all_reduce two ways, busbw ratio against ``min_speedup`` at
    each ``speedup_sizes``. On a cuda profile NCCL as configured against NCCL with NVLink off
    (``NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 NCCL_SHM_DISABLE=0``: P2P alone
    leaves NVLS on). Each side's NCCL INFO log (one per rank) shows which transports it used: a
    slow side still on P2P/NVLS fails quoting the line, and its ratio is then not judged; a fast
    side with no P2P/NVLS connection fails too (``checks/nvlink_transport.py``). On a cpu profile
    the real CPU analogue, DeepSpeed's shared-memory all_reduce against gloo over loopback TCP,
    so the gate runs in CI. ``min_busbw``, where set, gates the fast side.
(e) ``test_isolated_*_busbw``: intra-node busbw over NVLink only (``NCCL_SHM_DISABLE=1
    NCCL_P2P_LEVEL=NVL``) and inter-node busbw over the network only, each against its own floor,
    so a slow result points at the fabric at fault.

The NVLink-specific tests skip, naming the missing capability, on machines without NVLink.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks import nvlink as checks
from pytest_gpucluster.checks.comparison import pair, shm_vs_gloo, sweep_busbw
from pytest_gpucluster.checks.nvlink_transport import SideLogs, transport_checks
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.maths.sweep import summarize_sweep
from pytest_gpucluster.plans import nvlink as plans
from pytest_gpucluster.results.model import Check
from pytest_gpucluster.session import GpuClusterSession, get_session

NVLINK = pytest.mark.gpucluster(needs=["nccl", "nvlink"])
P2P_ADVICE = (
    "A ratio near 1 means NCCL does not use NVLink even where allowed: check `nvidia-smi topo -m`, "
    "NCCL_P2P_LEVEL and the NCCL_DEBUG=INFO 'via P2P' lines (each side's rank-<i>.log)."
)
FAST, SLOW = "nccl-p2p", "nccl-nvlink-off"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "speedup_path" in metafunc.fixturenames:
        if get_session(metafunc.config).profile.model.cluster.device == "cuda":
            path = pytest.param("nccl", id="nccl-vs-nvlink-off", marks=NVLINK)
        else:
            path = pytest.param("cpu", id="shm-vs-gloo")
        metafunc.parametrize("speedup_path", [path])


def _setting(hw: Any, *keys: str) -> None:
    """Skip unless the profile has an ``nvlink:`` section (setting one of ``keys``, if given)."""
    if hw.nvlink is None:
        pytest.skip(f"profile {hw.name} has no nvlink: section, so there is nothing to check NVLink against")
    if keys and all(getattr(hw.nvlink, key) is None for key in keys):
        pytest.skip(f"profile {hw.name} sets no nvlink.{' nor nvlink.'.join(keys)}")


@job_part
def inventory(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """Every node's GPUs, links and topology matrix: one rank per node, no process group."""
    return plans.inventory_part(session.profile.model, session.available_nodes, session.settings)


@job_part
def traffic(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """An intra-node all_reduce, with every GPU's NVLink counters read around it."""
    return plans.traffic_part(session.profile.model, session.available_nodes, session.settings)


@job_part
def shm_vs_gloo_run(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """DeepSpeed's shm all_reduce against gloo's, in one job (cpu profiles)."""
    profile = session.profile.model
    wanted = params.get("speedup_path") == "cpu" and profile.nvlink is not None and profile.nvlink.min_speedup
    return plans.shm_vs_gloo_part(profile, session.settings) if wanted else None


@pytest.mark.quick
@pytest.mark.gpucluster(needs=["nvlink"])
def test_topology(hw: Any, inventory: PartRun, results: Any) -> None:
    """Every GPU pair on every node is linked as ``nvlink.topology`` says."""
    _setting(hw, "topology")
    results.check_all(checks.topology_checks(hw, inventory.values))


@pytest.mark.quick
@pytest.mark.gpucluster(needs=["nvlink"])
def test_links_up(hw: Any, inventory: PartRun, results: Any) -> None:
    """Each GPU has ``links_per_gpu`` links up, none slower than ``min_link_speed``."""
    _setting(hw, "links_per_gpu", "min_link_speed")
    results.check_all(checks.link_checks(hw, inventory.values))


@NVLINK
def test_counters_move_during_all_reduce(hw: Any, traffic: PartRun, results: Any) -> None:
    """Every GPU's NVLink counters grow by a fair share of what the all_reduce must move."""
    _setting(hw)
    results.check_all(checks.counter_checks(hw, traffic.values, str(traffic.job_dir)))


def test_speedup(
    speedup_path: str, hw: Any, shared_jobs: Any, shm_vs_gloo_run: PartRun | None, request: Any, results: Any
) -> None:
    """Fast path over slow path, per size, against ``nvlink.min_speedup`` (module doc, (d)).
    With ``--baseline``, a suspected regression measures both paths once more before it fails."""
    _setting(hw, "min_speedup")
    found, table = _speedup(speedup_path, hw, shared_jobs.run, shm_vs_gloo_run, request)

    def again(_: Any) -> Any:
        shm = (
            None if shm_vs_gloo_run is None else shared_jobs.rerun(shm_vs_gloo_run.part, request.node.nodeid)
        )
        return _speedup(speedup_path, hw, shared_jobs.rerun, shm, request)[0]

    results.check_all(found, footer=table, remeasure=again)


def _speedup(path: str, hw: Any, run_part: Any, shm_run: PartRun | None, request: Any) -> Any:
    """The transport and speedup checks and the table of both sides: NCCL's from the parts
    ``run_part`` runs (and their logs), the CPU analogue's from ``shm_run``."""
    sizes = plans.speedup_sizes(hw)
    transports: list[Check] = []
    untrusted = None
    if path == "nccl":
        fast, slow = (
            run_part(part, request.node.nodeid)
            for part in plans.speedup_parts(hw, get_session(request.config).settings)
        )
        read = [sweep_busbw(summarize_sweep(run.values)) for run in (fast, slow)]
        origin = f"jobs {fast.job_id} and {slow.job_id}"
        comparison = pair(*read, fast_name=FAST, slow_name=SLOW, sizes=sizes, origin=origin)
        advice = P2P_ADVICE
        transports, untrusted = transport_checks(_side_logs(FAST, fast), _side_logs(SLOW, slow))
    else:
        assert shm_run is not None
        try:
            comparison = shm_vs_gloo(shm_run.values, sizes)
        except ValueError as exc:  # wrong sums: the fast path is broken, not slow
            pytest.fail(f"{exc} (job dir {shm_run.job_dir})", pytrace=False)
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
        advice = (
            "A ratio near 1 means DeepSpeed's shared-memory all_reduce is no faster than gloo over loopback TCP: "
            "usually other processes competing for the CPUs (the shm path spins while it waits); the 1-minute "
            f"load average after the job was {load:.1f} on {cpus} CPUs."
        )
    speedup = checks.speedup_checks(hw, comparison, advice, untrusted)
    return [*transports, *speedup], comparison.table()


def _side_logs(name: str, run: PartRun) -> SideLogs:
    """The side's own environment and every rank's log (NCCL's INFO lines land there)."""
    logs = sorted(Path(run.job_dir).glob("rank-*.log"), key=lambda p: int(p.stem.rpartition("-")[2]))
    return SideLogs(name, run.part.env, [(p.name, p.read_text(errors="replace")) for p in logs])


def _isolated(
    hw: Any, shared_jobs: Any, request: Any, key: str, env: Mapping[str, str], nodes: int, how: str
) -> Any:
    _setting(hw, key)
    name = f"nvlink-{key.removesuffix('_min_busbw').replace('_', '-')}"
    part = plans.isolated_part(hw, env, nodes, name, get_session(request.config).settings)
    run = shared_jobs.run(part, request.node.nodeid)
    size = plans.speedup_sizes(hw)[-1]
    repeats = sweep_busbw(summarize_sweep(run.values))[size]
    scope = "inter-node" if nodes > 1 else "intra-node"
    return checks.isolated_check(hw, key, scope, size, repeats, f"{how} (job dir {run.job_dir})")


@NVLINK
def test_isolated_intra_node_busbw(hw: Any, shared_jobs: Any, request: Any, results: Any) -> None:
    """Intra-node all_reduce over NVLink alone: no shared memory, P2P only between NVLink peers."""
    how = "inside one node with NCCL_SHM_DISABLE=1 NCCL_P2P_LEVEL=NVL: slow here and fine elsewhere points at NVLink"
    results.check_all(
        [_isolated(hw, shared_jobs, request, "isolated_intra_min_busbw", plans.NVLINK_ONLY, 1, how)]
    )


@pytest.mark.gpucluster(needs=["nccl", "multi-node"])
def test_isolated_inter_node_busbw(
    hw: Any, shared_jobs: Any, gpucluster_session: Any, request: Any, results: Any
) -> None:
    """All_reduce across nodes over the network alone: no P2P, no shared memory."""
    nodes = max(2, plans.nodes_for(hw, gpucluster_session.available_nodes))
    how = (
        f"across {nodes} nodes with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0, so every byte "
        "crosses the network: "
        "slow here and fine intra-node points at the NICs, cables or switches"
    )
    results.check_all(
        [_isolated(hw, shared_jobs, request, "isolated_inter_min_busbw", plans.NETWORK_ONLY, nodes, how)]
    )
