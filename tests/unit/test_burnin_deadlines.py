"""Burn-in and fabric job deadlines (plans/burnin_deadlines.py, plans/burnin.py's parts): their work
plus the rendezvous allowance, never below the fixed figure each had on one node, an explicit
--job-timeout over all. Stands for: a 64-node site whose containers take minutes to start
(--rendezvous-timeout 600) gets probes that outlive the start-up the session grants, and a
straggler sweep made larger gets a deadline that grows with its bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_gpucluster.launch.job import rendezvous_deadline
from pytest_gpucluster.maths.sweep import parse_size, sweep_sizes
from pytest_gpucluster.plans import burnin
from pytest_gpucluster.plans.burnin_deadlines import (
    counters_deadline,
    dcgm_deadline,
    fabric_deadline,
    health_deadline,
    pair_deadline,
    straggler_sweep_deadline,
)

INJECTED = {**burnin.STRAGGLER_SWEEP, "inject_delay_s": burnin.INJECTED_DELAY_S, "inject_rank": 3}


def settings(rendezvous: float = 120.0, job_timeout: float = 900.0, job_timeout_source: str = "default"):
    sources = {"job_timeout": job_timeout_source, "rendezvous_timeout": "command line"}
    return SimpleNamespace(job_timeout=job_timeout, rendezvous_timeout=rendezvous, source=sources.__getitem__)


JOBS = {
    "health": lambda nodes, s: health_deadline(nodes, s),
    "counters": lambda nodes, s: counters_deadline(nodes, s),
    "fabric": lambda nodes, s: fabric_deadline(nodes, s),
    "straggler sweep": lambda nodes, s: straggler_sweep_deadline(burnin.STRAGGLER_SWEEP, "nccl", nodes, s),
    "injected straggler": lambda nodes, s: straggler_sweep_deadline(INJECTED, "gloo", nodes, s),
    "dcgm": lambda nodes, s: dcgm_deadline(600.0, nodes, s),
}
BEFORE = {  # the fixed timeouts these jobs had
    "health": 600.0,
    "counters": 600.0,
    "fabric": 120.0,
    "straggler sweep": 600.0,
    "injected straggler": 600.0,
    "dcgm": 660.0,
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_on_one_node_no_job_gets_less_than_its_old_fixed_timeout(job):
    deadline = JOBS[job](1, settings())
    assert deadline.seconds >= BEFORE[job]
    assert "rendezvous allowance" in deadline.why and not deadline.below_estimate


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_allowance_grows_each_deadline_with_the_nodes_and_the_rendezvous_timeout(job):
    """64 nodes at the default 120 s get 246 s to start, 126 s beyond the jobs' 120 s start-up; at
    --rendezvous-timeout 600 they get 726 s, 606 s beyond it. The deadline grows by just that."""
    one = JOBS[job](1, settings()).seconds
    startup = 60.0 if job == "dcgm" else 120.0  # dcgm's job always had a minute beyond the diag
    assert JOBS[job](64, settings()).seconds == pytest.approx(one + 246.0 - 120.0)
    site = JOBS[job](64, settings(rendezvous=600.0))
    assert site.seconds == pytest.approx(one + 726.0 - 120.0)
    assert f"rendezvous allowance {726 - startup:g} s" in site.why
    assert f"grants 64 node(s) 726 s (12.1 min) to start, less the job's {startup:g} s start-up" in site.why


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("nodes", [1, 2, 8, 64, 512])
@pytest.mark.parametrize("rendezvous", [30.0, 120.0, 600.0])
def test_no_job_is_killed_before_its_ranks_may_have_met(job, nodes, rendezvous):
    """The deadline always exceeds what --rendezvous-timeout grants the job's nodes to start."""
    deadline = JOBS[job](nodes, settings(rendezvous=rendezvous))
    assert deadline.seconds > rendezvous_deadline(nodes, rendezvous)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_an_explicit_job_timeout_wins(job):
    forced = JOBS[job](64, settings(rendezvous=600.0, job_timeout=450.0, job_timeout_source="command line"))
    assert forced.seconds == 450.0 and forced.why == "--job-timeout from command line"
    assert "rendezvous" not in forced.text


