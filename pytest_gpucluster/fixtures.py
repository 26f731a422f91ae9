"""Fixtures the plugin gives every test: hw, machine, cluster, hostfile, nccl_env, results.

Registered by plugin.py once the session has started. The ``process_group`` fixture for
rank-side tests lives with the rank-test machinery (rank_tests.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning
from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.session import GpuClusterSession


def _session(request: pytest.FixtureRequest) -> GpuClusterSession:
    from pytest_gpucluster.plugin import get_session

    return get_session(request.config)


@pytest.fixture(scope="session")
def gpucluster_session(request: pytest.FixtureRequest) -> GpuClusterSession:
    """The whole session object (profile, settings, machine, recorder)."""
    return _session(request)


@pytest.fixture(scope="session")
def hw(gpucluster_session: GpuClusterSession) -> ProfileModel:
    """The selected hardware profile, validated, with ``extends:`` merged."""
    return gpucluster_session.profile.model


@pytest.fixture(scope="session")
def machine(gpucluster_session: GpuClusterSession) -> MachineInfo:
    """What was detected on the machine running pytest."""
    return gpucluster_session.machine


class DryRunCluster:
    """Stands in for the cluster under ``--gpucluster-dry-run``: prints each job's commands per
    host, launches nothing, and skips the test at its first launch."""

    def __init__(self, cluster: Any, write: Any) -> None:
        self._cluster = cluster
        self._write = write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def run(self, workload: Any, **kwargs: Any) -> Any:
        kwargs.pop("init_process_group", None)
        for command in self._cluster.commands_for(workload, **kwargs):
            self._write(f"[dry run] {command.host}: {command.shell_line()}")
        pytest.skip("--gpucluster-dry-run: commands printed, nothing launched")


@pytest.fixture(scope="session")
def cluster(gpucluster_session: GpuClusterSession, request: pytest.FixtureRequest) -> Any:
    """Launch work on N ranks: ``cluster.run("pkg.mod:func", nodes=2, env=nccl_env, timeout=120)``."""
    try:
        handle = gpucluster_session.cluster
    except GpuClusterError as exc:
        pytest.fail(f"cannot build the cluster: {exc}", pytrace=False)
    if gpucluster_session.settings.dry_run:
        return DryRunCluster(handle, gpucluster_session.progress or print)
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
    gpucluster_session.recorder.current_test = request.node.nodeid
    return gpucluster_session.recorder


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
