"""Collective bandwidth and latency, with nccl-tests' semantics, gated where the profile says.

Tests, from the profile's ``collectives:`` section:

- ``test_collective[<collective>-intra-node]`` for every collective: a sweep over the profile's
  ``sweep:`` grid on one node, busbw of every size recorded (the report draws the curve), and
  the profile's intra-node checks gated;
- ``test_collective[<collective>-<scope>]`` for every other (collective, scope) with checks:
  inter-node runs on 2 nodes (skipped with fewer), full on every node of the session;
- ``test_nccl_tests[...]``: the same checks gated on the output of the real nccl-tests binaries,
  when ``--nccl-tests-dir`` or the profile's ``collectives.nccl_tests_dir`` names them.

What is gated, per check: busbw (``min_busbw``, out-of-place, as nccl-tests numbers are quoted)
and the time of one collective (``max_latency``) at the check's size — never nccl-tests' ``Avg
bus bandwidth``, which averages whatever sizes were swept — and zero wrong elements over the
whole sweep. Each point is timed ``repeat`` times; the median is gated and the spread recorded.
A failure states the measured value, the threshold, the size, the scope and node count, and
names the slowest rank and its host (``checks/collectives.py``).

With ``--baseline``, the gated values (the checks above and each curve's peak busbw and busbw at
its largest size) are held against the baseline; a suspected regression is swept again, only
its sizes (``plans.collectives.confirmation_part``), and fails only if the second sweep regresses too.

Latency means nccl-tests' latency: on a GPU, ``max_latency`` is gated only in
``test_nccl_tests`` (the binaries' own time per call). The torch sweep's time on CUDA (CUDA events
around a Python loop of ``dist`` calls, whose dispatch inflates small sizes up to ~2x) is recorded
as information there, its hint saying so. On a CPU profile (gloo, no nccl-tests) the sweep's time
per call, ``perf_counter`` around a loop of blocking calls, is gated: it is what a rank waits.

Each scope's job runs under ``collectives.scope_env`` for that scope (``plans/collectives.job_env``,
the nccl-tests runs too), so a floor measured with an algorithm (``algo: Tree``) is measured with it
again; the job's ``NCCL_ALGO`` is recorded as the ``nccl_algo`` label, and a floor whose algorithm
the job's environment does not allow says so in its hint.

Cost: every case is a part of the shared jobs (``plans/collectives.py``), so the sweeps of all
collectives on one node count run in one launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.ceilings import broken_above, collective_ceiling
from pytest_gpucluster.checks.collectives import (
    Case,
    CollectiveData,
    cases,
    collect,
    collective_checks,
    points_from_runs,
    scope_nodes,
)
from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.launch.nccl_tests import binary_path, build_command, run_command
from pytest_gpucluster.plans.collectives import confirmation_part, job_env, sweep_part
from pytest_gpucluster.session import GpuClusterSession, get_session


def _marks(case: Case, backend: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.gpucluster(min_nodes=2)] if case.scope == "inter-node" else []
    if case.collective == "all_reduce" and case.scope == "intra-node":
        marks.append(pytest.mark.quick)  # the quick tier's short intra-node all_reduce
    return marks + ([pytest.mark.gpucluster(needs=["nccl"])] if backend == "nccl" else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    profile = get_session(metafunc.config).profile.model
    if "case" in metafunc.fixturenames:
        backend = profile.cluster.backend
        params = [pytest.param(c, id=c.id, marks=_marks(c, backend)) for c in cases(profile.collectives)]
        metafunc.parametrize("case", params)
    if "nccl_case" in metafunc.fixturenames:
        gpu = [pytest.mark.gpucluster(needs=["cuda"])] if profile.cluster.device == "cuda" else []
        checked = [pytest.param(c, id=c.id, marks=gpu) for c in cases(profile.collectives) if c.checks]
        reason = f"profile {profile.name} has no collectives.checks to gate nccl-tests on"
        metafunc.parametrize(
            "nccl_case",
            checked or [pytest.param(None, id="no-checks", marks=pytest.mark.skip(reason=reason))],
        )


@job_part
def collective_sweep(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """The sweeps of the test's case on the nodes its scope means (None: the scope cannot run here)."""
    profile, case = session.profile.model, params["case"]
    env = job_env(profile, case.scope)
    return sweep_part(
        case, profile.collectives, session.available_nodes, profile.cluster.backend, env,
        cluster=profile.cluster, ranks_per_node=session.ranks_per_node, settings=session.settings,
        checked_only=session.tier is not None and session.tier.sweep == "checked",
    )  # fmt: skip


def _origin(run: PartRun) -> str:
    return (
        f"sweep job {run.job_id} (nccl-tests-style tables in {Path(run.job_dir) / 'progress.log'}, "
        "per-rank logs beside it)"
    )


