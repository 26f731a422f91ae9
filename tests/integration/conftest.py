"""Helpers for tests that run a pytest of their own, kill it, and read the process table.

`spawn_pytest` starts ``python -m pytest`` on a test file in a subprocess (its own session,
its own results directory, none of this run's xdist or gpucluster variables) and hands back a
`ControllerRun`. Whatever a test leaves (the pytest, processes of its jobs, found with
`proc_table.job_pids`) is killed by pid in the fixture's finalizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_table import job_pids

from pytest_gpucluster.workloads._runtime import JOB_FILE
from pytest_gpucluster.workloads.basic import HANGS_NOW

_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")


def _job_workload(job: Path) -> str:
    """The workload a job directory's job file names ("" while the file is not written yet)."""
    try:
        return str(json.loads((job / JOB_FILE).read_text())["workload"])
    except (OSError, ValueError, KeyError):
        return ""


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class ControllerRun:
    """A pytest running in a subprocess: the controller of the jobs its tests launch."""

    def __init__(self, proc: subprocess.Popen, results: Path, out: Path) -> None:
        self.proc = proc
        self.results = results
        self.out = out

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def job_dirs(self) -> list[Path]:
        jobs = self.results / "jobs"
        return sorted(p for p in jobs.iterdir() if p.is_dir()) if jobs.is_dir() else []

    def wait_for_hung_rank(
        self, rank: int = 1, workload: str = "hang_on_rank", seconds: float = 120.0
    ) -> Path:
        """The directory of the job running ``workload`` once its ``rank`` says it hangs there.

        Other jobs of the session (the node probe runs first, one rank per node) have ranks that
        run too, and a rank that runs may still be starting: the rank's own line in its log is the
        state the caller needs (its stack dump will show ``workload``)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"pytest ended early:\n{self.output()}"
            for job in self.job_dirs():
                if _job_workload(job).rpartition(":")[2] != workload:
                    continue
                with contextlib.suppress(OSError):
                    said = (job / f"rank-{rank}.log").read_text(errors="replace")
                    if f"{workload}: rank {rank} {HANGS_NOW}" in said:
                        return job
            time.sleep(0.2)
        raise AssertionError(
            f"no job of {workload} with a hung rank {rank} after {seconds:g} s:\n{self.output()}"
        )

    def wait(self, seconds: float) -> int | None:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None


@pytest.fixture
def spawn_pytest(tmp_path: Path) -> Iterator[Callable[..., ControllerRun]]:
    """``spawn_pytest(source, *args)``: run ``python -m pytest`` on ``source`` in a subprocess."""
    runs: list[ControllerRun] = []

    def spawn(
        source: str,
        *args: str,
        name: str = "inner",
        env: dict[str, str] | None = None,
        shm: Path | None = None,
    ) -> ControllerRun:
        index = len(runs)
        workdir = tmp_path / f"{name}{index}"
        workdir.mkdir()
        (workdir / f"test_{name}.py").write_text(source)
        results = workdir / "results"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
        out = workdir / "pytest.out"
        # shm: a directory of the test's own mounted over /dev/shm for this pytest alone, so that
        # what it finds (and removes) there is the test's, never another run's on this machine.
        private = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', str(shm)]
        with open(out, "wb") as handle:
            proc = subprocess.Popen(
                [*(private if shm is not None else []), sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                 "-p", "no:xdist", "-s", f"--results-dir={results}", f"test_{name}.py", *args],
                cwd=workdir, env={**clean, **(env or {})}, stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        runs.append(ControllerRun(proc, results, out))
        return runs[-1]

    yield spawn
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        for job in run.job_dirs():
            _kill_all(job_pids(job.name))
