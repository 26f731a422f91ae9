"""Job deadlines from the work (plans/deadlines.py, plans/collectives.sweep_deadline): an SFT case's
own timeout wins, then an explicit --job-timeout, then 1.5 x the estimated run time; sweeps from
the bytes they move at a floor rate, never below 1.5 x their run at the expected bandwidth.
Stands for: a 2-node Llama-2 7B job on 16 H200 gets minutes, not the 15-minute default, and a
16 GiB all_reduce sweep on a fabric fallen back to sockets still finishes and is measured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_gpucluster.checks.collectives import cases
from pytest_gpucluster.plans.collectives import (
    estimate_sweep_runtime,
    sweep_deadline,
    sweep_part,
    sweep_requests,
)
from pytest_gpucluster.plans.deadlines import (
    DEADLINE_MARGIN,
    MIN_DERIVED_S,
    Deadline,
    rendezvous_allowance,
    sft_deadline,
)
from pytest_gpucluster.profiles.estimates import DEFAULT_JOB_TIMEOUT_S, estimate_case_runtime
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import CollectivesSection


def settings(
    job_timeout: float = DEFAULT_JOB_TIMEOUT_S,
    source: str = "default",
    rendezvous: float = 120.0,
    rendezvous_source: str | None = None,
):
    """``source`` is every option's, unless ``rendezvous_source`` gives --rendezvous-timeout its own."""
    sources = {"rendezvous_timeout": rendezvous_source or source}
    return SimpleNamespace(
        job_timeout=job_timeout, rendezvous_timeout=rendezvous, source=lambda name: sources.get(name, source)
    )


@pytest.fixture(scope="module")
def h200():
    return load_profile("h200-spectrumx").model


def test_the_cases_own_timeout_wins_and_the_estimate_is_shown(h200):
    case = h200.sft.cases[0]
    estimate = estimate_case_runtime(case, h200.cluster, nodes=2)
    deadline = sft_deadline(case, h200, nodes=2, settings=settings(300, "command line"))
    assert deadline.seconds == case.timeout and "own timeout:" in deadline.text
    assert deadline.estimate_s == pytest.approx(estimate.total_s) and not deadline.below_estimate
    assert f"from {estimate.arithmetic}" in deadline.text


def test_without_a_timeout_the_deadline_is_derived_from_the_work(h200):
    case = h200.sft.cases[0].model_copy(update={"timeout": None})
    estimate = estimate_case_runtime(case, h200.cluster, nodes=2)
    derived = sft_deadline(case, h200, nodes=2, settings=settings())
    assert derived.seconds >= estimate.total_s * DEADLINE_MARGIN and derived.seconds % 60 == 0
    assert derived.text.startswith("job timeout") and "derived: 1.5 x the estimated run" in derived.text
    # An explicit --job-timeout overrides the derived one (and says where it came from).
    explicit = sft_deadline(
        case, h200, nodes=2, settings=settings(3600, "environment GPUCLUSTER_JOB_TIMEOUT")
    )
    assert (
        explicit.seconds == 3600 and "--job-timeout from environment GPUCLUSTER_JOB_TIMEOUT" in explicit.text
    )


