"""Fixtures the plugin gives every test: hw, machine, nodes, cluster, hostfile, nccl_env, results,
shared_jobs, rerun_part, handoff; and `job_part`, which declares a fixture that runs one part of the
shared jobs.

Registered by plugin.py once the session has started. The ``process_group`` fixture for
rank-side tests lives with the rank-test machinery (rank_tests.py).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning, JobFailed
from pytest_gpucluster.harness import Part, PartRun, SharedJobs, job_timing
from pytest_gpucluster.plans.deadlines import Deadline
from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.handoff import Absent, Handoff, await_handoff, write_handoff
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.session import GpuClusterSession, get_session
from pytest_gpucluster.session.plan import PLANNERS, Planner, item_params, planned_parts


@pytest.fixture(scope="session")
def gpucluster_session(request: pytest.FixtureRequest) -> GpuClusterSession:
    """The whole session object (profile, settings, machine, recorder)."""
    return get_session(request.config)


@pytest.fixture(scope="session")
def hw(gpucluster_session: GpuClusterSession) -> ProfileModel:
    """The selected hardware profile, validated, with ``extends:`` merged."""
    return gpucluster_session.profile.model


@pytest.fixture(scope="session")
def machine(gpucluster_session: GpuClusterSession) -> MachineInfo:
    """What was detected on the machine running pytest (often a login node: judge ``nodes``)."""
    return gpucluster_session.machine


@pytest.fixture(scope="session")
def nodes(gpucluster_session: GpuClusterSession) -> ClusterFacts:
    """Every node as the per-node probe found it (GPUs, versions, ports, environment); skips when
    the nodes were not probed (a dry run), and fails when the cluster itself cannot be built."""
    facts = gpucluster_session.node_facts
    if facts is None:
        error = gpucluster_session.cluster_error()
        if error is not None:
            pytest.fail(f"cannot probe the nodes: {error}", pytrace=False)
        pytest.skip(f"the nodes were not probed: {gpucluster_session.not_probed or 'no probe ran'}")
    return facts


class DryRunCluster:
    """Stands in for the cluster under ``--gpucluster-dry-run``: launches nothing and skips the
    test at its first launch; with ``-v``, prints each job's commands per host (its environment
    included) and each self-launched job's deadline first."""

    def __init__(self, cluster: Any, write: Any, verbose: bool = False) -> None:
        self._cluster = cluster
        self._write = write
        self.verbose = verbose

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def run(self, workload: Any, **kwargs: Any) -> Any:
        kwargs.pop("init_process_group", None)
        kwargs.pop("pick_device", None)
        if self.verbose:
            for command in self._cluster.commands_for(workload, **kwargs):
                self._write(f"[dry run] {command.host}: {command.shell_line()}")
        pytest.skip("--gpucluster-dry-run: nothing launched (-v prints the commands)")

    def show_deadline(self, name: str, nodes: int, nproc_per_node: int | None, deadline: Deadline) -> None:
        """The plan's line for a job its test launches itself (not a shared part), with -v."""
        if self.verbose:
            ranks = nproc_per_node or self._cluster.spec.nproc_per_node
            self._write(f"[dry run] plan: {name}: {nodes} node(s) x {ranks} rank(s), {deadline.text}")


def run_with_deadline(cluster: Any, workload: str, deadline: Deadline, **kwargs: Any) -> Any:
    """``cluster.run(workload, timeout=deadline.seconds, **kwargs)`` for a job a test launches
    itself; a dry run first prints its deadline and where it comes from (with -v), as the plan does
    for the shared parts (``kwargs`` must name the job: ``name=``, and its ``nodes=`` count). The
    job's time goes to results.json's ``jobs`` beside its estimate (``estimate_s=``, if given), under
    the name the plan gives it (``planned_as=``, else ``name``), which a later dry run's calibration
    matches (`plans.calibration`)."""
    estimate_s = kwargs.pop("estimate_s", None)
    name, nodes = kwargs.get("name") or workload, kwargs.get("nodes")
    planned_as = kwargs.pop("planned_as", None) or name
    count = len(nodes) if isinstance(nodes, (list, tuple)) else int(nodes or 1)
    if isinstance(cluster, DryRunCluster):
        cluster.show_deadline(name, count, kwargs.get("nproc_per_node"), deadline)
        return cluster.run(workload, timeout=deadline.seconds, **kwargs)
    part = Part(str(planned_as), workload, nodes=count, timeout_s=deadline.seconds, estimate_s=estimate_s)
    ranks = kwargs.get("nproc_per_node") or getattr(getattr(cluster, "spec", None), "nproc_per_node", None)
    started = time.monotonic()
    try:
        job = cluster.run(workload, timeout=deadline.seconds, **kwargs)
    except JobFailed as exc:
        job_id = getattr(exc.result, "job_id", None)
        _record_job(job_timing([part], time.monotonic() - started, job_id, "failed", ranks))
        raise
    _record_job(job_timing([part], time.monotonic() - started, getattr(job, "job_id", None), "ok", ranks))
    return job


