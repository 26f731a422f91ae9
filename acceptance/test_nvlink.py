"""NVLink: GPUs linked as the profile says, every link up at speed, traffic really crossing the
links, and the fast path as much faster than the slow one as the profile demands.

A node with a degraded NVLink (a link down, a GPU fallen back to PCIe) passes most smoke tests
and then trains 20-70% slower. People check NVLink three ways, and so do these tests, each
against a key of the profile's ``nvlink:`` section:

(a) ``test_topology``: every GPU pair in ``nvidia-smi topo -m`` shows ``nvlink.topology``
    (e.g. ``NV18``) on every node; the pairs that do not are named.
(b) ``test_links_up``: each GPU has ``nvlink.links_per_gpu`` links up at ``nvlink.min_link_speed``
    or faster (NVML, or ``nvidia-smi nvlink -s``); the GPUs and links that are not are named.
(c) ``test_counters_move_during_all_reduce``: the per-link byte counters of every GPU grow during
    an intra-node all_reduce by at least ``nvlink.min_counter_fraction`` of the bytes a ring
    all_reduce must send per GPU, 2(n-1)/n x size per call; a GPU whose counters did not move
    is named.
(d) ``test_speedup``: one intra-node all_reduce, two ways, in one test, the ratio of their busbw
    against ``nvlink.min_speedup`` at each ``nvlink.speedup_sizes``. On a cuda profile the two
    ways are NCCL as configured and NCCL with ``NCCL_P2P_DISABLE=1`` (no NVLink P2P; NCCL falls
    back to shared memory through the host); on a cpu profile, the real CPU analogue:
    DeepSpeed's shared-memory all_reduce against plain gloo over loopback TCP, so the gate runs
    in CI. Both sides' busbw are recorded (``nvlink.speedup.busbw``); ``nvlink.min_busbw``,
    where set, gates the fast side.
(e) ``test_isolated_*_busbw``: where the profile sets ``isolated_intra_min_busbw`` /
    ``isolated_inter_min_busbw``, intra-node busbw over NVLink only (``NCCL_SHM_DISABLE=1
    NCCL_P2P_LEVEL=NVL``) and inter-node busbw over the network only (``NCCL_P2P_DISABLE=1
    NCCL_SHM_DISABLE=1``), each at the largest of ``nvlink.speedup_sizes`` and against its own
    threshold, so a slow result points at the fabric at fault.

The NVLink-specific tests skip, naming the missing capability, on machines without NVLink.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import pytest

from pytest_gpucluster.checks.comparison import (
    Comparison,
    compare_runs,
    shm_vs_gloo,
    spread_of,
    sweep_busbw,
    sweep_span,
)
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.maths.sweep import summarize_sweep
from pytest_gpucluster.parsers.nvidia_topo import parse_topo_text, topology_mismatches
from pytest_gpucluster.plugin import get_session
from pytest_gpucluster.profiles.schema import NvlinkSection
from pytest_gpucluster.results.recorder import ThresholdFailure, format_value

INVENTORY = "pytest_gpucluster.workloads.nvlink_probe:inventory"
TRAFFIC = "pytest_gpucluster.workloads.nvlink_probe:traffic"
SWEEP = "pytest_gpucluster.workloads.collectives:sweep"
SHM_VS_GLOO = "pytest_gpucluster.workloads.shm_allreduce:compare"
GPU_TIMEOUT_S = 300.0
SHM_TIMEOUT_S = 300.0  # a cold DeepSpeed shm op build alone takes ~30 s on 2 cores
TRAFFIC_OPTIONS = {"size_bytes": 256 << 20, "iters": 10}
DEFAULT_COUNTER_FRACTION = 0.5
"""Used where the profile sets no ``min_counter_fraction``: a ring moves the full 2(n-1)/n, and
NCCL's NVLS all_reduce on an NVSwitch node about (1 + 1/n) / (2(n-1)/n) of it, 64% at 8 GPUs."""
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}
NVLINK_ONLY = {"NCCL_SHM_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"}
NETWORK_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "speedup_path" not in metafunc.fixturenames:
        return
    profile = get_session(metafunc.config).profile.model
    if profile.cluster.device == "cuda":
        path = pytest.param(
            "nccl", id="nccl-p2p-vs-p2p-disabled", marks=pytest.mark.gpucluster(needs=["nccl", "nvlink"])
        )
    else:
        path = pytest.param("cpu", id="shm-vs-gloo")
    metafunc.parametrize("speedup_path", [path])


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _section(hw) -> NvlinkSection:
    """The profile's ``nvlink:`` section, or a skip saying there is none."""
    if hw.nvlink is None:
        pytest.skip(f"profile {hw.name} has no nvlink: section, so there is nothing to check NVLink against")
    return hw.nvlink


