"""The pairwise burn-in's two rounds joined with a generated fabric (`checks/burnin/fabric_path.py`):
the element all slow pairs cross becomes a ``fabric.ib.path`` check with its action, a node that
explains them stays a node, and hosts the fabric does not know leave the join out."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_gpucluster.burnin.pairwise import Pair, PairResult, localize
from pytest_gpucluster.checks.burnin.fabric_path import fabric_path, outcomes_of
from pytest_gpucluster.parsers.ib_fabric import build_fabric
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate

HOSTS = [f"gpu-node-{i:03d}" for i in range(1, 9)]
MODEL = build_fabric(generate(TopologySpec(nodes=8, rails=1, nodes_per_leaf=2)).text())
"""Leaves leaf-r0-01..04 with two nodes each; gpu-node-005 and -006 under leaf-r0-03."""


def runner(slow: Callable[[str, str], bool]) -> Callable[[int, Sequence[Pair]], list[PairResult]]:
    return lambda rnd, pairs: [PairResult((a, b), 3e9 if slow(a, b) else 10e9) for a, b in pairs]


def test_two_suspect_nodes_under_one_leaf_become_the_leaf() -> None:
    under = {"gpu-node-005", "gpu-node-006"}
    found = localize(HOSTS, runner(lambda a, b: bool(under & {a, b})), tolerance=0.25)
    assert sorted(s.node for s in found.suspects) == sorted(under)
    assert (
        sum(p.slow for p in outcomes_of(found)) == 3
    )  # (005,006) in round 1, each with a good node in round 2
    path = fabric_path(MODEL, found)
    assert path is not None and path.is_fabric
    assert (path.verdict.element, path.verdict.slow, path.verdict.fast) == ("leaf leaf-r0-03", 3, 0)
    assert path.check.verdict == "fail" and path.check.labels == {"device": "leaf leaf-r0-03"}
    (finding,) = findings_of([Measurement.of(path.check, test_id="t", time=0.0)])
    assert (finding.reason, finding.action, finding.port) == (
        "hardware",
        "reseat/replace cable or NIC",
        "leaf leaf-r0-03",
    )
    assert finding.message.endswith(
        "-> check leaf-r0-03 (the switch, and its ports and cables to these nodes' HCAs)"
    )


def test_one_slow_node_stays_a_node_and_unknown_hosts_leave_the_join_out() -> None:
    found = localize(HOSTS, runner(lambda a, b: "gpu-node-005" in (a, b)), tolerance=0.25)
    path = fabric_path(MODEL, found)
    assert path is not None and not path.is_fabric and path.verdict.element == "host gpu-node-005"
    assert path.line().endswith("the fabric is not to blame")
    others = [h.replace("gpu-node", "cpu-node") for h in HOSTS]
    found = localize(others, runner(lambda a, b: "cpu-node-005" in (a, b)), tolerance=0.25)
    assert fabric_path(MODEL, found) is None
    assert fabric_path(MODEL, localize(HOSTS, runner(lambda a, b: False), tolerance=0.25)) is None


def test_the_report_lists_the_element_before_the_nodes(tmp_path: Path) -> None:
    """The checks as test_pairwise_localization records them (the element first, the nodes' count
    after it, no suspects drained): the sign-off report's findings name the leaf with its action."""
    from pytest_gpucluster.checks.burnin.peers import pairwise_checks
    from pytest_gpucluster.cli import main

    under = {"gpu-node-005", "gpu-node-006"}
    found = localize(HOSTS, runner(lambda a, b: bool(under & {a, b})), tolerance=0.25)
    path = fabric_path(MODEL, found)
    assert path is not None
    checks = [path.check, *pairwise_checks(found, 6)]
    run = json.loads((Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json").read_text())
    run["measurements"] = [
        Measurement.of(c, test_id="acceptance/test_burnin.py::test_pairwise_localization", time=0.0).to_json()
        for c in checks
    ]
    (tmp_path / "results.json").write_text(json.dumps(run))
    assert main(["report", str(tmp_path / "results.json"), "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    lines = report.splitlines()
    # the summary's cluster row: the element first, the nodes' count after it
    summary = next(line for line in lines if line.startswith("| cluster |") and "fabric.ib.path" in line)
    assert summary.index("leaf leaf-r0-03: fabric.ib.path") < summary.index("burnin.pairwise_suspects")
    # the findings table: the leaf, the cable rung, and what to check
    finding = next(line for line in lines if line.startswith("| leaf leaf-r0-03 | fabric.ib.path"))
    assert (
        "| hardware | reseat/replace cable or NIC |" in finding
        and "-> check leaf-r0-03 (the switch" in finding
    )


def test_a_generated_fabric_takes_the_hosts_names() -> None:
    import pytest

    topology = generate(TopologySpec(nodes=2, rails=2, hosts=("ns-a", "ns-b")))
    assert topology.hcas == ("ns-a mlx5_0", "ns-a mlx5_1", "ns-b mlx5_0", "ns-b mlx5_1")
    assert topology.hca_port(1, 1) == ("leaf-r1-01", 2)
    for hosts in (("ns-a",), ("ns a", "ns-b")):
        with pytest.raises(ValueError, match="hosts must name each of the 2 nodes once"):
            TopologySpec(nodes=2, hosts=hosts)
