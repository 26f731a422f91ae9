"""Pairwise localization with a fake runner: the slow node or link is named within two rounds, and
the number of pair tests grows linearly with the number of nodes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import drain_commands
from pytest_gpucluster.burnin.pairwise import (
    Pair,
    PairResult,
    first_round,
    localize,
    second_round,
    waves,
)

GB = 1e9


class FakeCluster:
    """A pair's busbw is the slower node's speed, times a link factor; some pairs' jobs fail."""

    def __init__(
        self,
        n: int,
        slow: dict[str, float] | None = None,
        links: dict[frozenset[str], float] | None = None,
        broken: Sequence[str] = (),
    ) -> None:
        self.nodes = [f"node{i:03d}" for i in range(n)]
        self.speed = {node: 10 * GB for node in self.nodes}
        self.speed.update(slow or {})
        self.links = links or {}
        self.broken = set(broken)
        self.calls: list[tuple[int, list[Pair]]] = []

    def __call__(self, round_number: int, pairs: Sequence[Pair]) -> list[PairResult]:
        self.calls.append((round_number, list(pairs)))
        out = []
        for a, b in pairs:
            if self.broken & {a, b}:
                out.append(
                    PairResult((a, b), None, error="rank 1 on x raised RuntimeError: Connection reset")
                )
                continue
            bw = min(self.speed[a], self.speed[b]) * self.links.get(frozenset((a, b)), 1.0)
            out.append(PairResult((a, b), bw))
        return out

    @property
    def tests(self) -> int:
        return sum(len(p) for _, p in self.calls)


@pytest.mark.parametrize("n", [4, 5, 8, 9, 16, 64])
def test_every_single_slow_node_is_named_within_two_rounds(n):
    for index in range(n):
        nodes = [f"node{i:03d}" for i in range(n)]
        bad = nodes[index]
        fake = FakeCluster(n, slow={bad: 3 * GB})
        result = localize(fake.nodes, fake, tolerance=0.25)
        assert [(s.node, s.kind) for s in result.suspects] == [(bad, "node")], (n, bad)
        assert len(result.rounds) == 2 and len(fake.calls) == 2
        # round 1: floor(n/2) pairs; round 2: the failing pair's two nodes and the odd one out.
        assert result.pair_tests == fake.tests <= n // 2 + 2 + n % 2
        assert bad in result.suspects[0].reason