def _setting(hw, key: str) -> Any:
    """The profile's ``nvlink.<key>``, or a skip saying the profile does not ask for it."""
    value = getattr(_section(hw), key)
    if value is None:
        pytest.skip(f"profile {hw.name} sets no nvlink.{key}")
    return value


def _values(job) -> list[Any]:
    try:
        return job.values  # JobFailed (every rank's story) unless all ranks finished
    except JobSkipped as exc:
        pytest.skip(str(exc))


def _nodes(hw, session) -> int:
    return max(1, min(hw.cluster.nodes, session.available_nodes))


def _gate(results, checks: list[dict[str, Any]], footer: str = "") -> None:
    """Every check recorded, all failures reported together (a run shows the whole damage),
    then ``footer`` once (a table the failures share)."""
    __tracebackhide__ = True
    failures = []
    for check in checks:
        try:
            results.check(**check)
        except ThresholdFailure as exc:
            failures.append(str(exc))
    if failures:
        raise ThresholdFailure("\n".join([*failures, footer] if footer else failures))


def _gbs(value: float) -> str:
    return format_value(value, "B/s")


@pytest.fixture(scope="module")
def inventory(cluster, hw, gpucluster_session) -> list[dict[str, Any]]:
    """Every node's GPUs, links and topology matrix: one rank per node, no process group."""
    job = cluster.run(
        INVENTORY,
        nodes=_nodes(hw, gpucluster_session),
        nproc_per_node=1,
        timeout=GPU_TIMEOUT_S,
        init_process_group=False,
        name="nvlink-inventory",
    )
    return _values(job)


# --------------------------------------------------------------------------------------------
# (a) topology, (b) links
# --------------------------------------------------------------------------------------------


@pytest.mark.gpucluster(needs=["nvlink"])
def test_topology(hw, inventory, results) -> None:
    """Every GPU pair on every node is linked as ``nvlink.topology`` says."""
    expected = _setting(hw, "topology")
    problems: list[str] = []
    pairs = 0
    for node in inventory:
        host = node["host"]
        if node.get("topo_text") is None:
            problems.append(f"{host}: the matrix could not be read ({node.get('topo_error')})")
            continue
        try:
            topo = parse_topo_text(node["topo_text"])
        except ParseError as exc:
            problems.append(f"{host}: {exc}")
            continue
        pairs += len(topo.gpus) * (len(topo.gpus) - 1) // 2
        problems += [
            f"{host} {a}-{b} is {cell or 'unreadable'}" for a, b, cell in topology_mismatches(topo, expected)
        ]
    results.check(
        "nvlink.topology_mismatches",
        len(problems),
        0,
        unit="GPU pairs",
        comparison="<=",
        labels={"expected": expected, "nodes": len(inventory), "pairs": pairs},
        source=f"profile {hw.name}: nvlink.topology",
        context=(
            f"Not linked by {expected}: {'; '.join(problems)}. A pair at SYS, NODE, PHB, PXB or PIX talks over "
            "PCIe or the CPU interconnect; on that host look at `nvidia-smi topo -m` and `nvidia-smi nvlink -s`."
        ),
    )


