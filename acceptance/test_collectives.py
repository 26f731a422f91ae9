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
names the slowest rank and its host.

Cost: one launch per node count, sweeping every selected collective (``collectives:sweep_many``);
under cpu-local that is one 2-rank gloo job of ~10-20 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.collectives import (
    WORKLOAD,
    Case,
    CollectiveData,
    Gate,
    cases,
    collect,
    gates,
    job_options,
    job_timeout,
    plan_jobs,
    points_from_runs,
    scope_nodes,
)
from pytest_gpucluster.errors import GpuClusterError, JobFailed
from pytest_gpucluster.launch.nccl_tests import binary_path, build_command, run_command
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.plugin import get_session
from pytest_gpucluster.results.recorder import Recorder, ThresholdFailure


def _marks(case: Case, backend: str) -> list[pytest.MarkDecorator]:
    marks = []
    if case.scope == "inter-node":
        marks.append(pytest.mark.gpucluster(min_nodes=2))
    if backend == "nccl":
        marks.append(pytest.mark.gpucluster(needs=["nccl"]))
    return marks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = get_session(metafunc.config)
    profile = session.profile.model
    backend = profile.cluster.backend
    if "case" in metafunc.fixturenames:
        params = [pytest.param(c, id=c.id, marks=_marks(c, backend)) for c in cases(profile.collectives)]
        metafunc.parametrize("case", params)
    if "nccl_case" in metafunc.fixturenames:
        checked = [c for c in cases(profile.collectives) if c.checks]
        gpu = [pytest.mark.gpucluster(needs=["cuda"])] if profile.cluster.device == "cuda" else []
        params = [pytest.param(c, id=c.id, marks=gpu) for c in checked] or [
            pytest.param(
                None,
                id="no-checks",
                marks=pytest.mark.skip(
                    reason=f"profile {profile.name} has no collectives.checks to gate nccl-tests on"
                ),
            )
        ]
        metafunc.parametrize("nccl_case", params)


class _Jobs:
    """One sweep job per node count, launched by the first test that needs it and shared by the
    rest; it sweeps what the selected tests (after ``-k``) need, and nothing more."""

    def __init__(self, request: pytest.FixtureRequest, session: Any, hw: Any) -> None:
        self.request, self.session, self.hw = request, session, hw
        self.available_nodes = session.available_nodes
        selected = [
            item.callspec.params["case"]
            for item in request.session.items
            if item.path == request.path and "case" in getattr(getattr(item, "callspec", None), "params", {})
        ]
        self.plan = plan_jobs(selected, hw.collectives.sweep, self.available_nodes)
        self.done: dict[int, tuple[dict[str, CollectiveData], str] | BaseException] = {}

    def get(self, nodes: int) -> tuple[dict[str, CollectiveData], str]:
        if nodes not in self.done:
            try:
                self.done[nodes] = self._run(nodes)
            except (Exception, pytest.skip.Exception) as exc:
                self.done[nodes] = exc
                if not isinstance(exc, (JobSkipped, pytest.skip.Exception)):
                    raise  # the first test shows the whole story (traceback included)
        outcome = self.done[nodes]
        if isinstance(outcome, pytest.skip.Exception):
            pytest.skip(outcome.msg)
        if isinstance(outcome, JobSkipped):
            pytest.skip(str(outcome))
        if isinstance(outcome, GpuClusterError):
            raise type(outcome)(str(outcome))  # the same report in every test that needed the job
        if isinstance(outcome, BaseException):
            raise JobFailed(
                f"the sweep job on {nodes} node(s) failed in an earlier test: {type(outcome).__name__}: {outcome}"
            )
        return outcome

    def _run(self, nodes: int) -> tuple[dict[str, CollectiveData], str]:
        requests = self.plan[nodes]
        section = self.hw.collectives
        cluster = self.request.getfixturevalue("cluster")
        job = cluster.run(
            WORKLOAD,
            nodes=nodes,
            env=self.request.getfixturevalue("nccl_env"),
            timeout=job_timeout(requests, section.sweep, section.repeat, self.hw.cluster.backend),
            options=job_options(requests, section.sweep, section.repeat),
            name=f"collectives-{nodes}node",
        )
        data = collect(job.values, requests)  # .values raises JobFailed / JobSkipped
        origin = (
            f"sweep job {job.job_id} (nccl-tests-style tables in {Path(job.job_dir) / 'progress.log'}, "
            "per-rank logs beside it)"
        )
        return data, origin