def test_a_job_timeout_below_the_dcgm_diags_own_time_is_kept_but_flagged():
    forced = dcgm_deadline(3600.0, 4, settings(job_timeout=900.0, job_timeout_source="environment X"))
    assert forced.seconds == 900.0 and forced.below_estimate
    assert "BELOW THE ESTIMATED RUN" in forced.text and "the diag's own 3,600 s" in forced.text


def test_the_straggler_sweep_deadline_comes_from_its_sizes_and_iters():
    """Small as shipped (its 600 s minimum holds); made larger, it grows with the bytes it moves at
    the gloo floor rate (0.05 GB/s), and an injected straggler's sleeps add to it."""
    shipped = straggler_sweep_deadline(burnin.STRAGGLER_SWEEP, "gloo", 1, settings())
    assert shipped.seconds == 600.0 and "at least the 600 s (10 min) it had as a fixed timeout" in shipped.why
    # one placement: 3 x 5 timed calls, the sync and the check, 2 x 2 warm-up
    assert "(21 calls per size) at a 0.05 GB/s floor" in shipped.why
    big = {**burnin.STRAGGLER_SWEEP, "max_bytes": "4G"}
    sizes = sweep_sizes(parse_size("64K"), parse_size("4G"), 4)
    work = sum(sizes) * 21 / 0.05e9
    larger = straggler_sweep_deadline(big, "gloo", 1, settings())
    assert larger.seconds == pytest.approx(work + 120.0) and "at least" not in larger.why
    injected = straggler_sweep_deadline({**big, "inject_delay_s": 0.5}, "gloo", 1, settings())
    assert injected.seconds == pytest.approx(larger.seconds + 0.5 * 15 * len(sizes))
    assert f"+ {0.5 * 15 * len(sizes):g} s of injected delay" in injected.why
    in_place = straggler_sweep_deadline({**big, "in_place": True}, "gloo", 1, settings())
    assert in_place.seconds > larger.seconds and "(38 calls per size)" in in_place.why


def test_the_pair_jobs_get_the_two_node_allowance_and_grow_with_their_size():
    small = pair_deadline(4 << 20, 10, "nccl", settings(rendezvous=600.0))
    assert small.seconds == pytest.approx(600.0 + 602.0 - 120.0)
    assert "grants 2 node(s) 602 s (10 min) to start" in small.why
    huge = pair_deadline(64 << 30, 100, "nccl", settings())
    assert huge.seconds == pytest.approx((64 << 30) * 102 / 2e9 + 120.0 + 2.0)


def test_the_burnin_parts_carry_their_deadline_for_the_dry_run():
    site = settings(rendezvous=600.0)
    health = burnin.health_part(8, site)
    assert health.timeout_s == health_deadline(8, site).seconds and health.deadline.startswith("job timeout")
    assert "rendezvous allowance 494 s" in health.deadline  # 8 nodes: 600 + 7 x 2 s, less 120 s
    plain = burnin.straggler_sweep_part(8, site, "nccl")
    injected = burnin.straggler_sweep_part(8, site, "nccl", inject_rank=63)
    assert plain.options == burnin.STRAGGLER_SWEEP and plain.name == "burnin-straggler-sweep"
    assert injected.options["inject_rank"] == 63 and injected.name == "burnin-injected-straggler"
    assert injected.options["inject_delay_s"] == burnin.INJECTED_DELAY_S
    assert "injected delay" in injected.deadline and "injected delay" not in plain.deadline
    assert plain.timeout_s == pytest.approx(600.0 + 614.0 - 120.0)


def test_the_health_job_loads_each_gpu_for_the_profiles_load_duration():
    """burnin.load_duration reaches the rank (options load_s) and the job's deadline grows by it."""
    from pytest_gpucluster.profiles.loader import load_profile

    site = settings()
    part = burnin.health_part(1, site, load_s=3600.0)
    assert part.options["load_s"] == 3600.0
    # the work (240 s estimate + the load beyond the 5 s it always had) + 120 s start-up (one node: no allowance)
    assert part.timeout_s == pytest.approx(240.0 + 3595.0 + 120.0)
    assert "GPU load" in part.deadline
    assert load_profile("cpu-local").model.burnin.load_duration == 5.0