@pytest.mark.gpucluster(needs=["nvlink"])
def test_links_up(hw, inventory, results) -> None:
    """Each GPU has ``links_per_gpu`` links up, none slower than ``min_link_speed``."""
    want_links, min_speed = _section(hw).links_per_gpu, _section(hw).min_link_speed
    if want_links is None and min_speed is None:
        pytest.skip(f"profile {hw.name} sets neither nvlink.links_per_gpu nor nvlink.min_link_speed")
    fewest, slowest = None, None
    problems: list[str] = []
    gpus = 0
    for node in inventory:
        if not node["gpus"]:
            problems.append(f"{node['host']}: no GPU found ({node['links_source']})")
            fewest = 0
        for index, gpu in sorted(node["gpus"].items(), key=lambda kv: int(kv[0])):
            gpus += 1
            links = gpu["links"]
            down = sorted((n for n, link in links.items() if not link["active"]), key=int)
            speeds = {n: link["speed_gbs"] for n, link in links.items() if link["active"]}
            slow = sorted(
                (
                    n
                    for n, s in speeds.items()
                    if min_speed is not None and (s is None or s * 1e9 < min_speed)
                ),
                key=int,
            )
            up_at_speed = len(speeds) - len(slow)
            fewest = up_at_speed if fewest is None else min(fewest, up_at_speed)
            known = [s * 1e9 for s in speeds.values() if s is not None]
            if known:
                slowest = min(known) if slowest is None else min(slowest, *known)
            where = f"{node['host']} GPU {index}"
            if down:
                problems.append(f"{where}: link{'s' if len(down) > 1 else ''} {', '.join(down)} down")
            if slow:
                shown = ", ".join(
                    f"{n} at {'unknown speed' if speeds[n] is None else f'{speeds[n]:g} GB/s'}" for n in slow
                )
                problems.append(f"{where}: link {shown}")
            if want_links is not None and len(links) < want_links and not down:
                problems.append(f"{where}: only {len(links)} link(s) reported")
    context = (
        f"{'; '.join(problems) or 'every link is up'} (from {inventory[0]['links_source'] if inventory else '?'}). "
        "A link down or slow usually means a reseat, a bad cable/board or a fabric manager problem: "
        "`nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` on that host."
    )
    checks = []
    if want_links is not None:
        checks.append(
            dict(
                metric="nvlink.links_up",
                value=float(fewest or 0),
                threshold=want_links,
                unit="links",
                labels={"gpus": gpus, "min_link_speed": _gbs(min_speed) if min_speed else "any"},
                source=f"profile {hw.name}: nvlink.links_per_gpu",
                context=f"The GPU with the fewest links up at speed has {fewest or 0}. {context}",
            )
        )
    if min_speed is not None:
        checks.append(
            dict(
                metric="nvlink.link_speed",
                value=slowest or 0.0,
                threshold=min_speed,
                unit="B/s",
                labels={"gpus": gpus},
                source=f"profile {hw.name}: nvlink.min_link_speed",
                context=f"The slowest active link. {context}"
                if want_links is None
                else "The slowest active link.",
            )
        )
    _gate(results, checks)


# --------------------------------------------------------------------------------------------
# (c) counters
# --------------------------------------------------------------------------------------------


@pytest.mark.gpucluster(needs=["nccl", "nvlink"])
def test_counters_move_during_all_reduce(hw, cluster, nccl_env, gpucluster_session, results) -> None:
    """Every GPU's NVLink counters grow by a fair share of what the all_reduce must move."""
    if _section(hw).min_counter_fraction is not None:
        threshold = hw.nvlink.min_counter_fraction
        source = f"profile {hw.name}: nvlink.min_counter_fraction"
    else:
        threshold = DEFAULT_COUNTER_FRACTION
        source = f"default {threshold:.0%} (profile {hw.name} sets no nvlink.min_counter_fraction)"
    job = cluster.run(
        TRAFFIC,
        nodes=_nodes(hw, gpucluster_session),
        env=nccl_env,
        timeout=GPU_TIMEOUT_S,
        options=TRAFFIC_OPTIONS,
        name="nvlink-traffic",
    )
    values = sorted(_values(job), key=lambda v: int(v["rank"]))
    worst = float("inf")
    short: list[str] = []
    for v in values:
        expected = float(v["expected_bytes"])
        moved = min(v["tx_bytes"], v["rx_bytes"])
        fraction = moved / expected if expected > 0 else 0.0
        worst = min(worst, fraction)
        where = f"{v['host']} GPU {v['gpu']['pci_bus_id']} (rank {v['rank']})"
        results.record(
            "nvlink.gpu_counter_fraction",
            fraction,
            unit="fraction",
            scope="intra-node",
            labels={"host": v["host"], "gpu": v["gpu"]["pci_bus_id"]},
        )
        if fraction < threshold:
            still = [n for n, link in v["links"].items() if not link["tx_bytes"] and not link["rx_bytes"]]
            short.append(
                f"{where}: {'counters did not move' if moved == 0 else f'{fraction:.0%}'} "
                f"(sent {v['tx_bytes']:,} B, received {v['rx_bytes']:,} B of {expected:,.0f} B; "
                f"{len(still)} of {len(v['links'])} links idle; counters from {v['counter_source']})"
            )
    first = values[0] if values else {}
    results.check(
        "nvlink.counter_fraction",
        worst if values else 0.0,
        threshold,
        unit="fraction",
        scope="intra-node",
        labels={
            "size_bytes": first.get("size_bytes"),
            "iters": first.get("iters"),
            "gpus": len(values),
        },
        source=source,
        context=(
            f"{'; '.join(short)}. A GPU whose NVLink counters barely move sends its share another way "
            "(PCIe or host memory): check `nvidia-smi topo -m`, NCCL_P2P_LEVEL/NCCL_P2P_DISABLE in the environment "
            f"and NCCL_DEBUG=INFO 'via P2P' lines (job dir {job.job_dir})."
        ),
    )


