"""Retest before drain, judged on recorded real runs: the first measurement from a run whose rank 1
was slow, the retest's from a run where it was slow again (confirmed) or not (cleared)."""

from __future__ import annotations

import dataclasses

from history_runs import HEALTHY, LOADED, SLOW_RANK, fan_out, real_run

from pytest_gpucluster.burnin.drain import Suspect, clear_suspects, read_suspects, write_suspects
from pytest_gpucluster.checks.burnin.health import suspect_of
from pytest_gpucluster.results.retest import (
    RETEST_ATTEMPT,
    confirmed_hosts,
    plan_retest,
    retest_lines,
    retest_record,
    retest_rows,
)

HEALTH_TEST = "acceptance/test_burnin.py::test_rank_health_cpu"


def _retested(first: str, again: str) -> tuple:
    run = real_run(first)
    hosts = ["vm"]
    order = [o.test_id for o in run.outcomes]
    # what the burn-in test put on the drain list for the first run: a suspect per failed check
    listed = [
        (suspect_of(m).node, m.test_id) for m in run.measurements if m.failed and m.test_id == HEALTH_TEST
    ]
    plan = plan_retest(run.measurements, run.outcomes, hosts, order, listed)
    retest = [
        dataclasses.replace(m, attempt=RETEST_ATTEMPT)
        for m in real_run(again).measurements
        if m.test_id in plan.test_ids
    ]
    measurements = [*run.measurements, *retest]
    confirmed = confirmed_hosts(plan, measurements, run.outcomes, hosts)
    rows = retest_rows(measurements, plan.hosts, plan.reruns)
    return plan, rows, retest_record(plan, rows, list(plan.test_ids), confirmed)


def test_the_suspect_and_the_tests_that_named_it():
    """One of two ranks slow is a threshold finding (too few peers to blame the node), but the
    burn-in test listed vm: vm is the suspect, and its health test is run again. Its finding says
    ``threshold; rerun`` (it drains nothing): the retest is that rerun, and the line says so."""
    plan, _, _ = _retested(SLOW_RANK[0], SLOW_RANK[1])
    assert plan.hosts == ("vm",)
    assert plan.test_ids == (HEALTH_TEST,)  # the straggler count names no node: not a suspect's test
    assert plan.reruns == ("vm",)
    assert plan.line() == (
        "retest of suspect(s) vm: running again test_rank_health_cpu "
        "(vm: the rerun its finding asked for, threshold; rerun)"
    )


def test_a_retest_that_fails_again_confirms_the_suspect():
    _, rows, record = _retested(SLOW_RANK[0], SLOW_RANK[1])
    assert [(r.component, r.metric, r.confirmed) for r in rows] == [
        ("rank 1", "burnin.cpu_matmul", True),
        ("rank 1", "burnin.cpu_memory_bandwidth", True),
    ]
    assert rows[0].first is not None and rows[0].retest is not None and rows[0].first != rows[0].retest
    assert (record["confirmed"], record["cleared"]) == (["vm"], [])
    lines = retest_lines(record)
    assert lines[0] == "retest of suspects vm: confirmed vm; cleared none"
    assert lines[1].startswith("  vm rank 1: burnin.cpu_matmul first 0.01091 TFLOP/s, retest 0.0108 TFLOP/s")
    assert lines[1].endswith(
        "(>= 0.028 TFLOP/s): missed again on the rerun its finding asked for (threshold; rerun: not drained for it)"
    )


def test_a_retest_that_passes_clears_the_suspect_and_keeps_both_values():
    _, rows, record = _retested(SLOW_RANK[0], HEALTHY[0])
    assert [(r.metric, r.confirmed) for r in rows] == [
        ("burnin.cpu_matmul", False),
        ("burnin.cpu_memory_bandwidth", False),
    ]
    assert (record["confirmed"], record["cleared"]) == ([], ["vm"])
    assert all(
        row[-1] == "passed on the rerun its finding asked for (threshold; rerun: not drained for it)"
        for row in record["rows"]
    )
    assert record["reruns"] == ["vm"]
    assert record["rows"][0][3] == "0.01091 TFLOP/s" and record["rows"][0][4] != record["rows"][0][3]


def test_a_node_on_the_burnin_drain_list_is_a_suspect_too():
    """Every rank of the loaded run missed the floor alike (a threshold finding, rerun), but the
    burn-in test listed vm to drain: it is retested."""
    run = real_run(LOADED)
    order = [o.test_id for o in run.outcomes]
    assert plan_retest(run.measurements, run.outcomes, ["vm"], order).hosts == ()
    plan = plan_retest(run.measurements, run.outcomes, ["vm"], order, [("vm", HEALTH_TEST)])
    assert (plan.hosts, plan.test_ids) == (("vm",), (HEALTH_TEST,))
    # a retest that measured nothing of vm clears nothing
    assert confirmed_hosts(plan, run.measurements, run.outcomes, ["vm"]) == ["vm"]


def test_cleared_nodes_leave_the_drain_list(tmp_path):
    path = tmp_path / "suspects.json"
    write_suspects(path, [Suspect("vm", "rank 1 slow", "health"), Suspect("n2", "GPU 0 hot", "health")])
    left = clear_suspects(path, ["vm"])
    assert [s.node for s in left] == [s.node for s in read_suspects(path)] == ["n2"]
    assert "NodeName=vm" not in path.read_text() and "NodeName=n2" in path.read_text()


def test_a_suspect_whose_finding_drains_is_retested_as_a_drain_to_confirm_not_as_a_rerun():
    """Fanned out to four nodes, the same slow rank has three healthy peers: its finding drains
    (hardware; reset GPU), so n4's retest confirms a drain, and its rows say CONFIRMED, not rerun."""
    hosts = ["n1", "n2", "n3", "n4"]
    first = fan_out(
        {h: real_run(HEALTHY[i]) for i, h in enumerate(hosts[:3])} | {"n4": real_run(SLOW_RANK[0])}, 0.0
    )
    again = fan_out(
        {h: real_run(HEALTHY[i]) for i, h in enumerate(hosts[:3])} | {"n4": real_run(SLOW_RANK[1])}, 1.0
    )
    order = [o.test_id for o in first.outcomes]
    plan = plan_retest(first.measurements, first.outcomes, hosts, order, [("n4", HEALTH_TEST)])
    assert (plan.hosts, plan.reruns) == (("n4",), ())
    assert {f.action for f in plan.findings} == {"reset GPU"}
    assert "rerun" not in plan.line()
    retest = [
        dataclasses.replace(m, attempt=RETEST_ATTEMPT)
        for m in again.measurements
        if m.test_id in plan.test_ids
    ]
    rows = retest_rows([*first.measurements, *retest], plan.hosts, plan.reruns)
    assert rows and all(r.host == "n4" and r.cells()[-1] == "CONFIRMED: missed again" for r in rows)
