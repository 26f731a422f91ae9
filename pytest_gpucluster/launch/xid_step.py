"""The session's NVML XID listener held as the controller's own ``srun --overlap`` step.

A listener detached inside a job does not outlive that job's step under Slurm's
``proctrack/cgroup``: slurmstepd kills everything left in the step's cgroup when the step ends, so
XIDs during the later jobs (NCCL, SFT) would go unseen. Inside an allocation (``SLURM_JOB_ID``
set) the controller instead starts one step of the allocation that *is* the listener, one task per
node (``workloads/xid_watch.py --held``)::

    srun --overlap --job-name=xid-watch-<name> --nodes=N --ntasks=N --ntasks-per-node=1
         --nodelist=HOSTS --kill-on-bad-exit=0 --export=ALL [--gres=gpu:G] -- python -m
         pytest_gpucluster.workloads.xid_watch DIR --max-s S --held

``--overlap`` lets it share the nodes (and their GPUs) with every job step the session launches
next; the GPU request (the nodes' GPUs, `cluster.slurm_gpus.probe_gpu_request`) makes Slurm give it
the GPUs, which NVML needs under ``ConstrainDevices``. `XidListenerStep.start` returns once every
node printed its ready line (or why it cannot listen). The last counters reading collects and stops
each node's listener (the step then ends by itself); `XidListenerStep.stop`, at the session's end,
cancels the step through Slurm if it is still there (`launch.slurm.cancel_by_name`), then kills
srun: nothing outlives the session.

Outside an allocation each srun allocates a job of its own and there is no allocation to hold a
step in: the first reading's job starts the listener as before (`workloads.xid_watch.start`).
Command building is pure; `start` and `stop` run srun and scancel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_gpucluster.workloads._runtime import JOB_ID_ENV, SESSION_ENV
from pytest_gpucluster.workloads.xid_watch import READY_LINE

__all__ = ["XidListenerStep", "in_allocation"]

_ERROR_LINE = "xid-watch error on"


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a Slurm allocation (salloc, sbatch), where steps can be held."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID"))


class XidListenerStep:
    """One ``srun --overlap`` step of the allocation, listening for XIDs on every node."""

    def __init__(
        self,
        hosts: Sequence[str],
        state_dir: str,
        max_s: float,
        log_path: Path,
        *,
        name: str,
        gpu_args: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        session_tag: str = "",
        python: str = sys.executable,
        srun: str = "srun",
        cancel: Callable[[str], list[str]] | None = None,
    ) -> None:
        self.hosts = tuple(hosts)
        self.state_dir = state_dir
        self.max_s = max_s
        self.log_path = Path(log_path)
        self.name = name
        self.gpu_args = tuple(gpu_args)
        self.extra_args = tuple(extra_args)
        self.session_tag = session_tag
        self.python = python
        self.srun = srun
        self._cancel = cancel
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled: list[str] = []

    def argv(self) -> list[str]:
        n = len(self.hosts)
        return [
            self.srun, "--overlap", f"--job-name={self.name}", f"--nodes={n}", f"--ntasks={n}",
            "--ntasks-per-node=1", f"--nodelist={','.join(self.hosts)}", "--kill-on-bad-exit=0",
            "--export=ALL", *self.gpu_args, *self.extra_args,
            self.python, "-m", "pytest_gpucluster.workloads.xid_watch", self.state_dir,
            "--max-s", f"{self.max_s:g}", "--held",
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        """The controller's environment, with a job id of the listener's own (a later session's
        ``--gpucluster-reap`` finds it by id and session once this one is gone)."""
        env = {**os.environ, JOB_ID_ENV: self.name}
        if self.session_tag:
            env[SESSION_ENV] = self.session_tag
        return env

    def lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def start(self, ready_s: float = 60.0) -> tuple[bool, str]:
        """Start the step; ``(True, "")`` once every node listens, else ``(False, why)`` (the step
        is then stopped)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        end = time.monotonic() + ready_s
        while time.monotonic() < end:
            lines = self.lines()
            ready = sum(READY_LINE in line for line in lines)
            errors = [line for line in lines if _ERROR_LINE in line]
            if ready >= len(self.hosts):
                return True, ""
            if errors or self.proc.poll() is not None:
                self.stop()
                said = "; ".join(errors) or (
                    lines[-1] if lines else f"srun exited with {self.proc.returncode}"
                )
                return False, f"the NVML XID listener step could not start ({self.log_path}): {said}"
            time.sleep(0.1)
        self.stop()
        return False, (
            f"the NVML XID listener step was not listening on all {len(self.hosts)} node(s) within "
            f"{ready_s:g} s ({self.log_path})"
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, wait_s: float = 15.0) -> None:
        """Cancel the step through Slurm if it is still there, then make sure srun is gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            cancel = self._cancel
            if cancel is None:
                from pytest_gpucluster.launch.slurm import cancel_by_name

                cancel = cancel_by_name
            with contextlib.suppress(Exception):  # scancel failing must not keep srun alive
                self.cancelled = cancel(self.name)
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def hold_listener(
    cluster: object, state_dir: str, max_s: float, nodes: int, log_path: Path
) -> tuple[XidListenerStep | None, str]:
    """The listener step for a session whose cluster launches through Slurm inside an allocation,
    started and listening: ``(step, "")``; ``(None, "")`` where no step can be held (another
    launcher, no allocation: the first reading's job starts the listener); ``(None, why)`` when
    the step did not come up."""
    from pytest_gpucluster.cluster.slurm_gpus import SITE_GPU_FLAGS

    launcher = getattr(cluster, "launcher", None)
    if getattr(launcher, "name", "") != "slurm" or not in_allocation():
        return None, ""
    hosts = list(cluster.spec.host_names)[:nodes]  # type: ignore[attr-defined]
    wanted = [*launcher.extra_args, *launcher.resource_options(1)]  # type: ignore[union-attr]
    gpu_args = [a for a in wanted if a.split("=", 1)[0] in SITE_GPU_FLAGS]
    others = [a for a in launcher.extra_args if a not in gpu_args]  # type: ignore[union-attr]
    step = XidListenerStep(
        hosts, state_dir, max_s, log_path, name=f"xid-watch-{Path(state_dir).name}", gpu_args=gpu_args,
        extra_args=others, session_tag=getattr(cluster, "session_tag", ""),
        python=getattr(cluster, "python", sys.executable), srun=launcher.srun,  # type: ignore[union-attr]
    )  # fmt: skip
    ok, why = step.start()
    return (step, "") if ok else (None, why)
