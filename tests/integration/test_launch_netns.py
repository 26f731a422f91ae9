"""A real two-"node" job: two network namespaces on a bridge stand in for two hosts.

FEASIBILITY §1, variant B: each namespace gets its own hostname (``unshare --uts``, done by the
``netns`` remote-exec preset) and its own /etc/hosts (``/etc/netns/<ns>/hosts``, which
``ip netns exec`` bind-mounts), so the namespaces behave like real nodes: no GLOO_SOCKET_IFNAME,
no is_host, no --local-addr. One torchrun agent runs in each, joined by c10d rendezvous.

The namespaces come from `pytest_gpucluster.testbed.netns` (names unique per xdist worker and
process, everything removed afterwards); skipped, with its reason, where they cannot be made.
"""

from __future__ import annotations

import time

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.reaper import find_job_pids
from pytest_gpucluster.workloads import basic

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)


@pytest.fixture(scope="module")
def two_nodes():
    """Two namespaces on one bridge, each its own hostname (`testbed.netns`): their names."""
    with netns_bed_or_skip(2) as bed:
        yield bed.names


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
