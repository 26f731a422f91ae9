"""The Open MPI backend: one ``mpirun`` for the whole job, and the nccl-tests command line.

``mpirun --hostfile <job_dir>/hostfile.openmpi -np W --map-by ppr:P:node --bind-to none
-x K=V ... python -m pytest_gpucluster.workloads._worker JOB_DIR``

- The hostfile is written into the job directory by `prepare` (`cluster.hostfile.to_openmpi`,
  ``slots=P`` per host), so mpirun never counts more ranks than slots and needs no
  ``--oversubscribe`` even with more ranks than cores (set ``oversubscribe=True`` to add it).
- Ranks read ``OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK`` (`workloads._runtime.RankIdentity`);
  the worker is no MPI program, it only uses mpirun to be started. The process group meets
  at ``MASTER_ADDR`` = the first host (127.0.0.1 on a single local host) and ``MASTER_PORT``.
- ``-x K=V`` for every variable of the job: mpirun only forwards what it is told to nodes it
  reaches through ssh.
- ``--bind-to none``: Open MPI binds each rank to one core by default, which would starve the
  threads of a CPU (gloo) rank and is a placement decision the cluster's own scripts make.
- As root mpirun refuses to start without ``--allow-run-as-root`` (FEASIBILITY §3); it is
  added when this process is root.

`nccl_tests_argv` builds seed 002's ``mpirun -np 16 -H node001,node002 --map-by ppr:8:node
all_reduce_perf -b 256 -e 32G -f 2 -g 1``.

Command building is pure; `prepare` writes the hostfile, ``available`` runs ``mpirun --version``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_gpucluster.cluster.hostfile import HostEntry, Hostfile, to_openmpi
from pytest_gpucluster.cluster.ports import next_port
from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand, is_local_host, worker_argv_tail
from pytest_gpucluster.launch.slurm import split_args

__all__ = ["HOSTFILE_NAME", "MpirunLauncher", "job_hostfile", "master_addr", "nccl_tests_argv"]

HOSTFILE_NAME = "hostfile.openmpi"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def job_hostfile(job: JobSpec) -> Hostfile:
    """The job's hosts, ``slots`` = ranks per node, with their ``user@`` where one was given."""
    entries = tuple(
        HostEntry(host=h, slots=job.nproc_per_node, max_slots=None, user=job.users.get(h), line=i)
        for i, h in enumerate(job.hosts, start=1)
    )
    return Hostfile(entries=entries, source=f"job {job.job_id}")


def master_addr(job: JobSpec) -> str:
    """Where rank 0's store listens: the first host, or 127.0.0.1 when every host is this one."""
    if all(is_local_host(h) for h in job.hosts):
        return "127.0.0.1"
    return job.hosts[0]


@functools.lru_cache(maxsize=8)
def _mpirun_flavour(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (done.stdout + done.stderr).strip()


class MpirunLauncher:
    name = "mpirun"
    reaches_hosts = True
    """mpirun reaches the hosts itself (ssh through its plm), so no remote-exec prefix is needed."""

    def __init__(
        self,
        extra_args: str | Sequence[str] | None = None,
        *,
        mpirun: str = "mpirun",
        allow_run_as_root: bool | None = None,
        oversubscribe: bool = False,
        port_picker: Callable[[], int] | None = None,
    ) -> None:
        self.extra_args = split_args(extra_args, "--mpirun-args")
        self.mpirun = mpirun
        self.allow_run_as_root = _is_root() if allow_run_as_root is None else allow_run_as_root
        self.oversubscribe = oversubscribe
        self.port_picker = port_picker or next_port

    def available(self) -> str | None:
        path = shutil.which(self.mpirun)
        if path is None:
            return f"{self.mpirun} not found on PATH; install openmpi-bin (Open MPI)"
        version = _mpirun_flavour(path)
        if "Open MPI" not in version and "OpenRTE" not in version:
            first = version.splitlines()[0] if version else "no output"
            return f"{path} is not Open MPI's mpirun ('{path} --version' said: {first}); install openmpi-bin"
        return None

    @staticmethod
    def hostfile_path(job: JobSpec) -> Path:
        return job.job_dir / HOSTFILE_NAME

    def prepare(self, job: JobSpec) -> None:
        """Write the job's Open MPI hostfile (called once the job directory exists)."""
        self.hostfile_path(job).write_text(
            to_openmpi(job_hostfile(job), job.nproc_per_node), encoding="utf-8"
        )

    def rank_env(self, job: JobSpec) -> dict[str, str]:
        port = job.rendezvous_port or self.port_picker()
        return {**job.env, "MASTER_ADDR": master_addr(job), "MASTER_PORT": str(port)}

    def mpirun_options(self, job: JobSpec, env: Mapping[str, str]) -> list[str]:
        options = [
            "--hostfile", str(self.hostfile_path(job)),
            "-np", str(job.world_size),
            "--map-by", f"ppr:{job.nproc_per_node}:node",
            "--bind-to", "none",
        ]  # fmt: skip
        if self.oversubscribe:
            options.append("--oversubscribe")
        if self.allow_run_as_root:
            options.append("--allow-run-as-root")
        options += export_args(env)
        return [*options, *self.extra_args]

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        env = self.rank_env(job)
        argv = [self.mpirun, *self.mpirun_options(job, env), job.python, *worker_argv_tail(job)]
        return [LaunchCommand(host=job.hosts[0], argv=tuple(argv), env=env)]


def export_args(env: Mapping[str, str]) -> list[str]:
    """``-x K=V`` per variable; Open MPI takes the value after the first ``=`` as is."""
    out: list[str] = []
    for key, value in env.items():
        if not key or "=" in key:
            raise SettingsError(f"environment variable name {key!r} cannot be exported with mpirun -x")
        out += ["-x", f"{key}={value}"]
    return out


def nccl_tests_argv(
    binary: str | Path,
    hosts: Sequence[str],
    gpus_per_node: int,
    *,
    min_bytes: str | int = "8",
    max_bytes: str | int = "128M",
    step_factor: int = 2,
    iters: int | None = None,
    warmup_iters: int | None = None,
    check: bool = False,
    env: Mapping[str, str] | None = None,
    mpirun: str = "mpirun",
    allow_run_as_root: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``mpirun -np N*G -H h1:G,h2:G --map-by ppr:G:node -x ... <binary> -b MIN -e MAX -f F -g 1 ... -c C``:
    one process per GPU (``-g 1``), as nccl-tests' README runs it with MPI; ``-c 1`` or ``-c 0``
    always, never the binary's default."""
    if not hosts:
        raise SettingsError("nccl-tests needs at least one host to run on")
    if gpus_per_node < 1:
        raise SettingsError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    if step_factor < 2:
        raise SettingsError(f"nccl-tests -f (step factor) must be at least 2, got {step_factor}")
    argv = [
        mpirun,
        "-np", str(len(hosts) * gpus_per_node),
        "-H", ",".join(f"{h}:{gpus_per_node}" for h in hosts),
        "--map-by", f"ppr:{gpus_per_node}:node",
        "--bind-to", "none",
    ]  # fmt: skip
    if allow_run_as_root:
        argv.append("--allow-run-as-root")
    argv += export_args(env or {})
    argv += [*extra_args, str(binary)]
    argv += ["-b", str(min_bytes), "-e", str(max_bytes), "-f", str(step_factor), "-g", "1"]
    if iters is not None:
        argv += ["-n", str(iters)]
    if warmup_iters is not None:
        argv += ["-w", str(warmup_iters)]
    return [*argv, "-c", "1" if check else "0"]  # explicit: builds differ in their default