def test_collective(
    case: Case,
    collective_sweep: PartRun | None,
    hw: Any,
    gpucluster_session: Any,
    results: Any,
    rerun_part: Any,
) -> None:
    """busbw and time per size of one collective on one scope; the profile's checks gated."""
    nodes, reason = scope_nodes(
        case.scope, gpucluster_session.available_nodes, gpucluster_session.ranks_per_node
    )
    if collective_sweep is None:
        pytest.skip(reason or "nothing to sweep")
    data = collect(collective_sweep.values)[case.collective]
    if data.skipped:
        pytest.skip(f"{case.collective} on {hw.cluster.backend}: {data.skipped}")
    dtype = hw.collectives.sweep.dtype
    env = {**gpucluster_session.nccl_env, **collective_sweep.part.env}
    judged = {"profile": hw.name, "nodes": nodes, "dtype": dtype, "env": env}

    def again(suspects: Any) -> Any:
        part, whole = confirmation_part(collective_sweep.part, case, hw.collectives, suspects)
        run = rerun_part(part)
        fresh = collect(run.values)[case.collective]
        return collective_checks(case, fresh, **judged, origin=_origin(run), partial=not whole)

    checks = collective_checks(case, data, **judged, origin=_origin(collective_sweep))
    ceiling = collective_ceiling(hw, case.collective, case.scope, env)
    results.check_all(broken_above(checks, ceiling, f"collectives.{case.collective}.busbw*"), remeasure=again)


@pytest.fixture
def nccl_tests(
    nccl_case: Case, hw: Any, gpucluster_session: Any
) -> tuple[CollectiveData, str, int, dict[str, str]]:
    """The nccl-tests binary of the case's collective, run ``repeat`` times per checked size:
    its points, where they come from, the node count and the NCCL environment it ran under."""
    directory = gpucluster_session.settings.nccl_tests_dir or hw.collectives.nccl_tests_dir
    if directory is None:
        pytest.skip(
            f"no nccl-tests binaries to run: pass --nccl-tests-dir DIR or set collectives.nccl_tests_dir in profile {hw.name}"
        )
    if hw.cluster.device != "cuda":
        pytest.skip(f"nccl-tests needs CUDA GPUs; profile {hw.name} is a CPU profile")
    nodes, reason = scope_nodes(
        nccl_case.scope, gpucluster_session.available_nodes, gpucluster_session.ranks_per_node
    )
    if reason:
        pytest.skip(reason)
    try:
        binary = binary_path(directory, nccl_case.collective)
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    hosts = list(gpucluster_session.cluster.spec.host_names[:nodes])
    logs, sweep, runs = gpucluster_session.results_dir / "nccl-tests", hw.collectives.sweep, []
    env = {**gpucluster_session.nccl_env, **job_env(hw, nccl_case.scope)}
    for size in sorted({int(check.size) for _, check in nccl_case.checks}):
        command = build_command(
            binary, hosts, gpucluster_session.ranks_per_node, min_bytes=size, max_bytes=size, factor=2,
            warmup=sweep.warmup, iters=sweep.iters, dtype=sweep.dtype, op=sweep.op, check=sweep.check,
            env=env, launcher=gpucluster_session.cluster.launcher,
            forward_patterns=gpucluster_session.forward_patterns,
        )  # fmt: skip
        if gpucluster_session.settings.dry_run:
            print(f"[dry run] {command.shell_line()}")
            pytest.skip("--gpucluster-dry-run: commands printed, nothing launched")
        try:
            runs += [
                run_command(command, logs / f"{nccl_case.id}-{size}-{rep}.log", 600.0)
                for rep in range(hw.collectives.repeat)
            ]
        except GpuClusterError as exc:  # a failed, hung or non-MPI run: its own words, no traceback
            pytest.fail(str(exc), pytrace=False)
    data = CollectiveData(nccl_case.collective, tuple(points_from_runs(runs)), hosts=tuple(hosts))
    return data, f"{binary.name} on {', '.join(hosts)} (logs in {logs})", nodes, env


def test_nccl_tests(
    nccl_case: Case, nccl_tests: tuple[CollectiveData, str, int, dict[str, str]], hw: Any, results: Any
) -> None:
    """The profile's checks on the real nccl-tests binaries: ``repeat`` runs per checked size."""
    data, origin, nodes, env = nccl_tests
    dtype = hw.collectives.sweep.dtype
    checks = collective_checks(
        nccl_case, data, profile=hw.name, nodes=nodes, dtype=dtype, origin=origin, tool="nccl-tests", env=env
    )
    ceiling = collective_ceiling(hw, nccl_case.collective, nccl_case.scope, env)
    results.check_all(broken_above(checks, ceiling, f"collectives.{nccl_case.collective}.busbw*"))