def test_a_long_rendezvous_timeout_lengthens_derived_deadlines_only(h200):
    """A site whose containers take minutes to start sets --rendezvous-timeout 600: a 2-node job's
    ranks get 602 s to meet, 422 s beyond the estimate's 180 s start-up, and its derived deadline
    grows by that much (shown in the dry-run line); a case's own timeout: and --job-timeout do not."""
    case = h200.sft.cases[0].model_copy(update={"timeout": None})
    estimate = estimate_case_runtime(case, h200.cluster, nodes=2)
    site = settings(rendezvous=600.0, source="command line")
    assert rendezvous_allowance(2, site)[0] == pytest.approx(422.0)
    slow = sft_deadline(case, h200, nodes=2, settings=settings(rendezvous=600.0))
    assert slow.seconds == max(-(-(estimate.total_s * DEADLINE_MARGIN + 422.0) // 60) * 60, MIN_DERIVED_S)
    assert slow.seconds > sft_deadline(case, h200, nodes=2, settings=settings()).seconds
    assert (
        "+ rendezvous allowance 422 s (7.03 min): --rendezvous-timeout 600 s (from default) grants 2 node(s) "
        "602 s (10 min) to start, less the estimate's 180 s start-up" in slow.text
    )
    # The default (120 s, 122 s for 2 nodes) lies inside the 180 s start-up: nothing added, and said so.
    default = sft_deadline(case, h200, nodes=2, settings=settings())
    assert "rendezvous allowance 0 s" in default.text
    assert default.seconds == max(-(-(estimate.total_s * DEADLINE_MARGIN) // 60) * 60, MIN_DERIVED_S)
    # The user's word is kept as given.
    own = h200.sft.cases[0]
    assert sft_deadline(own, h200, nodes=2, settings=settings(rendezvous=600.0)).seconds == own.timeout
    explicit = sft_deadline(case, h200, nodes=2, settings=settings(3600, "command line", rendezvous=600.0))
    assert explicit.seconds == 3600 and "rendezvous" not in explicit.text


def test_a_short_case_gets_at_least_the_minimum():
    cpu = load_profile("cpu-local").model
    case = cpu.sft.cases[0].model_copy(update={"timeout": None})
    deadline = sft_deadline(case, cpu, nodes=1, settings=settings())
    assert deadline.seconds >= MIN_DERIVED_S


def test_a_timeout_below_the_estimate_is_kept_but_flagged(h200):
    case = h200.sft.cases[0].model_copy(update={"timeout": 60.0})
    deadline = sft_deadline(case, h200, nodes=2, settings=settings())
    assert deadline.seconds == 60 and deadline.below_estimate
    assert "BELOW THE ESTIMATED RUN" in deadline.text
    assert "BELOW" not in Deadline(600, "x", 500.0).text


def test_a_model_given_as_a_path_gets_the_default_saying_why(h200):
    case = h200.sft.cases[0].model_copy(update={"timeout": None, "model": "/models/llama"})
    deadline = sft_deadline(case, h200, nodes=2, settings=settings())
    assert deadline.seconds == DEFAULT_JOB_TIMEOUT_S and deadline.estimate_s is None
    assert "run time not estimated: model '/models/llama' is not a named shape" in deadline.text


def test_sweeps_derive_theirs_from_the_bytes_and_an_explicit_timeout_overrides(h200):
    case = next(c for c in cases(h200.collectives) if c.id == "all_reduce-intra-node")
    part = sweep_part(case, h200.collectives, 8, "nccl", cluster=h200.cluster, ranks_per_node=8)
    assert part.timeout_s > 2000 and "GB moved (134 calls per size) at a 2 GB/s floor" in part.deadline
    # the estimate: at the case's own 431 GB/s floor, bus factor 2(n-1)/n on 8 ranks
    assert "bus factor 1.75 at 431 GB/s (its lowest min_busbw floor)" in part.deadline
    forced = sweep_part(
        case, h200.collectives, 8, "nccl", cluster=h200.cluster, ranks_per_node=8,
        settings=settings(600, "command line"),
    )  # fmt: skip
    assert forced.timeout_s == 600 and "--job-timeout from command line" in forced.deadline


def test_a_sweep_case_without_a_floor_uses_the_link_its_scope_crosses(h200):
    by_id = {c.id: c for c in cases(h200.collectives)}
    broadcast = by_id["broadcast-intra-node"]
    requests = sweep_requests(broadcast, h200.collectives.sweep)
    seconds, text = estimate_sweep_runtime(broadcast, requests, h200.collectives, h200.cluster, 8)
    assert "450 GB/s (cluster.nvlink_bandwidth)" in text and seconds > 120
    bare = h200.cluster.model_copy(update={"nvlink_bandwidth": None})
    why = estimate_sweep_runtime(broadcast, requests, h200.collectives, bare, 8)
    assert isinstance(why, str) and "no expected bandwidth for broadcast-intra-node" in why


def test_a_sweep_slower_than_the_floor_rate_gets_the_margin_over_its_estimate():
    """A gloo floor of 0.01 GB/s is below gloo's 0.05 GB/s deadline rate: the estimate wins."""
    cpu = load_profile("cpu-local").model
    section = CollectivesSection.model_validate(
        {"checks": [{"collective": "all_reduce", "size": "16MiB", "min_busbw": "0.01GB/s"}],
         "sweep": {"min_bytes": "1KiB", "max_bytes": "16MiB"}}
    )  # fmt: skip
    case = cases(section)[0]
    part = sweep_part(case, section, 1, "gloo", cluster=cpu.cluster, ranks_per_node=2)
    estimate = estimate_sweep_runtime(case, sweep_requests(case, section.sweep), section, cpu.cluster, 2)
    assert part.timeout_s == pytest.approx(DEADLINE_MARGIN * estimate[0])
    assert "1.5 x the estimated run, above the floor-rate deadline" in part.deadline


def test_a_sweep_deadline_grows_with_the_rendezvous_allowance_of_its_nodes(h200):
    """A 64-node site whose containers take minutes to start sets --rendezvous-timeout 600: its
    ranks get 726 s to meet, 606 s beyond the sweep's own 120 s start-up, and the sweep's deadline
    grows by exactly that (said in its why); with the default 120 s, 64 nodes still get 126 s more
    than one node. An explicit --job-timeout still wins."""
    case = next(c for c in cases(h200.collectives) if c.id == "all_reduce-inter-node")
    requests = sweep_requests(case, h200.collectives.sweep)

    def deadline(nodes: int, **kw):
        return sweep_deadline(
            case, requests, h200.collectives, "nccl",
            nranks=nodes * 8, nodes=nodes, cluster=h200.cluster, settings=settings(**kw),
        )  # fmt: skip

    one = deadline(1)
    assert "rendezvous allowance 0 s" in one.why and "less the sweep's 120 s start-up" in one.why
    bare = sweep_deadline(case, requests, h200.collectives, "nccl", nranks=8, cluster=h200.cluster)
    assert one.seconds == pytest.approx(bare.seconds) and "rendezvous" not in bare.why
    default_64 = deadline(64)
    assert default_64.seconds == pytest.approx(deadline(1).seconds + 126.0)
    assert "grants 64 node(s) 246 s (4.1 min) to start" in default_64.text
    site_64 = deadline(64, rendezvous=600.0, rendezvous_source="command line")
    assert site_64.seconds == pytest.approx(one.seconds + 606.0)
    assert (
        "+ rendezvous allowance 606 s (10.1 min): --rendezvous-timeout 600 s (from command line) grants "
        "64 node(s) 726 s (12.1 min) to start, less the sweep's 120 s start-up" in site_64.text
    )
    # The deadline always covers what the rendezvous grants, so the ranks are never killed meeting.
    assert site_64.seconds > 726.0 and deadline(512, rendezvous=600.0).seconds > 600.0 + 2.0 * 511
    forced = deadline(64, job_timeout=900.0, source="command line", rendezvous=600.0)
    assert forced.seconds == 900.0 and "rendezvous" not in forced.why


def test_a_sweep_part_passes_its_node_count_to_the_allowance(h200):
    """The inter-node case runs on 2 nodes: its part's deadline gets the 2-node allowance."""
    case = next(c for c in cases(h200.collectives) if c.id == "all_reduce-inter-node")
    kw = {"cluster": h200.cluster, "ranks_per_node": 8}
    short = sweep_part(case, h200.collectives, 64, "nccl", settings=settings(), **kw)
    long = sweep_part(case, h200.collectives, 64, "nccl", settings=settings(rendezvous=600.0), **kw)
    # 2 nodes get 122 s by default (2 s beyond the sweep's 120 s start-up), 602 s at 600
    assert "rendezvous allowance 2 s" in short.deadline
    assert long.timeout_s == pytest.approx(short.timeout_s + 480.0)
    assert "grants 2 node(s) 602 s (10 min) to start" in long.deadline
