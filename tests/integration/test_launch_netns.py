"""A real two-"node" job: two network namespaces joined by a veth pair stand in for two hosts.

FEASIBILITY §1, variant B: each namespace gets its own hostname (``unshare --uts``, done by the
``netns`` remote-exec preset) and its own /etc/hosts (``/etc/netns/<ns>/hosts``, which
``ip netns exec`` bind-mounts), so the namespaces behave like real nodes: no GLOO_SOCKET_IFNAME,
no is_host, no --local-addr. One torchrun agent runs in each, joined by c10d rendezvous.

Names are unique per xdist worker and process; everything is removed in the finalizer.
Skipped, with the reason, where namespaces cannot be made (not root, no iproute2, no unshare).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.process import find_job_pids
from pytest_gpucluster.workloads import basic

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def two_nodes():
    """Two namespaces ``<tag>n0``/``<tag>n1`` on 10.77.<k>.1/.2, each its own hostname: the names."""
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"'{tool}' is not installed, so network namespaces cannot stand in for nodes")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw")
    index = int(worker[2:]) if worker[2:].isdigit() else 99
    tag = f"gpc{index}p{os.getpid() % 100000}"
    names = [f"{tag}n0", f"{tag}n1"]
    veths = [f"gv{os.getpid() % 100000}w{index}{side}" for side in "ab"]
    subnet = f"10.77.{100 + index % 100}"
    try:
        _ip("netns", "add", names[0])
    except (subprocess.CalledProcessError, OSError) as exc:
        reason = getattr(exc, "stderr", "") or str(exc)
        pytest.skip(f"network namespaces cannot be created here ('ip netns add' failed: {reason.strip()})")
    made_dirs: list[Path] = []
    try:
        _ip("netns", "add", names[1])
        _ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        hosts = f"127.0.0.1 localhost\n{subnet}.1 {names[0]}\n{subnet}.2 {names[1]}\n"
        for i, (ns, veth) in enumerate(zip(names, veths, strict=True)):
            _ip("link", "set", veth, "netns", ns)
            _ip("-n", ns, "link", "set", veth, "name", "gpc0")
            _ip("-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", "gpc0")
            _ip("-n", ns, "link", "set", "gpc0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")  # traffic to the node's own address goes over lo
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            made_dirs.append(etc)
            (etc / "hosts").write_text(hosts)
        yield names
    finally:
        for ns in names:  # deleting a namespace also removes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for etc in made_dirs:
            shutil.rmtree(etc, ignore_errors=True)


def test_gloo_all_reduce_across_two_namespaces(two_nodes, tmp_path):
    spec = ClusterSpec(hosts=tuple((ns, 1) for ns in two_nodes), nproc_per_node=1, source="netns")
    cluster = Cluster(spec, get_launcher("torchrun"), tmp_path / "results", remote_exec="netns")
    result = cluster.run(basic.all_reduce_sum, timeout=120)
    values = result.values
    assert [v["sum"] for v in values] == [3.0, 3.0]
    # Each rank ran in its own "node": the hostname it saw is its namespace's.
    assert sorted(r.host for r in result.ranks) == sorted(two_nodes)
    assert [c.host for c in result.commands] == list(two_nodes)
    assert all(c.argv[:3] == ("ip", "netns", "exec") for c in result.commands)
    assert find_job_pids(result.job_id) == []


def test_an_unreachable_node_fails_fast_and_is_named(two_nodes, tmp_path):
    ghost = f"{two_nodes[0]}gone"  # a "node" whose namespace does not exist: its agent cannot start
    spec = ClusterSpec(hosts=((two_nodes[0], 1), (ghost, 1)), nproc_per_node=1, source="netns")
    cluster = Cluster(
        spec, get_launcher("torchrun"), tmp_path / "results", remote_exec="netns", failure_grace=2.0
    )
    start = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        cluster.run(basic.all_reduce_sum, timeout=120)
    assert time.monotonic() - start < 60
    result = failed.value.result
    assert not result.ok
    report = str(failed.value)
    assert report == result.failure_report()
    # Nobody joined, so c10d never assigned node ranks: the dead agent is what names the node.
    assert "never started" in report
    assert f"the agent on {ghost} exited with code 255; the end of agent-{ghost}.log:" in report
    assert "Cannot open network namespace" in report
    assert find_job_pids(result.job_id) == []
