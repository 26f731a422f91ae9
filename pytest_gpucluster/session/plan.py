"""The last stage of the session's start: the selected tests on the usable nodes -> the session's
plan (which job parts they would launch, in which tier).

Reads the pytest items the plugin collected (duck-typed: this module does not import pytest) and
asks each test's planners: the `fixtures.job_part` planners of the fixtures it uses (registered
here, in `PLANNERS`), and the `launches` planner of a test that launches its jobs itself. The result is a
`plans.session_plan.SessionPlan`: the dry run prints it, ``--gpucluster-budget`` judges it, and
results.json keeps it. An earlier run's job times calibrate it (`calibration_run`: the
``--baseline`` file, else the newest run of the ``--gpucluster-history`` store).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_gpucluster.cluster.probe import PROBE_WORK_S
from pytest_gpucluster.harness import Part
from pytest_gpucluster.plans.calibration import RecordedRun, recorded_run, tier_of
from pytest_gpucluster.plans.session_plan import PlannedJob, SessionPlan
from pytest_gpucluster.plans.startup import expected_startup_s
from pytest_gpucluster.profiles.findings import seconds
from pytest_gpucluster.session.core import GpuClusterSession
from pytest_gpucluster.session.probe import all_local

__all__ = [
    "PLANNERS",
    "PLAN_COUNT",
    "Planner",
    "calibration_run",
    "dry_run_lines",
    "item_params",
    "item_tier",
    "launches",
    "planned_parts",
    "session_plan",
]

PROBE_EXPECTED_WORK_S = 5.0
"""What the plan counts for the node probe's work beyond its start-up (its deadline counts
``PROBE_WORK_S``): one rank per node reading NVML, versions, interfaces and RDMA ports."""
PLAN_COUNT = "plan_count"
"""Option of a planned part standing for that many alike jobs (never launched as such)."""


Planner = Callable[[GpuClusterSession, Mapping[str, Any]], Part | None]
"""What a test needs run, from the session and the test's parameters (None: nothing)."""

PLANNERS: dict[str, Planner] = {}
"""Fixture name -> planner, for every fixture `fixtures.job_part` made: the harness's look-ahead."""


