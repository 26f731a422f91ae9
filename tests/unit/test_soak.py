"""The soak, parent side (checks/burnin/soak.py, plans/soak.py) and the rank side's pure parts
(workloads/soak.py: who soaks with whom).

Rank values are built in the layout ``workloads.soak:soak`` returns (its integration test,
tests/integration/test_soak_netns.py, produces real ones between two network-namespace nodes).
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from pytest_gpucluster.checks.burnin.soak import (
    SoakPoint,
    collect,
    runnable,
    soak_checks,
    soak_points,
    weighted_cv,
)
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.plans.soak import soak_deadline, soak_options, soak_timeout
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import CollectivesSection, SoakSettings
from pytest_gpucluster.workloads.soak import node_pairs, phases_of

MIB16 = 16 << 20
PAIR = SoakPoint(2, "all_reduce", "inter-node", MIB16, 0.2e9)
NODE = SoakPoint(0, "all_reduce", "intra-node", MIB16, 0.3e9)


def per_call_us(busbw: float, size: int = MIB16, ranks: int = 2) -> float:
    """The time per all_reduce call that gives ``busbw`` (factor 2(n-1)/n)."""
    return size * 2 * (ranks - 1) / ranks / busbw * 1e6


def rank_values(busbw_series: list[float], point: int = 0, scope: str = "inter-node", iters: int = 10,
                hosts: tuple[str, str] = ("n0", "n1"), skew: float = 1.0) -> list[dict]:  # fmt: skip
    """Two ranks' values of one group; rank 1 a little slower (``skew``): the slowest rank counts."""
    name = f"{hosts[0]}<->{hosts[1]}" if scope == "inter-node" else hosts[0]
    values = []
    for rank, factor in ((0, 1.0), (1, skew)):
        t, samples = 0.0, []
        for bw in busbw_series:
            us = per_call_us(bw) * factor
            samples.append([round(t, 4), us])
            t += iters * us / 1e6
        series = [{"point": point, "scope": scope, "name": name, "group": [0, 1], "collective": "all_reduce",
                   "size_bytes": MIB16, "iters": iters, "samples": samples}]  # fmt: skip
        values.append({"rank": rank, "hosts": list(hosts), "series": series, "skipped": {}})
    return values


def test_the_gated_busbw_points_of_the_profile_are_what_soaks():
    model = load_profile("cpu-local").model
    points = soak_points(model.collectives)
    assert [(p.index, p.scope, p.size_bytes) for p in points] == [
        (0, "intra-node", MIB16),
        (2, "inter-node", MIB16),
    ]
    assert points[0].floor == model.collectives.checks[0].min_busbw  # the latency check (index 1) has none
    assert points[1].title == "all_reduce 16 MiB inter-node"


def test_a_session_runs_the_scopes_it_can_and_says_why_not_the_others():
    points = [NODE, PAIR, SoakPoint(3, "all_gather", "full", 1 << 20, 1e9)]
    kept, why = runnable(points, nodes=1, ranks_per_node=2)
    assert [p.scope for p in kept] == ["intra-node", "full"]
    assert why == ["all_reduce 16 MiB inter-node: needs 2+ nodes, the session has 1 (pass --hostfile)"]
    kept, why = runnable(points, nodes=2, ranks_per_node=1)
    assert [p.scope for p in kept] == ["inter-node", "full"]
    assert "1 rank per node" in why[0]


@pytest.mark.parametrize(
    ("nodes", "phases"),
    [
        (1, []),
        (2, [[(0, 1)]]),
        (3, [[(0, 1)], [(2, 0)]]),  # the odd node out pairs with node 0 afterwards
        (4, [[(0, 1), (2, 3)]]),
        (5, [[(0, 1), (2, 3)], [(4, 0)]]),
    ],
)
def test_node_pairs_cover_every_node_in_at_most_two_phases(nodes, phases):
    assert node_pairs(nodes) == phases