# --------------------------------------------------------------------------------------------
# (d) speedup
# --------------------------------------------------------------------------------------------


def _speedup_gpu(hw, cluster, nccl_env, sizes: list[int]) -> Comparison:
    span, _ = sweep_span(sizes)
    options = {
        "collective": "all_reduce",
        **span,
        "in_place": False,
        "repeat": hw.collectives.repeat,
        "warmup": 5,
        "iters": 20,
    }
    try:
        return compare_runs(
            cluster,
            SWEEP,
            options=options,
            env_fast=nccl_env,
            env_slow={**nccl_env, **P2P_OFF},
            fast_name="nccl-p2p",
            slow_name="nccl-p2p-disabled",
            sizes=sizes,
            nodes=1,
            timeout=GPU_TIMEOUT_S,
            name="nvlink-speedup",
        )
    except JobSkipped as exc:
        pytest.skip(str(exc))


def _speedup_cpu(hw, cluster, sizes: list[int]) -> Comparison:
    span, _ = sweep_span(sizes)
    options = {**span, "warmup": 3, "iters": 10, "repeat": max(hw.collectives.repeat, 5), "dtype": "float32"}
    job = cluster.run(SHM_VS_GLOO, nodes=1, timeout=SHM_TIMEOUT_S, options=options, name="nvlink-speedup-shm")
    values = _values(job)
    try:
        return shm_vs_gloo(values, sizes)
    except ValueError as exc:  # wrong sums: the fast path is broken, not slow
        pytest.fail(f"{exc} (job dir {job.job_dir})", pytrace=False)


def test_speedup(speedup_path: str, hw, cluster, nccl_env, results) -> None:
    """Fast path over slow path, per size, against ``nvlink.min_speedup`` (module doc, (d))."""
    min_speedup = _setting(hw, "min_speedup")
    sizes = sorted({int(s) for s in hw.nvlink.speedup_sizes})
    if speedup_path == "nccl":
        comparison = _speedup_gpu(hw, cluster, nccl_env, sizes)
        advice = (
            "A ratio near 1 means NCCL does not use NVLink even where allowed: check `nvidia-smi topo -m`, "
            "NCCL_P2P_LEVEL and the NCCL_DEBUG=INFO 'via P2P' lines."
        )
    else:
        comparison = _speedup_cpu(hw, cluster, sizes)
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
        advice = (
            "A ratio near 1 means DeepSpeed's shared-memory all_reduce is no faster than gloo over loopback "
            "TCP: usually other processes competing for the CPUs (the shm path spins while it waits); "
            f"the 1-minute load average after the job was {load:.1f} on {cpus} CPUs."
        )
    for point in comparison.points:
        for side, busbw, spread in (
            (comparison.fast, point.fast_busbw, point.fast_spread()),
            (comparison.slow, point.slow_busbw, point.slow_spread()),
        ):
            results.record(
                "nvlink.speedup.busbw",
                busbw,
                unit="B/s",
                scope="intra-node",
                labels={"size_bytes": point.size_bytes, "transport": side},
                spread=spread,
            )
    checks = []
    for point in comparison.points:
        if hw.nvlink.min_busbw is not None:
            checks.append(
                dict(
                    metric="nvlink.busbw",
                    value=point.fast_busbw,
                    threshold=hw.nvlink.min_busbw,
                    unit="B/s",
                    scope="intra-node",
                    labels={"size_bytes": point.size_bytes, "transport": comparison.fast},
                    spread=point.fast_spread(),
                    source=f"profile {hw.name}: nvlink.min_busbw",
                    context=f"all_reduce busbw on the fast path ({comparison.origin}).",
                )
            )
        checks.append(
            dict(
                metric="nvlink.speedup",
                value=point.ratio,
                threshold=min_speedup,
                unit="x",
                scope="intra-node",
                labels={"size_bytes": point.size_bytes, "pair": comparison.pair},
                spread=point.ratio_spread(),
                source=f"profile {hw.name}: nvlink.min_speedup",
                context=(
                    f"{comparison.fast} all_reduce busbw {_gbs(point.fast_busbw)} over {comparison.slow} "
                    f"{_gbs(point.slow_busbw)} ({comparison.origin}). {advice}"
                ),
            )
        )
    _gate(results, checks, footer=comparison.table())


