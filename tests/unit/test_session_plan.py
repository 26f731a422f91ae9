"""The session's plan (plans/session_plan.py): parts sharing a launch pay one start-up, totals per
tier nest, a job without an estimate is named and left out of the total, the budget's refusal
names the costliest launches."""

from __future__ import annotations

from pytest_gpucluster.plans.session_plan import PlannedJob, SessionPlan, over_budget, short_time


def job(name, tier="standard", estimate=300.0, startup=120.0, shape="8x8", deadline=600.0, count=1):
    return PlannedJob(name, 8, 8, tier, deadline, estimate, startup, shape, count=count)


def test_parts_of_one_shape_share_a_launch_and_its_start_up():
    plan = SessionPlan()
    plan.add(job("health", "quick"))
    plan.add(job("straggler"))
    plan.add(job("sft", shape="", estimate=900.0, startup=180.0))
    [shared, alone] = plan.launches()
    assert [p.name for p in shared.parts] == ["health", "straggler"]
    assert shared.estimate_s == 180.0 + 180.0 + 120.0  # two parts' work, one start-up
    assert alone.estimate_s == 900.0
    assert plan.total_s() == 480.0 + 900.0


def test_tiers_nest_and_a_part_keeps_the_shortest_tier_asking_for_it():
    plan = SessionPlan()
    plan.add(job("health", "standard"))
    plan.add(job("health", "quick"))  # a quick test uses the same part
    plan.add(job("pairs", "burnin", shape="", estimate=200.0, count=6))
    assert [j.tier for j in plan.jobs] == ["quick", "burnin"]
    assert plan.tier_totals() == [("quick", 300.0, 1), ("burnin", 300.0 + 1200.0, 2)]


def test_a_job_without_an_estimate_is_named_and_left_out_of_the_total():
    plan = SessionPlan(basis="2 node(s)")
    plan.add(job("sweep"))
    plan.add(job("nccl-probe", "quick", estimate=None, shape="", deadline=300.0))
    lines = plan.table()
    assert lines[0].split() == ["JOB", "NODES", "x", "RANKS", "TIER", "ESTIMATED", "RUN", "DEADLINE"]
    assert any(line.startswith("nccl-probe") and " - " in line for line in lines)
    assert "estimated total: 5.0 min for 2 job part(s) in 2 launch(es)" in lines[-3]
    assert lines[-1] == "not estimated, not in the total: nccl-probe (fixed deadlines; at most 5.0 min more)"
    assert plan.to_json()["total_s"] == 300.0


def test_over_budget_names_the_costliest_launches_first():
    plan = SessionPlan()
    plan.add(job("nccl-probe", estimate=None, shape="", deadline=9000.0))  # after every estimated one
    plan.add(job("small", estimate=130.0, shape=""))
    plan.add(job("sft", estimate=3000.0, shape=""))
    plan.add(job("dcgm", estimate=1860.0, shape=""))
    said = over_budget(plan, 1800.0, "command line")
    assert said.startswith("the plan's estimated wall time 1 h 23 min exceeds --gpucluster-budget 30.0 min")
    assert "Costliest: sft 50.0 min; dcgm 31.0 min; small 2.2 min." in said
    plan.jobs = plan.jobs[:2]
    assert "Costliest: small 2.2 min; nccl-probe (not estimated; deadline 2 h 30 min)." in over_budget(
        plan, 60, "x"
    )


def test_short_times():
    assert [short_time(v) for v in (None, 45, 138, 5400, 3600)] == [
        "-",
        "45 s",
        "2.3 min",
        "1 h 30 min",
        "1 h",
    ]