def test_groups_per_scope_follow_the_host_names_in_rank_order():
    hosts = ["a", "a", "b", "b", "c", "c"]
    (intra,), _ = phases_of("intra-node", hosts)
    assert intra.groups == ((0, 1), (2, 3), (4, 5)) and intra.names == ("a", "b", "c")
    pairs, _ = phases_of("inter-node", hosts)
    assert [p.groups for p in pairs] == [((0, 1, 2, 3),), ((0, 1, 4, 5),)]
    assert [p.names for p in pairs] == [("a<->b",), ("c<->a",)]
    (full,), _ = phases_of("full", hosts)
    assert full.groups == ((0, 1, 2, 3, 4, 5),) and full.names == ("all 3 nodes",)
    assert phases_of("intra-node", ["a", "b"]) == (
        [],
        "every node runs 1 rank, so there is no intra-node traffic to soak",
    )
    assert phases_of("inter-node", ["a", "a"])[1] == "inter-node soak needs 2+ nodes; the job has 1"


def test_collect_takes_each_samples_slowest_rank():
    (series,) = collect(rank_values([1e9, 1e9, 0.8e9], skew=1.25), [PAIR])
    assert series.name == "n0<->n1" and series.hosts == ("n0", "n1") and series.ranks == 2
    assert series.busbw == pytest.approx((0.8e9, 0.8e9, 0.64e9))
    assert series.times[0] == 0.0 and series.labels == {
        "collective": "all_reduce",
        "size_bytes": MIB16,
        "pair": "n0<->n1",
    }
    assert series.durations[0] == pytest.approx(10 * per_call_us(0.8e9) / 1e6)


def test_ranks_that_disagree_on_the_number_of_samples_are_a_failed_job():
    values = rank_values([1e9, 1e9])
    values[1]["series"][0]["samples"].pop()
    with pytest.raises(
        JobFailed, match=r"n0<->n1: ranks \[0, 1\] of \[0, 1\] reported, with \[2, 1\] samples"
    ):
        collect(values, [PAIR])


def test_weighted_cv_weighs_each_sample_by_the_time_it_took():
    values = [1.0, 1.0, 0.1]
    assert weighted_cv(values, [1, 1, 1]) == pytest.approx(
        statistics.pstdev(values) / statistics.fmean(values)
    )
    # the slow sample took ten times as long: it is ten times the share of the window
    assert weighted_cv(values, [1, 1, 10]) > weighted_cv(values, [1, 1, 1])
    assert weighted_cv([5.0], [1]) == 0.0


def test_a_steady_pair_passes_both_gates():
    (series,) = collect(rank_values([0.9e9, 0.95e9, 0.92e9, 0.88e9, 0.93e9]), [PAIR])
    checks, suspects = soak_checks([series], SoakSettings(max_cv=0.4), "cpu-local")
    assert [(c.metric, c.failed) for c in checks] == [
        ("burnin.soak.busbw_min", False),
        ("burnin.soak.busbw_cv", False),
    ]
    lowest = checks[0]
    assert lowest.value == pytest.approx(0.88e9) and lowest.threshold == pytest.approx(0.2e9)
    assert lowest.spread is not None and lowest.spread.n == 5 and len(lowest.spread.times) == 5
    assert str(lowest.ref) == "profile cpu-local: burnin.soak.min_busbw_fraction"
    assert suspects == []