_JOB_LOG: list[Callable[[dict[str, Any]], None]] = []
"""Where job timings go: the session's results.json (`record_jobs_in`)."""


def record_jobs_in(session: GpuClusterSession) -> Callable[[dict[str, Any]], None]:
    """A callback appending one job's timing to the session's results.json header (``jobs``)."""

    def record(entry: dict[str, Any]) -> None:
        session.recorder.header.setdefault("jobs", []).append(entry)

    _JOB_LOG[:] = [record]
    return record


def _record_job(entry: dict[str, Any]) -> None:
    for record in _JOB_LOG:
        record(entry)


@pytest.fixture(scope="session")
def cluster(gpucluster_session: GpuClusterSession, request: pytest.FixtureRequest) -> Any:
    """Launch work on N ranks: ``cluster.run("pkg.mod:func", nodes=2, env=nccl_env, timeout=120)``."""
    try:
        handle = gpucluster_session.cluster
    except GpuClusterError as exc:
        pytest.fail(f"cannot build the cluster: {exc}", pytrace=False)
    if gpucluster_session.settings.dry_run:
        verbose = request.config.get_verbosity() > 0
        return DryRunCluster(handle, gpucluster_session.progress or print, verbose)
    record_jobs_in(gpucluster_session)  # a job launched before any shared part is recorded too
    return handle


@pytest.fixture(scope="session")
def hostfile(gpucluster_session: GpuClusterSession) -> Any:
    """The parsed ``--hostfile`` (None when running on the local machine only)."""
    try:
        return gpucluster_session.hostfile
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def nccl_env(gpucluster_session: GpuClusterSession) -> dict[str, str]:
    """The profile's NCCL environment merged with the user's own ``NCCL_*`` variables (which win).

    Warns on ``NCCL_*`` names NCCL does not know: NCCL ignores a typo such as ``NCCL_IB_HCAS``
    without a word. The effective environment, redacted, is in results.json (``nccl_env``).
    """
    from pytest_gpucluster.cluster.nccl_names import unknown_nccl_names

    env = dict(gpucluster_session.nccl_env)
    profile = gpucluster_session.profile.name
    for unknown in unknown_nccl_names(env):
        where = "the environment" if unknown.name in os.environ else f"profile {profile}'s nccl_env"
        warnings.warn(GpuClusterWarning(f"{unknown} (set in {where})"), stacklevel=2)
    return env


@pytest.fixture
def results(gpucluster_session: GpuClusterSession, request: pytest.FixtureRequest) -> Recorder:
    """The recorder: ``results.check(metric, value, threshold, unit=..., scope=..., labels=...)``."""
    recorder = gpucluster_session.recorder
    recorder.current_test = request.node.nodeid
    if recorder.explain is None and (facts := gpucluster_session.node_facts) is not None:
        from pytest_gpucluster.checks.readiness import explainer  # a symptom names its readiness cause

        recorder.explain = explainer(facts, gpucluster_session.profile.model)
    return recorder


