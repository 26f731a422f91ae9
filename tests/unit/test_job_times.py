"""The report's "Job times" section, on real recorded runs: each job's estimate beside its time."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.job_times import JOB_TIME_HEADER, job_time_rows, job_time_summary
from pytest_gpucluster.results.report import write_reports

DATA = Path(__file__).parents[1] / "data"
QUICK_RUN = DATA / "gpu_session" / "cpu_vm" / "quick" / "results.json"
"""A real ``-m quick`` run on this VM, recorded before the estimates were calibrated (its one
shared job was estimated at 372.3 s and took 18.3 s; its records carry no ranks per node)."""


def test_a_real_runs_job_reads_estimate_time_ratio_and_deadline_share():
    run = read_results(QUICK_RUN)
    assert job_time_rows(run.jobs) == [
        ("burnin-health, collectives-all_reduce-intra-node", "1 x ?", "ok", "6.2 min", "18 s", "0.05x", "2%")
    ]
    assert job_time_summary(run.jobs, run.plan) == (
        "1 job(s) took 18 s in all against the plan's estimate of 6.2 min (0.05x). "
        "A later dry run with this results.json as --baseline plans from these times."
    )


def test_many_parts_are_cut_and_the_job_furthest_past_its_estimate_is_named():
    jobs = [
        {"parts": ["a", "b", "c", "d", "e"], "nodes": 2, "ranks_per_node": 8, "estimate_s": 10.0,
         "actual_s": 30.0, "deadline_s": 60.0, "status": "ok"},
        {"parts": ["probe"], "nodes": 2, "ranks_per_node": 1, "estimate_s": None, "actual_s": 4.0,
         "deadline_s": 300.0, "status": "failed"},
    ]  # fmt: skip
    rows = job_time_rows(jobs)
    assert rows[0] == ("a, b, c (+2 more)", "2 x 8", "ok", "10 s", "30 s", "3.00x", "50%")
    assert rows[1][2:] == ("failed", "-", "4 s", "-", "1%")
    summary = job_time_summary(jobs, {"total_s": 20.0})
    assert "2 job(s) took 34 s in all against the plan's estimate of 20 s (1.70x)" in summary
    assert "furthest past its estimate: a, b, c (+2 more) at 3.00x" in summary
    assert "1 job(s) had no estimate" in summary


def test_the_report_of_a_real_run_has_the_section_and_a_run_without_jobs_has_none(tmp_path):
    run = read_results(QUICK_RUN)
    write_reports(run, tmp_path / "with", charts=False)
    report = (tmp_path / "with" / "report.md").read_text()
    assert "## Job times: estimated and taken (1 job(s))" in report
    assert "| " + " | ".join(JOB_TIME_HEADER) + " |" in report
    assert "| burnin-health, collectives-all_reduce-intra-node | 1 x ? | ok | 6.2 min | 18 s |" in report
    assert "Job times" in (tmp_path / "with" / "report.html").read_text()

    older = json.loads(QUICK_RUN.read_text())
    older.pop("jobs")
    (tmp_path / "old.json").write_text(json.dumps(older))
    write_reports(read_results(tmp_path / "old.json"), tmp_path / "without", charts=False)
    assert "Job times" not in (tmp_path / "without" / "report.md").read_text()
