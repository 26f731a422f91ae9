"""Burn-in: find the bad node, GPU or link, and say which.

A new batch of nodes often holds a few failing parts, and a slow collective only says "something is
slow". These tests name it (the verdicts: ``checks/burnin/``; what runs: ``plans/burnin.py``):

- **health**: one job on every node at once measures each rank's CPU matmul and memory bandwidth
  and, on GPUs, each GPU's matmul, memory and host-to-device bandwidth, its NVML state sampled
  under that load, its memory health and ECC mode against ``burnin:`` (``checks/burnin/gpu.py``).
- **stragglers**: ranks and nodes slower than the median of their peers by more than
  ``burnin.straggler_tolerance``, from each rank's own matmul and its time outside the calls of an
  all_reduce sweep; `test_injected_straggler_is_named` proves the detector on this cluster.
- **ECC / XID**: counters read before the first and after the last test (acceptance/conftest.py
  orders them); any increase fails, naming the GPU. A node whose kernel log the test user cannot
  read (dmesg restricted, no journal access) gets a check that does not pass, saying why.
- **DCGM diagnostics**: in acceptance/test_fabric.py, with the other readings of the nodes' own tools.
- **version drift**: every node's driver, CUDA, NCCL, net plugin, torch and firmware versions
  against the profile's ``versions:`` pins, and against each other.
- **pairwise localization**: node pairs in two rounds (`burnin.pairwise`), about n/2 + 2 jobs, so
  a plain ``pytest acceptance/`` leaves it out; ``-m burnin`` runs it.

Every suspect goes to ``<results dir>/suspects.json`` as soon as it is found; at the end the
suspects and the ``scontrol update NodeName=... State=DRAIN`` command for each node are printed,
and run at the end of the session with ``--gpucluster-drain``. The self-test's injected straggler is never drained.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.burnin.drift import fleet_versions
from pytest_gpucluster.burnin.pairwise import localize
from pytest_gpucluster.burnin.runner import ClusterPairRunner
from pytest_gpucluster.burnin.stragglers import Sample, find_stragglers, sweep_samples, worst_per_host
from pytest_gpucluster.checks.burnin import health, peers
from pytest_gpucluster.checks.burnin.fabric_path import fabric_path
from pytest_gpucluster.checks.burnin.lost import lost_check, lost_gpus
from pytest_gpucluster.checks.burnin.xid_classes import kill_windows
from pytest_gpucluster.checks.ceilings import broken_above, memory_ceiling
from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning
from pytest_gpucluster.fixtures import FABRIC_MODEL, job_part, run_with_deadline
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.inputs import read_texts
from pytest_gpucluster.launch.xid_step import hold_listener
from pytest_gpucluster.parsers.nccl_log import parse_nccl_log
from pytest_gpucluster.plans import burnin as plans
from pytest_gpucluster.plans.burnin_deadlines import counters_deadline, pair_deadline
from pytest_gpucluster.session import GpuClusterSession
from pytest_gpucluster.session.plan import launches

pytestmark = pytest.mark.burnin
COUNTERS_BEFORE = pytest.StashKey[list[dict[str, Any]]]()
"""test_counters_before's reading, for test_counters_after (same process: same xdist worker)."""
LAG = "time outside the all_reduce per iteration"