@pytest.fixture
def local_devices(
    gpucluster_session: GpuClusterSession, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[int]]:
    """GPU indices a single-device test may use in the pytest process itself.

    Under pytest-xdist each worker owns its slice of the node's GPUs: ``CUDA_VISIBLE_DEVICES`` is set
    for this test only (multi-rank jobs launched later still see every device), and the node's device
    lock is held shared, so single-device tests run side by side but never beside a multi-rank job.
    Without xdist the test gets every GPU; on a machine without GPUs, an empty list.
    """
    from pytest_gpucluster.launch.xdist import WORKER_ENV, cuda_visible_devices, launch_lock, under_xdist

    gpus = gpucluster_session.machine.gpu_count
    if not under_xdist() or gpus == 0:
        yield list(range(gpus))
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    visible = cuda_visible_devices(
        os.environ[WORKER_ENV], workers, gpus, inherited=os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with launch_lock(gpucluster_session.results_dir / "jobs", exclusive=False):
        yield list(range(len(visible.split(","))))


def _upcoming(pytest_session: pytest.Session, session: GpuClusterSession) -> Callable[[], list[Part]]:
    """The parts of the selected tests from the running one on, except tests that will skip for
    what the session lacks: what a job launched now may run for them too."""

    def parts() -> list[Part]:
        # An xdist worker runs a share of the tests that it cannot know in advance; a dry run
        # prints each test's own commands.
        if session.is_xdist_worker or session.settings.dry_run:
            return []
        items = list(pytest_session.items)
        ids = [item.nodeid for item in items]
        start = ids.index(session.recorder.current_test) if session.recorder.current_test in ids else 0
        return planned_parts(items[start:], session)

    return parts


@pytest.fixture(scope="session")
def shared_jobs(
    gpucluster_session: GpuClusterSession,
    cluster: Any,
    nccl_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> SharedJobs:
    """The session's `harness.SharedJobs`: each part run once, parts that launch alike in one job,
    every job with the session's NCCL environment (``nccl_env``, which warns on names NCCL ignores)."""
    upcoming = _upcoming(request.session, gpucluster_session)
    return SharedJobs(cluster, upcoming, nccl_env, on_job=record_jobs_in(gpucluster_session))


@pytest.fixture
def rerun_part(shared_jobs: SharedJobs, request: pytest.FixtureRequest) -> Callable[[Part], PartRun]:
    """``rerun_part(part)``: the part measured again in a job of its own, for the regression gate's
    confirmation (``results.check_all(checks, remeasure=...)``; `SharedJobs.rerun`)."""
    return lambda part: shared_jobs.rerun(part, request.node.nodeid)


JOB_FAILURE = pytest.StashKey[JobFailed]()
"""The failed job of a test's `job_part` fixture, raised again when the test is called (plugin.py)."""

FABRIC_SCAN_BEFORE = "fabric-scan-before"
"""The handoff (`handoff` fixture) of the InfiniBand fabric model of the run's before-scan
(`fabric_scan.suite_reading`: ``{"model": FabricModel.to_json() or None, "why": ...}``, None where
the controller does not reach the fabric, ``why`` saying so); written by acceptance/test_fabric.py's
test_fabric_before, read by its after-scan and by the pairwise burn-in, which names the fabric
element its slow pairs all cross (``checks/burnin/fabric_path.py``)."""


class Handoffs:
    """One test's side of `results.handoff`: `giving` a reading to later tests, `receive` one."""

    def __init__(self, session: GpuClusterSession, request: pytest.FixtureRequest) -> None:
        self._session, self._request = session, request

    @contextlib.contextmanager
    def giving(self, name: str) -> Iterator[Callable[[Any], None]]:
        """``with handoff.giving(name) as give: give(value)``. Leaving the block without ``give``
        (a failure, a skip, an error) records why, so a later test says it instead of waiting."""
        given: list[Any] = []
        try:
            yield given.append
        except BaseException as exc:
            if given:  # the reading was taken; what failed after it is the test's own
                self._write(name, given[-1])
                raise
            why = str(getattr(exc, "msg", None) or exc or type(exc).__name__).strip().splitlines()
            verb = "skipped" if isinstance(exc, pytest.skip.Exception) else "failed"
            self._write(name, None, missing=f"{self._request.node.name} {verb}: {why[0] if why else '?'}")
            raise
        if not given:
            self._write(name, None, missing=f"{self._request.node.name} ended without a reading")
        else:
            self._write(name, given[-1])

    def _write(self, name: str, value: Any, *, missing: str | None = None) -> None:
        gc = self._session
        write_handoff(gc.results_dir, name, gc.session_tag, self._request.node.nodeid, value, missing=missing)

    def receive(self, name: str, writer: str, deadline_s: float) -> Handoff | Absent:
        """The reading ``writer`` (a test function's name) handed over, waiting up to ``deadline_s``
        while that test is selected in this run and has not written it yet (another xdist worker)."""
        selected = any(getattr(i, "originalname", i.name) == writer for i in self._request.session.items)
        gc = self._session
        return await_handoff(
            gc.results_dir, name, gc.session_tag, writer, selected=selected, deadline_s=deadline_s
        )


@pytest.fixture
def handoff(gpucluster_session: GpuClusterSession, request: pytest.FixtureRequest) -> Handoffs:
    """Readings handed from one test to a later one through the results directory, so that the two
    may run in different pytest-xdist workers (``results/handoff.py``): ``with handoff.giving(name)
    as give: give(value)`` in the earlier test, ``handoff.receive(name, writer, deadline_s)`` in the
    later one (a `Handoff`, or an `Absent` saying why there is none: its NOT MEASURED)."""
    return Handoffs(gpucluster_session, request)


def job_part(planner: Planner) -> Any:
    """Declare a fixture that runs one part of the session's shared jobs::

        @job_part
        def health_job(session, params):
            return plans.burnin.health_part(session.available_nodes, session.settings)

    The fixture, named like the function, is the part's `PartRun` (None when the planner returns
    None). The planner is also asked for the part of every selected test that uses the fixture, so
    that the first launch runs all the parts that run on the same ranks (``params``: the test's
    parameters). A part whose ranks skipped skips the test; a part that failed fails it.
    """
    PLANNERS[planner.__name__] = planner

    @pytest.fixture(name=planner.__name__)
    def fixture(request: pytest.FixtureRequest, gpucluster_session: GpuClusterSession) -> PartRun | None:
        part = planner(gpucluster_session, item_params(request.node))
        if part is None:
            return None  # nothing to launch: the cluster is not even built (--train-log, --nccl-log)
        shared: SharedJobs = request.getfixturevalue("shared_jobs")
        try:
            return shared.run(part, request.node.nodeid)
        except JobFailed as exc:
            # The workload the test measures crashed or hung on a rank: the cluster failed the test
            # (FAILED, an infrastructure failure in the summary), no error in setting it up. The
            # plugin raises it again when the test is called (`JOB_FAILURE`).
            request.node.stash[JOB_FAILURE] = exc
            return None

    fixture.__doc__ = planner.__doc__
    return fixture
