"""Fabric integrity and sustained load: ports that stay clean under load, busbw that holds for minutes.

- **fabric counters**: every node's IB/RoCE ports and the network interfaces NCCL may use are read
  before the first test and after the last (acceptance/conftest.py orders them, as it does the
  ECC/XID counters), so they bracket the collective sweeps, the burn-in and the soak. An error
  counter that grew (symbol errors, link downed, receive errors, discards, queue drops...) fails,
  naming node, device and port; which ports count and what is allowed is the profile's ``fabric:``
  section (verdicts: ``checks/fabric.py``). Where the machine running pytest reaches the
  InfiniBand fabric (infiniband-diags installed, access to its management device), the whole fabric
  is scanned too, switch ports included (``gpucluster fabric scan``; docs/how-to/ib-fabric.md): every
  finding of the scan after the run, counters against the scan before it, is a ``fabric.ib.*`` check
  naming the cable by both ends. ``GPUCLUSTER_IB_TOOL_PREFIX`` runs the tools under a wrapper
  (``off``: no scan).
- **soak** (``--gpucluster-soak 10m``): the gated busbw points of ``collectives.checks`` repeated for
  that long on their scopes — every node at once (intra-node), every disjoint node pair at once
  (inter-node), all nodes (full) — in timed samples. The lowest sample and the coefficient of
  variation of each node's, pair's or group's series are gated (``burnin.soak``); the series is
  recorded and drawn in the report. Rank 0 prints the elapsed time, the ETA and the current busbw
  while it runs. Without the option the test skips.

- **DCGM diagnostics**: ``dcgmi diag -r <burnin.dcgm.level> -j`` on every node that has DCGM; each
  test result per GPU is a check (a Fail names the GPU and the test; a Warn is recorded and warned).
  No ``dcgmi`` on any node is a skip saying so (``checks/burnin/dcgm.py``).

All are burn-in tests (``-m burnin``): ``pytest acceptance/ -m burnin --gpucluster-soak 10m``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from typing import Any

import pytest

from pytest_gpucluster.checks import fabric
from pytest_gpucluster.checks.burnin import dcgm, soak
from pytest_gpucluster.checks.burnin.xid_classes import kill_windows
from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning, ParseError
from pytest_gpucluster.fabric_scan import model_of_record, suite_checks, suite_record
from pytest_gpucluster.fixtures import FABRIC_SCAN_BEFORE, run_with_deadline
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, parse_snapshot
from pytest_gpucluster.plans import burnin as plans
from pytest_gpucluster.plans import soak as soak_plan
from pytest_gpucluster.plans.burnin_deadlines import dcgm_deadline, dcgm_estimate, fabric_deadline
from pytest_gpucluster.results.handoff import Absent, Handoff
from pytest_gpucluster.session.plan import launches

pytestmark = pytest.mark.burnin
FABRIC_BEFORE = "fabric-ports-before"
"""test_fabric_before's reading (the fabric jobs' per-node values), handed to test_fabric_after
through the results directory (the ``handoff`` fixture: any process of the run can read it)."""


def _fabric_job(cluster: Any, session: Any, when: str) -> Any:
    nodes = session.available_nodes
    return run_with_deadline(
        cluster,
        plans.FABRIC,
        fabric_deadline(nodes, session.settings),
        nodes=nodes,
        nproc_per_node=1,
        options=plans.fabric_options(),
        name="burnin-fabric",
        planned_as=f"burnin-fabric-{when}",  # the plan's name (_fabric_plan), which calibration matches
        init_process_group=False,
        estimate_s=plans.fabric_part(nodes, session.settings, backend=session.backend).estimate_s,
    )


def _snapshots(values: list[Any], job: str) -> list[FabricSnapshot]:
    try:
        return [parse_snapshot(v, f"fabric reading of {v.get('node')} ({job})") for v in values]
    except ParseError as exc:
        pytest.fail(str(exc), pytrace=False)


def _selection_env(session: Any) -> dict[str, str]:
    """What picks the interfaces: the session's NCCL variables, and gloo's own where it is set."""
    env = dict(session.nccl_env)
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        env.setdefault("GLOO_SOCKET_IFNAME", os.environ["GLOO_SOCKET_IFNAME"])
    return env


def _fabric_plan(when: str) -> Any:
    def planned(session: Any, params: Any) -> list[Any]:
        part = plans.fabric_part(session.available_nodes, session.settings, backend=session.backend)
        return [replace(part, name=f"{part.name}-{when}")]

    return planned


@pytest.mark.xdist_group("gpucluster-fabric")  # before and after in one process (the plugin: loadgroup)
@launches(_fabric_plan("before"))
def test_fabric_before(cluster: Any, gpucluster_session: Any, handoff: Any) -> None:
    """Every node's ports and interfaces before the run (conftest runs this first); handed to the
    after test (and the fabric scan to the pairwise burn-in) through the results directory."""
    with handoff.giving(FABRIC_BEFORE) as give, handoff.giving(FABRIC_SCAN_BEFORE) as give_scan:
        job = _fabric_job(cluster, gpucluster_session, "before")
        _snapshots(job.values, f"job {job.job_id}")  # a reading that does not parse fails here, not later
        give(job.values)
        give_scan(suite_record(gpucluster_session.progress or print))


@pytest.mark.xdist_group("gpucluster-fabric")
@launches(_fabric_plan("after"))
def test_fabric_after(cluster: Any, gpucluster_session: Any, hw: Any, judge: Any, handoff: Any) -> None:
    """The same ports after the run (conftest runs this last): error counters that grew fail, naming
    node, device and port."""
    job = _fabric_job(cluster, gpucluster_session, "after")  # a dry run stops here, printing the job
    after = _snapshots(job.values, f"job {job.job_id}")
    deadline = fabric_deadline(gpucluster_session.available_nodes, gpucluster_session.settings).seconds
    got = handoff.receive(FABRIC_BEFORE, "test_fabric_before", deadline)
    if isinstance(got, Absent):
        # not a skip: a skip here would excuse the fabric counters of a cluster that has them
        pytest.fail(f"NOT MEASURED: no before-reading of the fabric ports: {got.why}", pytrace=False)
    before = _snapshots(got.value, f"the before-reading of {got.written_by}")
    # transport errors (a completion in error) are the suite's own when it killed a job in between
    first = min((s.taken_at for s in before if s.taken_at is not None), default=None)
    last = max((s.taken_at for s in after if s.taken_at is not None), default=None)
    killed = [
        w.job
        for w in kill_windows(gpucluster_session.recorder.header.get("jobs") or ())
        if first is None or last is None or (w.start <= last and w.end >= first)
    ]
    verdict = fabric.counter_checks(
        before, after, hw.fabric, hw.name, _selection_env(gpucluster_session), killed=killed
    )
    write = gpucluster_session.progress or print
    for node, ports in verdict.counted.items():
        write(f"fabric ports counted on {node}: {', '.join(ports) or 'none'}")
    for sentence in verdict.warnings:
        warnings.warn(GpuClusterWarning(sentence), stacklevel=1)
    scan = handoff.receive(FABRIC_SCAN_BEFORE, "test_fabric_before", 0.0)  # written with the ports
    try:
        model = model_of_record(scan.value)[0] if isinstance(scan, Handoff) else None
    except ParseError as exc:
        pytest.fail(str(exc), pytrace=False)
    ib_checks = suite_checks(model, hw, write)
    judge([*verdict.checks, *ib_checks], verdict.suspects)


def _soak_duration(session: Any) -> float | None:
    tier = session.tier
    return session.settings.soak or (tier.soak_s if tier is not None else None)


def _soak_plan(session: Any, params: Any) -> list[Any]:
    duration, hw = _soak_duration(session), session.profile.model
    if duration is None:
        return []
    points, _ = soak.runnable(
        soak.soak_points(hw.collectives), session.available_nodes, session.ranks_per_node
    )
    if not points:
        return []
    nodes = session.available_nodes
    deadline = soak_plan.soak_deadline(duration, points, hw.burnin.soak, nodes, session.settings)
    return [soak_plan.soak_part(duration, points, hw.burnin.soak, nodes, deadline, backend=session.backend)]


@launches(_soak_plan)
def test_soak(cluster: Any, gpucluster_session: Any, hw: Any, judge: Any) -> None:
    """The gated collectives repeated for --gpucluster-soak: each series' lowest busbw and its
    variation, per node, node pair or group (see the module doc)."""
    duration = _soak_duration(gpucluster_session)
    if duration is None:
        pytest.skip(
            "soak mode is off: pass --gpucluster-soak DURATION (e.g. 10m) to repeat the gated collectives that long, "
            "or set tiers.burnin.soak in the profile for -m burnin"
        )
    nodes, per_node = gpucluster_session.available_nodes, gpucluster_session.ranks_per_node
    points, why = soak.runnable(soak.soak_points(hw.collectives), nodes, per_node)
    if not points:
        reasons = "; ".join(why) or f"profile {hw.name} has no collectives.checks with min_busbw"
        pytest.skip(f"nothing to soak: {reasons}")
    settings = hw.burnin.soak
    write = gpucluster_session.progress or print
    write(
        f"soak: {', '.join(p.title for p in points)} for {duration:g} s on {nodes} node(s)"
        + (f" (left out: {'; '.join(why)})" if why else "")
    )
    job = run_with_deadline(
        cluster,
        soak_plan.WORKLOAD,
        soak_plan.soak_deadline(duration, points, settings, nodes, gpucluster_session.settings),
        nodes=nodes,
        options=soak_plan.soak_options(points, settings, duration),
        name="burnin-soak",
        estimate_s=soak_plan.soak_estimate(duration, nodes, gpucluster_session.backend),
    )
    try:
        series = soak.collect(job.values, points)
    except GpuClusterError as exc:
        pytest.fail(f"soak job {job.job_id}: {exc}", pytrace=False)
    checks, suspects = soak.soak_checks(series, settings, hw.name)
    judge(checks, suspects)


def _dcgm_plan(session: Any, params: Any) -> list[Any]:
    settings = session.profile.model.burnin.dcgm
    return [
        plans.dcgm_part(
            settings.level, settings.effective_timeout, session.available_nodes, session.settings,
            backend=session.backend,
        )
    ]  # fmt: skip


@launches(_dcgm_plan)
def test_dcgm_diag(cluster: Any, gpucluster_session: Any, hw: Any, judge: Any) -> None:
    """DCGM's own diagnostics (dcgmi diag -r <level> -j) on every node, each test result per GPU a check."""
    settings, nodes = hw.burnin.dcgm, gpucluster_session.available_nodes
    deadline = dcgm_deadline(settings.effective_timeout, nodes, gpucluster_session.settings)
    job = run_with_deadline(
        cluster, plans.DCGM, deadline, nodes=nodes, nproc_per_node=1, init_process_group=False,
        pick_device=False,  # no torch, no CUDA context on GPU 0 while DCGM tests it
        name="burnin-dcgm", options=plans.dcgm_options(settings.level, settings.effective_timeout),
        estimate_s=dcgm_estimate(plans.DCGM_LEVEL_ESTIMATE_S[settings.level], gpucluster_session.backend, nodes),
    )  # fmt: skip
    found = dcgm.node_reports(job.values)
    if not found.reports and not found.broken:
        pytest.skip("DCGM diagnostics: " + "; ".join(why for _, why in found.missing))
    verdict = dcgm.fleet_checks(found, settings.level)
    for sentence in verdict.warnings:
        warnings.warn(GpuClusterWarning(sentence), stacklevel=1)
    judge(list(verdict.checks), list(verdict.suspects))