@job_part
def health_job(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """One health job on every node at once (the intra-node phase of the localization, too)."""
    tier = session.tier
    load_s = (
        tier.load_s
        if tier is not None and tier.load_s is not None
        else session.profile.model.burnin.load_duration
    )
    return plans.health_part(session.available_nodes, session.settings, load_s, backend=_backend(session))


@job_part
def straggler_sweep(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """A short all_reduce sweep on every node: each rank's time outside the calls."""
    return plans.straggler_sweep_part(session.available_nodes, session.settings, _backend(session))


@job_part
def injected_sweep(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """The same sweep with the last rank sleeping before every call (None with fewer than 2 ranks)."""
    world = session.available_nodes * session.ranks_per_node
    if world < 2:
        return None
    return plans.straggler_sweep_part(
        session.available_nodes, session.settings, _backend(session), inject_rank=world - 1
    )


def _backend(session: GpuClusterSession) -> str:
    return str(session.profile.model.cluster.backend)


@pytest.mark.quick
def test_rank_health_cpu(health_job: PartRun, hw: Any, judge: Any, rerun_part: Any) -> None:
    """Each rank's float32 matmul FLOP/s and memory copy bandwidth, against burnin.min_cpu_*
    (with ``--baseline``, a suspected regression runs the health job once more before it fails)."""
    checks = health.cpu_checks(health_job.values, hw.burnin, hw.name)
    assert checks, "the health job returned no CPU numbers"
    again = lambda _: health.cpu_checks(rerun_part(health_job.part).values, hw.burnin, hw.name)  # noqa: E731
    judge(checks, [health.suspect_of(c) for c in checks if c.failed], remeasure=again)


@pytest.mark.quick
def test_gpu_health(health_job: PartRun, hw: Any, judge: Any) -> None:
    """Each GPU's matmul, memory and host-to-device bandwidth and NVML readings."""
    checks = health.gpu_checks(health_job.values, hw.burnin, hw.name)
    checks = broken_above(checks, memory_ceiling(hw), "burnin.gpu_memory_bandwidth")
    if not checks:
        pytest.skip(health.skip_sentence(health_job.values, "gpu", "nvml") or "no GPU reading came back")
    judge(checks, [health.suspect_of(c) for c in checks if c.failed and c.measured])


def test_health_stragglers(health_job: PartRun, hw: Any, judge: Any) -> None:
    """Ranks whose own matmul (the GPU's where there is one) takes longer than their peers' by
    more than the tolerance."""
    part, samples = health.matmul_samples(health_job.values)
    if len(samples) < 2:
        pytest.skip(f"straggler detection needs 2+ ranks; the health job had {len(samples)}")
    verdict = find_stragglers(samples, tolerance=hw.burnin.straggler_tolerance)
    judge(
        *peers.straggler_checks(
            verdict, f"burnin.rank_{part}_matmul_time", f"{part.upper()} matmul time", "s"
        )
    )


@pytest.mark.quick
def test_intra_node_stragglers(health_job: PartRun, hw: Any, judge: Any) -> None:
    """Nodes whose intra-node all_reduce (all nodes at once) is slower than the other nodes'."""
    per_node = health.intra_node_samples(health_job.values)
    if len(per_node) < 2:
        why = health.skip_sentence(health_job.values, "intra_node")
        got = f"got {len(per_node)}" + (f" ({why})" if why else "")
        pytest.skip(f"comparing nodes needs 2+ nodes with an intra-node all_reduce; {got}")
    samples = [Sample(host, busbw, host) for host, busbw in per_node.items()]
    verdict = find_stragglers(samples, tolerance=hw.burnin.straggler_tolerance, higher_is_better=True)
    judge(*peers.straggler_checks(verdict, "burnin.node_intra_busbw", "intra-node all_reduce busbw", "B/s"))


def test_collective_stragglers(straggler_sweep: PartRun, hw: Any, judge: Any) -> None:
    """Ranks that arrive late at an all_reduce (their time outside the calls, against the median);
    with several nodes, each node's worst rank against the other nodes'."""
    limits = {"tolerance": hw.burnin.straggler_tolerance, "min_excess": hw.burnin.straggler_min_excess}
    samples = sweep_samples(straggler_sweep.values)
    if len(samples) < 2:  # one rank has no peer to be late against: never a pass
        pytest.skip(f"straggler detection needs 2+ ranks; the all_reduce sweep had {len(samples)}")
    verdict = find_stragglers(samples, **limits)
    checks, named = peers.straggler_checks(verdict, "burnin.rank_collective_lag", LAG, "s")
    if len({s.host for s in verdict.samples}) > 1:
        by_node = find_stragglers(worst_per_host(verdict.samples), **limits)
        more, also = peers.straggler_checks(by_node, "burnin.node_collective_lag", f"worst rank's {LAG}", "s")
        checks, named = checks + more, named + also
    judge(checks, named)


def test_injected_straggler_is_named(
    injected_sweep: PartRun | None, hw: Any, gpucluster_session: Any, results: Any
) -> None:
    """Self-test: the last rank sleeps before every timed all_reduce; the detector must name it and
    its host, and nobody else. (Reported here, never written to the drain list.)"""
    if injected_sweep is None:
        pytest.skip("an injected straggler needs 2+ ranks to stand out from")
    slow = injected_sweep.part.options["inject_rank"]
    limits = {"tolerance": hw.burnin.straggler_tolerance, "min_excess": hw.burnin.straggler_min_excess}
    verdict = find_stragglers(sweep_samples(injected_sweep.values), **limits)
    lags, problem = peers.injected_straggler(verdict, slow, plans.INJECTED_DELAY_S)
    results.check_all(lags)
    lines = "; ".join(st.sentence(LAG, "s", verdict.tolerance) for st in verdict.stragglers)
    (gpucluster_session.progress or print)(f"burn-in self-test: suspect {lines or 'none named'}")
    assert problem is None, problem


def _counters(
    cluster: Any, session: Any, hw: Any, phase: str, config: Any = None, *, read_before: bool = False
) -> list[dict[str, Any]]:
    if hw.cluster.device != "cuda":
        pytest.skip(f"profile {hw.name} is a CPU profile: no GPUs, so no ECC or XID counters to read")
    nodes = session.available_nodes
    # the NVML XID listener the first reading starts on each node and the last one stops
    watch = {
        "dir": plans.xid_watch_dir(session.recorder.started_at),
        "phase": phase,
        "max_s": plans.XID_WATCH_MAX_S,
    }
    if phase == "before":  # under Slurm, inside an allocation: held as the controller's own step
        log = session.results_dir / "xid-watch.log"
        step, why = hold_listener(cluster, watch["dir"], plans.XID_WATCH_MAX_S, nodes, log)
        if step is not None:
            watch["held"] = True
            if config is not None:
                config.add_cleanup(step.stop)  # cancelled at the session's end if still there
        elif why:
            warnings.warn(
                GpuClusterWarning(f"{why}; the first reading's job starts the listener"), stacklevel=2
            )
    deadline = counters_deadline(nodes, session.settings)
    job = run_with_deadline(
        cluster,
        plans.COUNTERS,
        deadline,
        nodes=nodes,
        name=f"burnin-counters-{phase}",
        options={"xid_watch": watch},
        estimate_s=plans.counters_part(nodes, session.settings, backend=session.backend).estimate_s,
    )
    if not read_before and not any(v.get("nvml") for v in job.values):  # after a reading: lost GPUs
        pytest.skip(
            "ECC/XID counters: " + (health.skip_sentence(job.values, "nvml") or "NVML returned nothing")
        )
    return job.values


def _counters_plan(when: str) -> Any:
    def planned(session: Any, params: Any) -> list[Any]:
        if session.profile.model.cluster.device != "cuda":
            return []  # a CPU profile has no counters to read: the tests skip
        part = plans.counters_part(session.available_nodes, session.settings, backend=session.backend)
        return [replace(part, name=f"{part.name}-{when}")]

    return planned


@pytest.mark.quick
@pytest.mark.xdist_group("gpucluster-counters")  # before and after in one process (the plugin: loadgroup)
@launches(_counters_plan("before"))
def test_counters_before(cluster: Any, gpucluster_session: Any, hw: Any, request: Any) -> None:
    """ECC, retired-page, remapped-row counters and XID events before the run (conftest runs this first)."""
    request.config.stash[COUNTERS_BEFORE] = _counters(
        cluster, gpucluster_session, hw, "before", request.config
    )


@pytest.mark.quick
@pytest.mark.xdist_group("gpucluster-counters")
@launches(_counters_plan("after"))
def test_counters_after(cluster: Any, gpucluster_session: Any, hw: Any, judge: Any, request: Any) -> None:
    """The same counters after the run (conftest runs this last): uncorrectable ECC errors, retired
    pages and uncorrectable remapped rows that grew, a pending or failed row remap, and new XIDs
    fail, naming the GPU; corrected errors are recorded (gated as a rate where the profile says)."""
    before = request.config.stash.get(COUNTERS_BEFORE, None)
    after = _counters(
        cluster, gpucluster_session, hw, "after", read_before=before is not None
    )  # dry run: stops
    if before is None and hw.cluster.device == "cuda":
        # not a skip: a skip here would excuse the counters of a cluster that has them (fail closed)
        pytest.fail(
            "NOT MEASURED: no before-reading of the ECC/XID counters in this process (test_counters_before "
            "did not run here: deselected, or on another pytest-xdist worker; the plugin groups the two "
            "with --dist loadgroup, so pass -n with --dist load/loadgroup, not --dist each/worksteal)",
            pytrace=False,
        )
    lost = lost_gpus(before, after)
    grown = health.counter_increases(before, after)
    corrected = health.corrected_checks(before, after, hw.burnin, hw.name)
    xids = health.xid_readability_checks(before, after, require=hw.burnin.require_xid_source, profile=hw.name)
    for warning in health.xid_warnings(xids):  # a permission is not a sick node (burnin.require_xid_source)
        warnings.warn(GpuClusterWarning(warning), stacklevel=1)
    # XIDs whose catalog bucket asks nothing of the GPU (RESTART_APP, IGNORE, WORKFLOW_XID_45: 13, 31,
    # 43, 45...) are often the suite's own kills: recorded as warnings, the GPU not blamed
    # (checks/burnin/xid_classes.py)
    kills = kill_windows(gpucluster_session.recorder.header.get("jobs") or ())
    app_xids = health.application_xids(before, after, kills)
    for check in app_xids:
        warnings.warn(GpuClusterWarning(check.hint), stacklevel=1)
    checks = [lost_check(lost), peers.counter_check(grown), *corrected, *xids, *app_xids]
    judge(checks, [*lost, *grown, *(health.suspect_of(c) for c in corrected if c.failed and c.measured)])


def test_version_drift(
    health_job: PartRun, hw: Any, gpucluster_session: Any, judge: Any, request: Any
) -> None:
    """Every node's versions against the profile's versions: pins, and every node against the others;
    NCCL's own word on its version and plugin from --nccl-log files, where given."""
    patterns, root = gpucluster_session.settings.nccl_log, Path(request.config.invocation_params.dir)
    try:
        logs = [(name, parse_nccl_log(text)) for name, text in read_texts("--nccl-log", patterns, root)]
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    fingerprints, findings = fleet_versions(health_job.values, hw.versions, logs)
    for host, versions in fingerprints.items():
        shown = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v)
        (gpucluster_session.progress or print)(f"burn-in versions on {host}: {shown}")
    judge([peers.version_check(findings, hw.name, hw.versions)], [s for f in findings for s in f.suspects()])


def _pairwise_plan(session: Any, params: Any) -> list[Any]:
    b, backend = session.profile.model.burnin, session.profile.model.cluster.backend
    return plans.pairwise_parts(
        session.available_nodes, int(b.pair_size), b.pair_iters, backend, session.settings
    )


@pytest.mark.burnin(slow=True)
@pytest.mark.gpucluster(needs=["multi-node"])
@launches(_pairwise_plan)
def test_pairwise_localization(
    cluster: Any, gpucluster_session: Any, hw: Any, health_job: PartRun, judge: Any, request: Any
) -> None:
    """Disjoint node pairs, then each node of a failing pair against a known-good node: the slow node
    or link is named in two rounds (about n/2 + 2 pair jobs, not n^2). A node slow on its own in the
    health job (test_intra_node_stragglers) is kept out: it would only make its partner look bad.
    Where the run's fabric before-scan reached the InfiniBand fabric (acceptance/test_fabric.py),
    slow pairs that all cross one leaf's uplinks, one leaf, one rail or the only spine between their
    leaves are a ``fabric.ib.path`` finding naming that element and what to check, ahead of the
    nodes, which are then not drained (``checks/burnin/fabric_path.py``)."""
    b, write = hw.burnin, gpucluster_session.progress or print
    alone = peers.slow_alone(health.intra_node_samples(health_job.values), b.straggler_tolerance)
    nodes = [n for n in cluster.spec.host_names[: gpucluster_session.available_nodes] if n not in alone]
    deadline = pair_deadline(int(b.pair_size), b.pair_iters, hw.cluster.backend, gpucluster_session.settings)
    write(f"burn-in pair jobs: {deadline.text}")
    runner = ClusterPairRunner(
        cluster, size_bytes=int(b.pair_size), iters=b.pair_iters, timeout_s=deadline.seconds,
        on_result=lambda rnd, r: write(f"burn-in pair round {rnd}: {r.text()}"),
    )  # fmt: skip
    found = localize(nodes, runner, tolerance=b.straggler_tolerance, floor=b.pair_min_busbw)
    for line in found.lines():
        write(line)
    checks, suspects = peers.pairwise_checks(found, runner.jobs, sorted(alone)), list(found.suspects)
    model = request.config.stash.get(FABRIC_MODEL, None)
    path = fabric_path(model, found) if model is not None and not found.ok else None
    if path is not None and path.is_fabric:  # the element first; its nodes are not drained
        write(path.line())
        checks, suspects = [path.check, *checks], []
    judge(checks, suspects)