# --------------------------------------------------------------------------------------------
# (e) isolation
# --------------------------------------------------------------------------------------------


def _isolated(hw, cluster, env: dict[str, str], nodes: int, name: str) -> tuple[int, tuple[float, ...], str]:
    size = int(max(hw.nvlink.speedup_sizes))
    options = {
        "collective": "all_reduce",
        "min_bytes": size,
        "max_bytes": size,
        "in_place": False,
        "repeat": hw.collectives.repeat,
    }
    job = cluster.run(SWEEP, nodes=nodes, env=env, timeout=GPU_TIMEOUT_S, options=options, name=name)
    busbw = sweep_busbw(summarize_sweep(_values(job)))
    return size, busbw[size], str(job.job_dir)


def _check_isolated(results, hw, metric: str, key: str, scope: str, measured, how: str) -> None:
    size, repeats, job_dir = measured
    results.check(
        metric,
        statistics.median(repeats),
        getattr(hw.nvlink, key),
        unit="B/s",
        scope=scope,
        labels={"size_bytes": size, "collective": "all_reduce"},
        spread=spread_of(repeats),
        source=f"profile {hw.name}: nvlink.{key}",
        context=f"all_reduce {how} (job dir {job_dir}).",
    )


@pytest.mark.gpucluster(needs=["nccl", "nvlink"])
def test_isolated_intra_node_busbw(hw, cluster, nccl_env, results) -> None:
    """Intra-node all_reduce over NVLink alone: no shared memory, P2P only between NVLink peers."""
    _setting(hw, "isolated_intra_min_busbw")
    measured = _isolated(hw, cluster, {**nccl_env, **NVLINK_ONLY}, 1, "nvlink-isolated-intra")
    how = "inside one node with NCCL_SHM_DISABLE=1 NCCL_P2P_LEVEL=NVL: slow here and fine elsewhere points at NVLink"
    _check_isolated(
        results, hw, "nvlink.isolated_intra.busbw", "isolated_intra_min_busbw", "intra-node", measured, how
    )


@pytest.mark.gpucluster(needs=["nccl", "multi-node"])
def test_isolated_inter_node_busbw(hw, cluster, nccl_env, gpucluster_session, results) -> None:
    """All_reduce across nodes over the network alone: no P2P, no shared memory."""
    _setting(hw, "isolated_inter_min_busbw")
    nodes = max(2, _nodes(hw, gpucluster_session))
    measured = _isolated(hw, cluster, {**nccl_env, **NETWORK_ONLY}, nodes, "nvlink-isolated-inter")
    how = (
        f"across {nodes} nodes with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, so every byte crosses the network: "
        "slow here and fine intra-node points at the NICs, cables or switches"
    )
    _check_isolated(
        results, hw, "nvlink.isolated_inter.busbw", "isolated_inter_min_busbw", "inter-node", measured, how
    )