def test_the_number_of_pair_tests_grows_linearly_not_quadratically():
    counts = {}
    for n in (8, 16, 32, 64, 128, 256):
        fake = FakeCluster(n, slow={"node001": 2 * GB, f"node{n - 2:03d}": 2 * GB})
        result = localize(fake.nodes, fake, tolerance=0.25)
        assert {s.node for s in result.suspects} == {"node001", f"node{n - 2:03d}"}
        counts[n] = result.pair_tests
    # n/2 in round 1 plus 2 per failing pair in round 2 (two bad nodes in two pairs: 4).
    assert counts == {n: n // 2 + 4 for n in counts}
    for n in (8, 16, 32, 64):
        assert counts[2 * n] - counts[n] == n // 2  # doubling the nodes adds n/2 tests
    assert counts[256] < 256 * 255 // 2 / 200  # all pairs would be 32640


def test_no_fault_takes_one_round():
    fake = FakeCluster(8)
    result = localize(fake.nodes, fake, tolerance=0.25)
    assert result.ok and len(result.rounds) == 1 and result.pair_tests == 4
    assert set(result.good) == set(fake.nodes)
    assert result.reference == 10 * GB
    assert result.lines()[-1] == "  no suspect: every pair is within tolerance"


def test_first_round_pairs_are_disjoint_and_second_round_spreads_over_good_nodes():
    nodes = [f"n{i}" for i in range(7)]
    pairs, leftover = first_round(nodes)
    assert pairs == [("n0", "n1"), ("n2", "n3"), ("n4", "n5")] and leftover == ["n6"]
    assert second_round(["n2", "n3", "n6"], ["n0", "n1", "n4", "n5"]) == [
        ("n2", "n0"),
        ("n3", "n1"),
        ("n6", "n4"),
    ]
    assert second_round(["n2"], []) == []


def test_waves_split_a_round_into_node_disjoint_groups():
    pairs = [("a", "g"), ("b", "g"), ("c", "h"), ("d", "g")]
    assert waves(pairs) == [[("a", "g"), ("c", "h")], [("b", "g")], [("d", "g")]]
    for wave in waves(pairs):
        flat = [n for p in wave for n in p]
        assert len(flat) == len(set(flat))


def test_both_nodes_of_a_pair_slow_are_both_named():
    fake = FakeCluster(6, slow={"node002": 2 * GB, "node003": 2 * GB})
    result = localize(fake.nodes, fake, tolerance=0.25)
    assert sorted(s.node for s in result.suspects) == ["node002", "node003"]
    assert result.pair_tests == 3 + 2


def test_a_slow_link_is_named_as_the_link_and_never_drained():
    fake = FakeCluster(8, links={frozenset(("node004", "node005")): 0.3})
    result = localize(fake.nodes, fake, tolerance=0.25)
    [suspect] = result.suspects
    assert (suspect.kind, suspect.node, suspect.peer) == ("link", "node004", "node005")
    assert "suspect the link between them" in suspect.reason
    assert drain_commands(result.suspects) == []
    assert suspect.where() == "link node004 <-> node005"


def test_a_failed_pair_job_counts_as_a_failing_pair():
    fake = FakeCluster(4, broken=["node003"])
    result = localize(fake.nodes, fake, tolerance=0.25)
    assert [s.node for s in result.suspects] == ["node003"]
    round1 = {j.pair: j for j in result.rounds[0]}
    assert round1[("node002", "node003")].why.startswith("the job failed: rank 1 on x raised RuntimeError")


def test_the_odd_node_out_is_tested_in_round_two():
    fake = FakeCluster(5, slow={"node004": 1 * GB})
    result = localize(fake.nodes, fake, tolerance=0.25)
    assert [s.node for s in result.suspects] == ["node004"]
    assert fake.calls[1] == (2, [("node004", "node000")])


def test_three_nodes_have_a_lone_first_pair_that_only_the_floor_can_fail():
    fake = FakeCluster(3, slow={"node000": 1 * GB})
    assert localize(fake.nodes, fake, tolerance=0.25).ok
    result = localize(fake.nodes, fake, tolerance=0.25, floor=5 * GB)
    assert sorted(s.node for s in result.suspects) == ["node000", "node001"]


def test_two_nodes_cannot_be_told_apart_without_a_known_good_node():
    fake = FakeCluster(2, slow={"node001": 1 * GB})
    # A lone pair is its own median: only the absolute floor can fail it.
    assert localize(fake.nodes, fake, tolerance=0.25).ok
    result = localize(fake.nodes, fake, tolerance=0.25, floor=5 * GB)
    assert sorted(s.node for s in result.suspects) == ["node000", "node001"]
    assert all("no known-good node" in s.reason for s in result.suspects)
    assert len(result.rounds) == 1


def test_the_floor_catches_a_cluster_where_most_pairs_are_slow():
    slow = {f"node{i:03d}": 2 * GB for i in range(6)}  # 3 of 4 pairs slow: the median is slow
    fake = FakeCluster(8, slow=slow)
    assert localize(fake.nodes, fake, tolerance=0.25).ok
    result = localize(fake.nodes, fake, tolerance=0.25, floor=5 * GB)
    assert sorted(s.node for s in result.suspects) == sorted(slow)


def test_suspect_reasons_carry_the_numbers():
    fake = FakeCluster(4, slow={"node002": 2 * GB})
    result = localize(fake.nodes, fake, tolerance=0.25)
    [suspect] = result.suspects
    assert suspect.reason == (
        "slow with every partner: node002<->node003 2 GB/s in round 1, node002<->node000 2 GB/s with "
        "known-good node000 in round 2; healthy pairs reach 10 GB/s (tolerance 25%)"
    )
    assert suspect.evidence == {
        "round 1 node002<->node003": 2 * GB,
        "round 2 node002<->node000": 2 * GB,
    }
    lines = result.lines()
    assert lines[1] == "  round 1: node000<->node001 10 GB/s, node002<->node003 2 GB/s FAIL"
    assert lines[2] == "  round 2: node002<->node000 2 GB/s FAIL, node003<->node001 10 GB/s"


def test_a_runner_that_loses_a_pair_is_an_error():
    with pytest.raises(BurninError, match="no result for pair"):
        localize(["a", "b", "c", "d"], lambda r, pairs: [PairResult(pairs[0], 1.0)], tolerance=0.1)


def test_duplicate_nodes_are_refused():
    with pytest.raises(BurninError, match="node twice"):
        localize(["a", "b", "a"], lambda r, p: [], tolerance=0.1)
