"""Calibration (plans/calibration.py): the plan counts an earlier run's recorded job times where
that run made the same launch (part names, nodes x ranks, profile, tier), the formula elsewhere."""

from __future__ import annotations

import copy

from pytest_gpucluster.plans.calibration import recorded_run, tier_of
from pytest_gpucluster.plans.session_plan import PlannedJob, SessionPlan, over_budget

QUICK_TIER = {"name": "quick", "sweep": "checked", "load_s": None, "numerics_s": None, "soak_s": None}
PARTS = ["burnin-health", "collectives-all_reduce-intra-node", "numerics", "numerics-injected-corruption"]
# results.json of a real cpu-local quick-tier run (this machine, 2026-11-27, load average 5)
RECORDED = {
    "started_at": 1795749762.1,
    "profile": {"name": "cpu-local"},
    "tier": {**QUICK_TIER, "source": "built-in defaults"},
    "jobs": [
        {"job_id": "shared-4-parts-032252-29f673", "parts": PARTS, "nodes": 1, "ranks_per_node": 2,
         "estimate_s": 34.3, "deadline_s": 1280.4, "actual_s": 19.9, "status": "ok"},
    ],
}  # fmt: skip


def quick_plan(**extra: PlannedJob) -> SessionPlan:
    plan = SessionPlan()
    for name, estimate in zip(PARTS, (8.0, 17.0, 13.0, 11.0), strict=True):
        plan.add(PlannedJob(name, 1, 2, "quick", 240.0, estimate, 5.0, "1x2"))
    for job in extra.values():
        plan.add(job)
    return plan


def test_a_launch_the_earlier_run_made_counts_its_recorded_time():
    plan = quick_plan()
    assert plan.total_s() == 49.0 - 15.0  # the formula: four parts' work, one 5 s start-up
    plan.calibration = recorded_run(RECORDED, "r1/results.json")
    assert plan.calibration.mismatch("cpu-local", tier_of(QUICK_TIER)) is None
    assert plan.total_s() == 19.9
    lines = plan.table()
    assert lines[0].endswith("DEADLINE  FROM")
    assert lines[1].startswith("burnin-health ") and "20 s" in lines[1]
    assert lines[1].endswith("measured 2026-11-27, one job of 4 parts")
    assert all(line.endswith("measured 2026-11-27, in burnin-health's job") for line in lines[2:5])
    assert "calibrated: 1 of 1 launch(es) count the time they took in r1/results.json" in lines[6]
    assert plan.to_json()["calibration"]["measured"] == [{"parts": PARTS, "actual_s": 19.9}]


def test_another_launch_keeps_the_formula_and_says_so():
    alone = PlannedJob("burnin-fabric-before", 1, 1, "standard", 150.0, 6.0, 5.0)
    plan = quick_plan(alone=alone)
    plan.calibration = recorded_run(RECORDED, "r1/results.json")
    assert plan.total_s() == 19.9 + 6.0
    row = next(line for line in plan.table() if line.startswith("burnin-fabric-before"))
    assert row.endswith("estimated")
    assert "(measured 2026-11-27)" in over_budget(plan, 10.0, "command line")


def test_other_nodes_ranks_tier_or_profile_or_a_failed_job_do_not_calibrate():
    other_ranks = copy.deepcopy(RECORDED)
    other_ranks["jobs"][0]["ranks_per_node"] = 4
    failed = copy.deepcopy(RECORDED)
    failed["jobs"][0]["status"] = "failed"
    older = copy.deepcopy(RECORDED)  # recorded before jobs said their ranks
    del older["jobs"][0]["ranks_per_node"]
    for data in (other_ranks, failed, older):
        plan = quick_plan()
        plan.calibration = recorded_run(data, "r1/results.json")
        assert plan.total_s() == 34.0 and not plan.measured_launches()
    run = recorded_run(RECORDED, "r1/results.json")
    assert "ran profile cpu-local, this session h200-spectrumx" in run.mismatch(
        "h200-spectrumx", tier_of(QUICK_TIER)
    )
    standard = tier_of({**QUICK_TIER, "name": "standard", "sweep": "grid"})
    said = run.mismatch("cpu-local", standard)
    assert said == (
        "r1/results.json ran tier quick (sweep checked), this session standard (sweep grid): "
        "their durations set other work"
    )
    assert "holds no job times" in recorded_run(failed, "r1/results.json").mismatch(
        "cpu-local", tier_of(QUICK_TIER)
    )


def test_a_launch_standing_for_several_jobs_counts_the_median_recorded_time_each():
    pairs = PlannedJob("burnin-pair", 2, 8, "burnin", 600.0, 40.0, 35.0, count=34)
    plan = SessionPlan(jobs=[pairs])
    data = {
        "profile": {"name": "h200-spectrumx"},
        "jobs": [
            {"parts": ["burnin-pair"], "nodes": 2, "ranks_per_node": 8, "actual_s": t, "status": "ok"}
            for t in (31.0, 33.0, 90.0)
        ],
    }
    plan.calibration = recorded_run(data, "r")
    assert plan.total_s() == 33.0 * 34


def test_the_history_store_calibrates_with_its_newest_run_of_the_same_profile_and_tier(tmp_path):
    """A real cpu-local results.json with the quick run's jobs and tier, appended to a real store,
    comes back as the calibrating run; a store holding only another tier's run calibrates nothing."""
    import json
    from pathlib import Path

    from pytest_gpucluster.results.history import record_run
    from pytest_gpucluster.session.plan import _from_history

    real = json.loads((Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json").read_text())
    quick, standard = tmp_path / "quick.json", tmp_path / "standard.json"
    quick.write_text(json.dumps({**real, "tier": RECORDED["tier"], "jobs": RECORDED["jobs"]}))
    other = {**RECORDED["tier"], "name": "standard", "sweep": "grid"}
    standard.write_text(
        json.dumps({**real, "started_at": real["started_at"] + 60, "tier": other, "jobs": RECORDED["jobs"]})
    )
    db = tmp_path / "history.sqlite"
    record_run(db, standard)
    run, why = _from_history(db, "cpu-local", tier_of(QUICK_TIER))
    assert run is None and why.startswith(
        "none of the 1 newest run(s) of profile cpu-local in the history store"
    )
    record_run(db, quick)
    run, why = _from_history(db, "cpu-local", tier_of(QUICK_TIER))
    assert why == "" and run is not None and run.source == f"history run #2 ({db})"
    plan = quick_plan()
    plan.calibration = run
    assert plan.total_s() == 19.9
    assert _from_history(tmp_path / "none.sqlite", "cpu-local", None) == (
        None, f"the history store {tmp_path / 'none.sqlite'} holds no run yet"
    )  # fmt: skip
