"""Pairwise localization for real: four network namespaces stand in for four nodes, one made slow.

The namespaces hang off one bridge (in a fifth, "switch" namespace, so the host's own network is
never touched), each with its own hostname and /etc/hosts (the ``netns`` remote-exec preset,
FEASIBILITY §1 variant B). One node's link is throttled with ``tc ... tbf rate 100mbit`` on its
veth (``netem`` delay is not available here): a slow NIC, as a real cluster has them. Where tbf is
refused, the slow node sleeps in every iteration instead (``slow_hosts``, keyed by hostname), and
the test says so. Where namespaces cannot be made at all, each "node" is a local rank in one job
(``LocalGroupRunner``), and the test prints why.

Names are unique per xdist worker and process; everything is removed in the finalizer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_gpucluster.burnin.drain import SUSPECTS_FILE, drain_commands, shell_line, write_suspects
from pytest_gpucluster.burnin.pairwise import localize
from pytest_gpucluster.burnin.runner import ClusterPairRunner, LocalGroupRunner
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.process import find_job_pids

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

NODES = 4
SLOW = 2
"""The index of the node made slow: in round 1's second pair."""
RATE = "100mbit"
PAIR_OPTIONS = {"size_bytes": 1 << 20, "iters": 10}
TOLERANCE = 1.0
"""A pair at half the healthy busbw fails; a 100 Mbit/s link is ~40x below a veth."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class Nodes:
    names: tuple[str, ...]
    """Network namespaces (and hostnames); empty when they could not be made."""
    slow_how: str
    """How the slow node was made slow, or why there are no namespaces."""
    slow_options: dict


@pytest.fixture(scope="module")
def four_nodes() -> Iterator[Nodes]:
    missing = [tool for tool in ("ip", "unshare", "tc") if shutil.which(tool) is None]
    if missing:
        yield Nodes(
            (), f"'{missing[0]}' is not installed, so network namespaces cannot stand in for nodes", {}
        )
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw")
    index = int(worker[2:]) if worker[2:].isdigit() else 99
    pid = os.getpid() % 100000
    tag = f"gpb{index}p{pid}"
    switch = f"{tag}sw"
    names = tuple(f"{tag}n{i}" for i in range(NODES))
    subnet = f"10.79.{100 + index % 100}"
    made: list[str] = []
    etc_dirs: list[Path] = []
    try:
        try:
            _ip("netns", "add", switch)
        except (subprocess.CalledProcessError, OSError) as exc:
            reason = (getattr(exc, "stderr", "") or str(exc)).strip()
            yield Nodes(
                (), f"network namespaces cannot be created here ('ip netns add' failed: {reason})", {}
            )
            return
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{subnet}.{i + 1} {n}\n" for i, n in enumerate(names))
        for i, ns in enumerate(names):
            _ip("netns", "add", ns)
            made.append(ns)
            node_end, switch_end = f"gb{pid}w{index}a{i}", f"gb{pid}w{index}b{i}"
            _ip("link", "add", node_end, "type", "veth", "peer", "name", switch_end)
            _ip("link", "set", node_end, "netns", ns)
            _ip("link", "set", switch_end, "netns", switch)
            _ip("-n", ns, "link", "set", node_end, "name", "gpc0")
            _ip("-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", "gpc0")
            _ip("-n", ns, "link", "set", "gpc0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", switch, "link", "set", switch_end, "master", "br0")
            _ip("-n", switch, "link", "set", switch_end, "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            etc_dirs.append(etc)
            (etc / "hosts").write_text(hosts)
        shaping = ["tc", "-n", names[SLOW], "qdisc", "add", "dev", "gpc0", "root", "tbf"]
        shaping += ["rate", RATE, "burst", "32kbit", "latency", "400ms"]
        done = subprocess.run(shaping, capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            yield Nodes(names, f"its link throttled to {RATE} ({shell_line(shaping)})", {})
        else:
            why = (done.stderr or done.stdout).strip()
            print(f"tc tbf was refused ({why}); the slow node sleeps 20 ms per iteration instead")
            yield Nodes(
                names,
                f"20 ms sleep per iteration (tc tbf refused: {why})",
                {"slow_hosts": {names[SLOW]: 0.02}},
            )
    finally:
        for ns in made:  # deleting a namespace also removes its ends of the veth pairs
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for etc in etc_dirs:
            shutil.rmtree(etc, ignore_errors=True)


def test_pairwise_names_the_slow_node_of_four_within_two_rounds(four_nodes: Nodes, tmp_path: Path) -> None:
    start = time.monotonic()
    if four_nodes.names:
        nodes = list(four_nodes.names)
        spec = ClusterSpec(hosts=tuple((ns, 1) for ns in nodes), nproc_per_node=1, source="netns")
        cluster = Cluster(
            spec, get_launcher("torchrun"), tmp_path / "results", remote_exec="netns", failure_grace=2.0
        )
        runner: ClusterPairRunner | LocalGroupRunner = ClusterPairRunner(
            cluster, timeout_s=120, **PAIR_OPTIONS, options=four_nodes.slow_options
        )
    else:  # the stand-in: each "node" is one local rank, pairs run as subgroups of one job per round
        print(f"pairwise localization on local rank groups, not namespaces: {four_nodes.slow_how}")
        nodes = [f"rank-group-{i}" for i in range(NODES)]
        spec = ClusterSpec(hosts=(("localhost", NODES),), nproc_per_node=NODES, source="local")
        cluster = Cluster(spec, get_launcher("torchrun"), tmp_path / "results")
        runner = LocalGroupRunner(
            cluster, nodes, timeout_s=120, **PAIR_OPTIONS, options={"slow_ranks": {str(SLOW): 0.02}}
        )

    found = localize(nodes, runner, tolerance=TOLERANCE)
    elapsed = time.monotonic() - start
    print(f"slow node {nodes[SLOW]}: {four_nodes.slow_how}")
    print("\n".join(found.lines()))
    print(f"{runner.pair_tests} pair tests, {runner.jobs} jobs, {elapsed:.1f} s")

    assert [(s.node, s.kind) for s in found.suspects] == [(nodes[SLOW], "node")], "\n".join(found.lines())
    assert len(found.rounds) == 2
    # Round 1: the 2 disjoint pairs; round 2: each node of the failing pair with a known-good one.
    assert [j.pair for j in found.rounds[0]] == [(nodes[0], nodes[1]), (nodes[2], nodes[3])]
    assert [j.pair for j in found.rounds[1]] == [(nodes[2], nodes[0]), (nodes[3], nodes[1])]
    assert runner.pair_tests == found.pair_tests == NODES // 2 + 2
    reference = found.reference
    assert reference is not None
    slow_pairs = [j for r in found.rounds for j in r if nodes[SLOW] in j.pair]
    assert all(
        j.result.busbw is not None and j.result.busbw * (1 + TOLERANCE) < reference for j in slow_pairs
    )

    # The drain list names exactly that node; nothing is run.
    path = tmp_path / SUSPECTS_FILE
    write_suspects(path, found.suspects)
    data = json.loads(path.read_text())
    assert [s["node"] for s in data["suspects"]] == [nodes[SLOW]]
    assert drain_commands(found.suspects)[0][:3] == ["scontrol", "update", f"NodeName={nodes[SLOW]}"]
    if isinstance(runner, ClusterPairRunner):
        assert runner.jobs == 4
        assert all(find_job_pids(job_id) == [] for job_id in runner.job_ids)
