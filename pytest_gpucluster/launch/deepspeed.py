"""The DeepSpeed launcher backend: ``deepspeed --hostfile ... --num_nodes/--num_gpus`` (seed 000).

``python -m deepspeed.launcher.runner --hostfile <job_dir>/hostfile.deepspeed --no_ssh_check
--master_addr A --master_port P --num_nodes N --num_gpus G --no_local_rank
--module pytest_gpucluster.workloads._worker JOB_DIR``

- The runner module is what the ``deepspeed`` script runs; calling it through the job's Python
  makes the ranks use the same interpreter as the plugin.
- A hostfile is always given (written by `prepare`), so a stray ``/job/hostfile`` (DeepSpeed's
  default) cannot change the job, and ``--num_gpus``/``--num_accelerators`` means ranks per
  node also on CPU (FEASIBILITY §4). ``include="node1:0,1@node2:0,1"`` selects devices the
  way seed 000's ``--include localhost:4,5,6,7`` does, instead of ``--num_nodes/--num_gpus``.
- ``--master_addr`` always: without it the runner asks the first host ``hostname -I`` over
  ssh. ``--master_port`` always: DeepSpeed's default 29500 collides under pytest-xdist.
  ``--no_ssh_check``: a one-node hostfile would otherwise need ssh to localhost.
- ``--no_local_rank``: ranks read LOCAL_RANK from the environment (the worker would also
  ignore a ``--local_rank=N`` argument).
- Several nodes: the runner reaches them through ``multinode_launcher`` (pdsh by default, or
  the site's ``--launcher=...`` in ``extra_args``), which forwards only some variables; the job's
  variables (the forwarded environment included, `launch.forward_env`) go into a ``DS_ENV_FILE``
  that `prepare` writes (mode 0600: it may hold a token), so every rank gets them (the job id
  included, which the reaper needs). DeepSpeed's MPI-based runners (``openmpi``, ``mpich``,
  ``impi``, ``mvapich``) refuse ``--num_nodes``/``--num_gpus``: the hostfile alone says it then.

Command building is pure; `prepare` writes the files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_gpucluster.cluster.hostfile import to_deepspeed
from pytest_gpucluster.cluster.ports import next_port
from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand, worker_argv_tail
from pytest_gpucluster.launch.mpi import job_hostfile, master_addr
from pytest_gpucluster.launch.slurm import split_args

__all__ = ["ENV_FILE_NAME", "HOSTFILE_NAME", "DeepSpeedLauncher"]

HOSTFILE_NAME = "hostfile.deepspeed"
ENV_FILE_NAME = "deepspeed.env"
MULTINODE_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "mpich", "impi", "slurm")
_MPI_RUNNERS = ("openmpi", "mvapich", "mpich", "impi")


class DeepSpeedLauncher:
    name = "deepspeed"
    reaches_hosts = True
    """The runner reaches other nodes through its own multi-node launcher (pdsh, ...)."""

    def __init__(
        self,
        extra_args: str | Sequence[str] | None = None,
        *,
        include: str | None = None,
        multinode_launcher: str = "pdsh",
        port_picker: Callable[[], int] | None = None,
    ) -> None:
        if multinode_launcher not in MULTINODE_LAUNCHERS:
            raise SettingsError(
                f"DeepSpeed multi-node launcher {multinode_launcher!r} is not one of "
                f"{', '.join(MULTINODE_LAUNCHERS)}"
            )
        if include is not None and not include.strip():
            raise SettingsError("DeepSpeed --include is empty; give e.g. 'localhost:0,1' or leave it out")
        self.extra_args = split_args(extra_args, "--deepspeed-args")
        self.include = include
        chosen = _site_launcher(self.extra_args)
        if chosen is not None and chosen not in MULTINODE_LAUNCHERS:
            raise SettingsError(
                f"DeepSpeed multi-node launcher {chosen!r} (in --launcher-args) is not one of "
                f"{', '.join(MULTINODE_LAUNCHERS)}"
            )
        self.multinode_launcher = chosen or multinode_launcher
        self._site_chose = chosen is not None
        self.port_picker = port_picker or next_port

    def available(self) -> str | None:
        if importlib.util.find_spec("deepspeed") is None:
            return "deepspeed is not installed in this Python (pip install deepspeed)"
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed in this Python, so DeepSpeed cannot start ranks"
        return None

    @staticmethod
    def hostfile_path(job: JobSpec) -> Path:
        return job.job_dir / HOSTFILE_NAME

    @staticmethod
    def env_file_path(job: JobSpec) -> Path:
        return job.job_dir / ENV_FILE_NAME

    def env_file_text(self, job: JobSpec) -> str:
        """``K=V`` lines for DeepSpeed's env file (its format has no quoting: one line per value)."""
        lines = []
        for key, value in job.env.items():
            if "\n" in value or "\r" in value:
                raise SettingsError(
                    f"job {job.job_id}: variable {key} holds a line break, which DeepSpeed's "
                    "environment file cannot carry to other nodes"
                )
            lines.append(f"{key}={value}\n")
        return "".join(lines)

    def prepare(self, job: JobSpec) -> None:
        """Write the hostfile (and for several nodes the environment file) into the job directory."""
        self.hostfile_path(job).write_text(
            to_deepspeed(job_hostfile(job), job.nproc_per_node), encoding="utf-8"
        )
        if job.nnodes > 1:
            path = self.env_file_path(job)
            path.touch(mode=0o600)
            path.write_text(self.env_file_text(job), encoding="utf-8")

    def runner_options(self, job: JobSpec, port: int) -> list[str]:
        options = [
            "--hostfile", str(self.hostfile_path(job)),
            "--no_ssh_check",
            f"--master_addr={master_addr(job)}",
            f"--master_port={port}",
        ]  # fmt: skip
        mpi_runner = job.nnodes > 1 and self.multinode_launcher in _MPI_RUNNERS
        if self.include is not None:
            options.append(f"--include={self.include}")
        elif not mpi_runner:
            options += [f"--num_nodes={job.nnodes}", f"--num_gpus={job.nproc_per_node}"]
        if job.nnodes > 1 and not self._site_chose:
            options.append(f"--launcher={self.multinode_launcher}")
        options.append("--no_local_rank")
        return [*options, *self.extra_args]

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        port = job.rendezvous_port or self.port_picker()
        program = worker_argv_tail(job)  # ["-m", module, job_dir]
        argv = [
            job.python, "-m", "deepspeed.launcher.runner", *self.runner_options(job, port),
            "--module", *program[1:],
        ]  # fmt: skip
        env = dict(job.env)
        if job.nnodes > 1:
            env["DS_ENV_FILE"] = str(self.env_file_path(job))
        host = job.hosts[0]
        if job.nnodes == 1 and job.needs_remote(host):
            # One node elsewhere: the runner launches on the machine it runs on, so it runs there,
            # through the remote-exec prefix (a one-node probe of a remote node, say).
            assert job.remote is not None
            full = job.remote.wrap(host, argv, env, user=job.users.get(host))
            return [LaunchCommand(host=host, argv=tuple(full), env=env, remote=True, node_argv=tuple(argv))]
        return [LaunchCommand(host=host, argv=tuple(argv), env=env)]


def _site_launcher(args: Sequence[str]) -> str | None:
    """The multi-node launcher named in the site's runner arguments (``--launcher=openmpi``)."""
    for index, arg in enumerate(args):
        if arg.startswith("--launcher="):
            return arg.split("=", 1)[1]
        if arg == "--launcher" and index + 1 < len(args):
            return args[index + 1]
    return None