def test_a_link_cut_half_way_fails_naming_the_pair_and_when_it_dropped():
    healthy, cut = [0.9e9] * 20, [0.05e9] * 3  # after the cut each sample takes 18x longer
    (series,) = collect(rank_values(healthy + cut), [PAIR])
    checks, suspects = soak_checks([series], SoakSettings(min_busbw_fraction=0.5, max_cv=0.4), "cpu-local")
    lowest, variation = checks
    assert (
        lowest.failed and lowest.value == pytest.approx(0.05e9) and lowest.threshold == pytest.approx(0.1e9)
    )
    assert lowest.labels["pair"] == "n0<->n1"
    start = series.times[20]
    assert f"first below the floor at {start:.0f} s (3 of 23 samples below)" in lowest.hint
    assert "first half of the window median 0.9 GB/s, second half 0.05 GB/s" in lowest.hint
    assert "pairwise localization" in lowest.hint and "50% (burnin.soak.min_busbw_fraction)" in lowest.hint
    # 3 samples of 23, but more than half of the window: the weighted variation sees it
    assert variation.failed and variation.value > 0.8
    (suspect,) = suspects
    assert (suspect.kind, suspect.node, suspect.peer, suspect.check) == ("link", "n0", "n1", "soak")
    assert not suspect.drainable and "lowest busbw 0.05 GB/s (limit 0.1 GB/s)" in suspect.reason


def test_an_intra_node_series_names_the_node_and_a_full_one_names_nobody():
    values = rank_values([0.5e9, 0.1e9], scope="intra-node", hosts=("gpu7", "gpu7"))
    (series,) = collect(values, [NODE])
    checks, suspects = soak_checks([series], SoakSettings(), "p")
    assert checks[0].labels["node"] == "gpu7" and checks[0].failed
    assert [(s.kind, s.node) for s in suspects] == [("node", "gpu7")]
    full = SoakPoint(4, "all_reduce", "full", MIB16, 1e9)
    values = rank_values([0.5e9], scope="full", point=0)
    (series,) = collect(values, [full])
    checks, suspects = soak_checks([series], SoakSettings(), "p")
    assert checks[0].failed and checks[0].labels["nodes"] == 2 and suspects == []


def test_an_unset_max_cv_records_the_variation_without_gating_it():
    (series,) = collect(rank_values([1e9, 0.2e9]), [PAIR])
    _, variation = soak_checks([series], SoakSettings(), "p")[0]
    assert variation.threshold is None and variation.ref is None and not variation.failed


def test_the_job_options_and_a_deadline_that_leaves_room_for_a_slow_last_round():
    settings = SoakSettings(sample_time="0.5s")
    options = soak_options([PAIR], settings, 60.0)
    assert options["points"] == [
        {"collective": "all_reduce", "size_bytes": MIB16, "scope": "inter-node", "dtype": "float32"}
    ]
    assert (options["duration_s"], options["sample_s"], options["progress_s"]) == (60.0, 0.5, 5.0)
    assert soak_timeout(600.0, [PAIR], settings) > 600.0 * 1.25 + 20 * 0.5


def test_the_soak_deadline_adds_the_rendezvous_allowance_of_its_nodes_and_keeps_its_length():
    """At --rendezvous-timeout 600, 64 nodes get 726 s to start, 546 s beyond the soak's 180 s
    start-up; an explicit --job-timeout does not cut the soak the user asked for."""
    settings = SoakSettings(sample_time="0.5s")
    base = soak_timeout(600.0, [PAIR], settings)

    def session(rendezvous: float) -> SimpleNamespace:
        return SimpleNamespace(
            job_timeout=60.0, rendezvous_timeout=rendezvous, source=lambda _: "command line"
        )

    assert soak_deadline(600.0, [PAIR], settings, 1, session(120.0)).seconds == pytest.approx(base)
    site = soak_deadline(600.0, [PAIR], settings, 64, session(600.0))
    assert site.seconds == pytest.approx(base + 546.0) and not site.below_estimate
    assert "rendezvous allowance 546 s (9.1 min)" in site.why and "less the soak's 180 s start-up" in site.why


def test_soak_points_skip_checks_without_a_busbw_floor():
    section = CollectivesSection.model_validate(
        {"checks": [{"collective": "all_reduce", "size": "1KiB", "max_latency": "5ms"},
                    {"collective": "all_gather", "scope": "full", "size": "1MiB", "min_busbw": "1GB/s"}]}
    )  # fmt: skip
    (point,) = soak_points(section)
    assert (point.index, point.collective, point.scope, point.floor) == (1, "all_gather", "full", 1e9)