@pytest.fixture(scope="module")
def sweep_jobs(request: pytest.FixtureRequest, gpucluster_session: Any, hw: Any) -> _Jobs:
    return _Jobs(request, gpucluster_session, hw)


def _judge(results: Recorder, checks: list[Gate]) -> None:
    """Record every value, then fail once with every missed threshold (not just the first)."""
    __tracebackhide__ = True
    missed = []
    for g in checks:
        try:
            results.check(
                g.metric,
                g.value,
                g.threshold,
                unit=g.unit,
                comparison=g.comparison,  # type: ignore[arg-type]
                scope=g.scope,
                labels=g.labels,
                spread=g.spread,
                source=g.source,
                context=g.context,
            )
        except ThresholdFailure as exc:
            missed.append(str(exc))
    if missed:
        raise ThresholdFailure("\n".join(missed))


def test_collective(case: Case, sweep_jobs: _Jobs, hw: Any, results: Recorder) -> None:
    """busbw and time per size of one collective on one scope; the profile's checks gated."""
    nodes, reason = scope_nodes(case.scope, sweep_jobs.available_nodes)
    if reason:
        pytest.skip(reason)
    data, origin = sweep_jobs.get(nodes)
    got = data[case.collective]
    if got.skipped:
        pytest.skip(f"{case.collective} on {hw.cluster.backend}: {got.skipped}")
    dtype = hw.collectives.sweep.dtype
    _judge(results, gates(case, got, profile=hw.name, nodes=nodes, dtype=dtype, origin=origin))


def test_nccl_tests(nccl_case: Case, hw: Any, gpucluster_session: Any, results: Recorder) -> None:
    """The profile's checks on the real nccl-tests binaries: ``repeat`` runs per checked size."""
    directory = gpucluster_session.settings["gpucluster_nccl_tests_dir"] or hw.collectives.nccl_tests_dir
    if directory is None:
        pytest.skip(
            f"no nccl-tests binaries to run: pass --nccl-tests-dir DIR or set collectives.nccl_tests_dir "
            f"in profile {hw.name}"
        )
    if hw.cluster.device != "cuda":
        pytest.skip(f"nccl-tests needs CUDA GPUs; profile {hw.name} is a CPU profile")
    nodes, reason = scope_nodes(nccl_case.scope, gpucluster_session.available_nodes)
    if reason:
        pytest.skip(reason)
    section, sweep = hw.collectives, hw.collectives.sweep
    try:
        binary = binary_path(directory, nccl_case.collective)
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = gpucluster_session.cluster
    hosts = list(cluster.spec.host_names[:nodes])
    runs = []
    logs = gpucluster_session.results_dir / "nccl-tests"
    for size in sorted({int(check.size) for _, check in nccl_case.checks}):
        command = build_command(
            binary, hosts, gpucluster_session.ranks_per_node, min_bytes=size, max_bytes=size, factor=2,
            warmup=sweep.warmup, iters=sweep.iters, dtype=sweep.dtype, op=sweep.op, check=sweep.check,
            env=gpucluster_session.nccl_env,
        )  # fmt: skip
        if gpucluster_session.settings.dry_run:
            print(f"[dry run] {command.shell_line()}")
            pytest.skip("--gpucluster-dry-run: commands printed, nothing launched")
        for rep in range(section.repeat):
            log = logs / f"{nccl_case.id}-{size}-{rep}.log"
            runs.append(run_command(command, log, timeout_s=600.0))
    data = CollectiveData(nccl_case.collective, tuple(points_from_runs(runs)), hosts=tuple(hosts))
    origin = f"{binary.name} on {', '.join(hosts)} (logs in {logs})"
    checks = gates(
        nccl_case, data, profile=hw.name, nodes=nodes, dtype=sweep.dtype, origin=origin, tool="nccl-tests"
    )
    _judge(results, checks)
