"""Slow pairs named as the fabric element they cross, on the real seams: the pairwise burn-in on four
network-namespace nodes joined with an ibsim fabric whose HCAs belong to those same hosts.

The fabric (`testbed.ib_topology`, ``hosts=`` the namespaces' names) puts nodes 0 and 1 under
leaf-r0-01 and nodes 2 and 3 under leaf-r0-02. Both of leaf-r0-02's nodes have their links
throttled (``tc tbf``, `NetnsTestbed.set_rate`): what a sick leaf does to the nodes under it. The
fabric model comes from the acceptance suite's own before-scan (`fabric_scan.suite_reading` with
``GPUCLUSTER_IB_TOOL_PREFIX`` set to the simulator's ``ibsim-run`` prefix); the pairs from
`burnin.pairwise.localize` over `ClusterPairRunner`, as test_pairwise_localization runs them.

Without the fabric the localization names nodes 2 and 3 as two suspects to drain; with it the
finding is leaf-r0-02, with the action, and its nodes are not drained. This is the join of a real
netns run with a real ibsim scan, not a whole acceptance run (that would cost a minute more of CI).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.burnin.pairwise import localize
from pytest_gpucluster.burnin.runner import ClusterPairRunner
from pytest_gpucluster.checks.burnin.fabric_path import fabric_path
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.fabric_scan import TOOL_PREFIX_ENV, suite_reading
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate
from pytest_gpucluster.testbed.ibsim import IbSim, missing_tools
from pytest_gpucluster.testbed.netns import NetnsTestbed, TestbedError

pytestmark = [
    pytest.mark.skipif(
        bool(missing_tools()), reason=f"no simulated IB fabric: not installed: {', '.join(missing_tools())}"
    ),
    pytest.mark.skipif(get_launcher("torchrun").available() is not None, reason="torch is not installed"),
]

RATE = "100mbit"
TOLERANCE = 3.0
"""As test_burnin_netns: a throttled pair runs ~12x below the slowest healthy pair seen on CI."""
PAIR_OPTIONS = {"size_bytes": 1 << 20, "iters": 10}


@pytest.fixture
def bed() -> Iterator[NetnsTestbed]:
    with netns_bed_or_skip(4) as bed:
        yield bed


def test_slow_pairs_under_one_leaf_are_named_as_the_leaf(
    bed: NetnsTestbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = list(bed.names)
    start = time.monotonic()
    spec = TopologySpec(nodes=4, rails=1, nodes_per_leaf=2, spines=2, speed=4, hosts=tuple(names))
    with IbSim(
        generate(spec).text(), tmp_path / "ibsim", sm=False
    ) as sim:  # one opensm sweep is enough to scan
        monkeypatch.setenv(TOOL_PREFIX_ENV, shlex.join(sim.prefix))
        said: list[str] = []
        model = suite_reading(said.append)
    assert model is not None, said
    scanned = time.monotonic() - start
    assert {n.host for n in model.nodes.values() if n.kind == "ca"} == set(names)

    options: dict = {}
    try:
        for node in names[2:]:
            bed.set_rate(node, RATE)
        how = f"links throttled to {RATE}"
    except TestbedError as exc:  # tbf refused: the two nodes sleep in every iteration instead
        options, how = {"slow_hosts": {n: 0.02 for n in names[2:]}}, f"20 ms sleep per iteration ({exc})"
    cluster_spec = ClusterSpec(hosts=tuple((n, 1) for n in names), nproc_per_node=1, source="netns")
    cluster = Cluster(
        cluster_spec, get_launcher("torchrun"), tmp_path / "results", remote_exec="netns", failure_grace=2.0
    )
    runner = ClusterPairRunner(cluster, timeout_s=120, **PAIR_OPTIONS, options=options)
    found = localize(names, runner, tolerance=TOLERANCE)
    print(
        f"ibsim up and scanned in {scanned:.1f} s; {runner.jobs} pair jobs in {time.monotonic() - start - scanned:.1f} s"
    )
    print(f"{names[2]} and {names[3]} under leaf-r0-02: {how}")
    print("\n".join(found.lines()))

    # the nodes alone: both of leaf-r0-02's nodes are suspects
    assert sorted(s.node for s in found.suspects) == names[2:], "\n".join(found.lines())
    path = fabric_path(model, found)
    assert path is not None and path.is_fabric
    print(path.line())
    assert (path.verdict.element, path.verdict.slow, path.verdict.fast) == ("leaf leaf-r0-02", 3, 0)
    assert path.line().endswith(
        "-> check leaf-r0-02 (the switch, and its ports and cables to these nodes' HCAs)"
    )

    # the check as the run records it, and the report's finding: a link-rung hardware finding on the leaf
    check = path.check
    assert (check.metric, check.verdict, check.labels) == (
        "fabric.ib.path",
        "fail",
        {"device": "leaf leaf-r0-02"},
    )
    (finding,) = findings_of([Measurement.of(check, test_id="acceptance/test_burnin.py::t", time=0.0)], [])
    assert (finding.reason, finding.action, finding.port) == (
        "hardware",
        "reseat/replace cable or NIC",
        "leaf leaf-r0-02",
    )
    assert "check leaf-r0-02" in finding.message