def item_params(item: Any) -> Mapping[str, Any]:
    """A collected test's parameters (``callspec.params``; empty when it has none)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params if callspec is not None else {}


def planned_parts(
    items: list[Any], session: GpuClusterSession, errors: list[str] | None = None
) -> list[Part]:
    """The parts the tests of ``items`` would run (tests that will skip for what the session
    lacks left out), in test order. A planner that raises is left out (its test reports the
    error when it runs); ``errors`` collects ``test: error`` for those."""
    found = []
    for item in items:
        names = [n for n in getattr(item, "fixturenames", ()) if n in PLANNERS]
        if not names or item.get_closest_marker("skip") or session.unmet_requirements(item):
            continue
        for name in names:
            try:
                part = PLANNERS[name](session, item_params(item))
            except Exception as exc:
                if errors is not None:
                    errors.append(f"{item.nodeid}: {exc}")
                continue
            if part is not None:
                found.append(part)
    return found


LaunchPlanner = Callable[[GpuClusterSession, Mapping[str, Any]], list[Part]]
"""The jobs a test launches itself (not through a `job_part`), for the plan only."""


def launches(planner: LaunchPlanner) -> Callable[[Any], Any]:
    """Declare what a test launches itself (``run_with_deadline``), so that the plan (the dry
    run's table and total, ``--gpucluster-budget``) counts it before anything runs::

        @launches(lambda session, params: [plans.counters_part(...)])
        def test_counters_before(cluster, ...): ...

    The planner returns `Part` s with ``shareable=False`` (each its own job); a part standing for
    several alike jobs (the pairwise localization's pair jobs) says how many in its options under
    :data:`PLAN_COUNT`."""

    def mark(test: Any) -> Any:
        test._gpucluster_launches = planner
        return test

    return mark


def item_tier(item: Any) -> str:
    """The shortest tier that runs the test (plans/tiers.py)."""
    if item.get_closest_marker("quick") is not None:
        return "quick"
    if any(mark.kwargs.get("slow") for mark in item.iter_markers("burnin")):
        return "burnin"
    return "standard"


def _plan_only(item: Any, session: GpuClusterSession) -> list[Part]:
    planner = getattr(getattr(item, "function", None), "_gpucluster_launches", None)
    return list(planner(session, item_params(item)) or []) if planner is not None else []


def session_plan(items: list[Any], session: GpuClusterSession) -> tuple[SessionPlan, list[str]]:
    """Every job part the selected tests would launch (tests that will skip for what the session
    lacks left out), with its tier, estimate and deadline; and ``test: error`` for each test whose
    part could not be planned."""
    plan, errors = SessionPlan(basis=_plan_basis(session)), []
    if not all_local(session.hosts):
        nodes = session.available_nodes
        startup = expected_startup_s(1, session.backend)
        deadline, estimate = session.probe_deadline, PROBE_EXPECTED_WORK_S + startup
        why = (
            f"job timeout {seconds(deadline)} each, one job per node, all at once (the rendezvous deadline of "
            f"1 node + {PROBE_WORK_S:g} s of probe work; estimated run {seconds(estimate)}, from "
            f"{PROBE_EXPECTED_WORK_S:g} s of work + {startup:g} s expected start-up)"
        )
        plan.add(PlannedJob("node-probe", nodes, 1, "quick", deadline, estimate, startup, why=why))
    for item in items:
        if item.get_closest_marker("skip") or session.unmet_requirements(item):
            continue
        tier = item_tier(item)
        try:
            parts = planned_parts([item], session, errors) + _plan_only(item, session)
        except Exception as exc:  # a planner's bad input: its test reports it when it runs
            errors.append(f"{item.nodeid}: {exc}")
            continue
        for part in parts:
            ranks = part.nproc_per_node or session.ranks_per_node
            shape = (
                json.dumps([part.nodes, ranks, dict(part.env), part.init_process_group], sort_keys=True)
                if part.shareable
                else ""
            )
            count = int(part.options.get(PLAN_COUNT, 1))
            plan.add(PlannedJob(part.name, part.nodes, ranks, tier, part.timeout_s, part.estimate_s,
                                part.startup_s, shape, part.deadline, count))  # fmt: skip
    plan.calibration, plan.calibration_note = calibration_run(session)
    return plan, errors


HISTORY_RUNS_SEARCHED = 20
"""How many of the history store's newest runs are searched for one of the same profile and tier."""


def calibration_run(session: GpuClusterSession) -> tuple[RecordedRun | None, str]:
    """The earlier run whose job times calibrate this session's plan, or None and why not (empty
    when no earlier run was given): the ``--baseline`` results.json when it is a file, else the
    newest run of the same profile and tier in the ``--gpucluster-history`` store."""
    settings = session.settings
    profile, tier = session.profile.name, _session_tier(session)
    baseline = getattr(settings, "baseline", None)
    if isinstance(baseline, Path):
        run = _read_recorded(baseline)
        if isinstance(run, str):
            return None, run
        why = run.mismatch(profile, tier)
        return (None, why) if why else (run, "")
    history = getattr(settings, "history", None)
    if history is None:
        return None, ""
    return _from_history(Path(history), profile, tier)


def _session_tier(session: GpuClusterSession) -> tuple[Any, ...] | None:
    tier = session.tier
    if tier is None:
        return None
    return tier_of(
        {"name": tier.tier, "sweep": tier.sweep, "load_s": tier.load_s, "numerics_s": tier.numerics_s,
         "soak_s": tier.soak_s}
    )  # fmt: skip


def _read_recorded(path: Path) -> RecordedRun | str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"cannot read --baseline {path}: {exc.strerror or exc}"
    except json.JSONDecodeError as exc:
        return f"--baseline {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    if not isinstance(data, Mapping):
        return f"--baseline {path} is not a results.json (not a JSON object)"
    return recorded_run(data, str(path))


def _from_history(db: Path, profile: str, tier: tuple[Any, ...] | None) -> tuple[RecordedRun | None, str]:
    if not db.expanduser().is_file():
        return None, f"the history store {db} holds no run yet"
    from pytest_gpucluster.results.history.store import HistoryError, HistoryStore

    try:
        with HistoryStore.open(db, create=False) as store:
            rows = store.query(
                "SELECT id, header FROM runs WHERE profile = ? ORDER BY COALESCE(started_at, added_at) DESC, "
                "id DESC LIMIT ?",
                (profile, HISTORY_RUNS_SEARCHED),
            )
    except HistoryError as exc:
        return None, str(exc)
    for run_id, header in rows:
        try:
            data = json.loads(header)
        except json.JSONDecodeError:
            continue
        run = recorded_run(data, f"history run #{run_id} ({db})")
        if run.mismatch(profile, tier) is None:
            return run, ""
    return None, (
        f"none of the {len(rows)} newest run(s) of profile {profile} in the history store {db} ran this tier "
        "with recorded job times"
    )


def _plan_basis(session: GpuClusterSession) -> str:
    nodes, ranks = session.available_nodes, session.ranks_per_node
    where = f"hostfile {session.settings.hostfile}" if session.settings.hostfile else "this machine"
    if session.node_facts is not None:
        return f"{nodes} node(s) x {ranks} rank(s) per node, the nodes as the probe found them"
    why = session.not_probed or "the nodes were not probed"
    return (
        f"{nodes} node(s) ({where}) x {ranks} rank(s) per node from profile {session.profile.name}'s node shape: "
        f"{why}"
    )


def _counted(plan: SessionPlan, job: PlannedJob, launch: Any) -> str:
    """What the plan's total counts for ``job``, where that differs from its deadline's arithmetic:
    the recorded time of its launch, or its expected work plus the expected start-up."""
    if launch is not None and plan.calibration is not None:
        return f"; the plan counts the {seconds(plan.measured_s(launch) or 0.0)} its job took ({plan.calibration.source})"
    if job.estimate_s is None:
        return ""
    work = job.estimate_s - job.startup_s
    return (
        f"; the plan counts {seconds(job.estimate_s)}: {seconds(work)} of expected work + "
        f"{job.startup_s:g} s expected start-up (plans/startup.py), once per launch"
    )


def dry_run_lines(plan: SessionPlan, errors: list[str], *, verbose: bool = False) -> list[str]:
    """``--gpucluster-dry-run``'s plan: the table (job, nodes x ranks, tier, estimated run,
    deadline), the session's estimated total and each tier's, what it leaves out, and the tests
    whose part could not be planned, and why; ``verbose``: each job's deadline and estimate
    arithmetic (`plans.deadlines`)."""
    lines = [f"[dry run] plan for {plan.basis}"]
    lines += [f"[dry run]   {line}" for line in plan.table()]
    measured = {id(p): launch for launch in plan.measured_launches() for p in launch.parts}
    for job in plan.jobs if verbose else ():
        why = job.why or f"job timeout {seconds(job.deadline_s)} (fixed by its test; no estimate)"
        lines.append(
            f"[dry run] plan: {job.name}: {job.nodes} node(s) x {job.ranks_per_node} rank(s), {why}"
            + _counted(plan, job, measured.get(id(job)))
        )
    lines += [f"[dry run] plan: cannot plan {error}" for error in errors]
    return lines
