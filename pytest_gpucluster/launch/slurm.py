"""The Slurm backend: one ``srun`` step per job, and its cancellation through Slurm.

Two modes (``mode=``):

- ``agent`` (default, seed 004's recipe): one task per node, each a torchrun agent that starts
  the node's ranks; several nodes meet at a c10d rendezvous on the first host.
- ``tasks``: one task per rank; ranks come from ``SLURM_PROCID`` / ``SLURM_LOCALID`` (see
  `workloads._runtime.RankIdentity`), ``MASTER_PORT`` is the job's port and ``MASTER_ADDR`` the
  node where Slurm put task 0: block distribution puts it on the first node of the step *in
  Slurm's order*, and srun sorts ``--nodelist`` into that order whatever order the hosts came in
  (a hostfile, a pair whose suspect sorts after its partner). So each rank sets ``MASTER_ADDR``
  from the first node of its ``SLURM_STEP_NODELIST`` (``GPUCLUSTER_MASTER_ADDR_FROM``), and the
  first host given is only the fallback.

Inside an allocation (``SLURM_JOB_ID`` set, from salloc or sbatch) srun starts a step of it;
outside one it allocates a job for the step. Either way the step is named after the job id
(``--job-name``), so `cancel_by_name` finds it again: the cancel command runs
``python -m pytest_gpucluster.launch.slurm --cancel JOB_ID``, which looks the job or step up
in ``squeue`` and runs ``scancel`` on it (after ``scancel --signal=USR1`` in tasks mode, so a
hung rank on any node writes its stack into its log). ``--time`` is a backstop in case this
process dies before it can cancel anything.

``--kill-on-bad-exit=1``: one failed task ends the step. ``--immediate``: srun gives up when
resources are not there instead of pending forever (FEASIBILITY §2: ``srun -n3`` on a 2-CPU
node pended forever). ``--export=ALL``: the job's variables (the forwarded environment
included, `launch.forward_env`) reach every task even under ``sbatch --export=NONE``.

CPU and GPU jobs differ (``device=``):

- ``cpu``: ``--overcommit`` lets more tasks than CPUs run (CPU test nodes);
- ``cuda``: never ``--overcommit``; the GPUs are requested (`GPU_REQUESTS`): ``--gpus-per-node=N``
  (default), ``--gres=gpu:N``, or ``--gpus-per-task=N/tasks`` for sites that bind one GPU per
  task, as the profile's ``launch.slurm_gpu_request`` says, unless ``extra_args`` (the site's own
  ``--launcher-args``) already hold a GPU request, which then wins. A CUDA job with no GPU count to
  ask for is refused before anything runs: without a request, Slurm gives the step no GPU.
  In ``tasks`` mode the node's GPUs are requested per node, so every task of a node sees all of the
  step's GPUs (``CUDA_VISIBLE_DEVICES=0,1,...``) and each rank takes device ``SLURM_LOCALID``
  (`workloads._worker.device_index`): the ranks can reach each other's GPUs (CUDA IPC), which NCCL's
  NVLink path needs. No ``--gpu-bind=none``: on Slurm 22.05 it leaves ``CUDA_VISIBLE_DEVICES`` and
  ``SLURM_STEP_GPUS`` unset (measured, tests/integration/test_slurm.py), so a task would see every
  GPU of the node, other jobs' included. A per-task binding (``--gpus-per-task``,
  ``--tres-per-task``, a ``--gpu-bind`` other than ``none``, or the same inherited from sbatch as
  ``SLURM_GPUS_PER_TASK``/``SLURM_GPU_BIND``) shows each rank one GPU: CUDA IPC between the ranks
  is then off, NCCL moves intra-node traffic through host memory and the NVLink tests blame the
  node; with ``--gpu-bind=closest`` and a cyclic spread two ranks can even see the same GPU. It
  still runs as the site asks, with a warning (`per_task_binding`), and a job whose ranks share a
  GPU fails naming them (`launch.result.shared_gpus`).

``--cpus-per-task`` is sized to the node once its CPUs are known (``cpus_per_node``: the per-node
probe's count, or ``SLURM_CPUS_ON_NODE`` inside an allocation), divided among the node's tasks;
``--cpu-bind`` is passed when ``cpu_bind`` is set (``--slurm-cpu-bind``). Partitions and accounts
are cluster policy: pass them as ``extra_args`` (``--launcher-args="--partition=gpu"``).

Command building is pure; only `allocation_hosts`, `cancel_by_name` and ``available`` run tools.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

from pytest_gpucluster.cluster.ports import next_port
from pytest_gpucluster.cluster.slurm_gpus import SITE_GPU_FLAGS
from pytest_gpucluster.errors import GpuClusterWarning, LaunchError, SettingsError
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand, worker_argv_tail
from pytest_gpucluster.launch.torchrun import TorchrunLauncher
from pytest_gpucluster.workloads._runtime import JOB_ID_ENV, MASTER_FROM_ENV

__all__ = ["GPU_REQUESTS", "MODES", "SlurmLauncher", "allocation_hosts", "cancel_by_name", "split_args"]

MODES = ("agent", "tasks")
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus-per-task")
CANCEL_MODULE = "pytest_gpucluster.launch.slurm"

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def split_args(args: str | Sequence[str] | None, what: str = "--slurm-args") -> tuple[str, ...]:
    """``"--partition=gpu --time=10"`` or a list, as an argv tuple."""
    if args is None:
        return ()
    if isinstance(args, str):
        try:
            return tuple(shlex.split(args))
        except ValueError as exc:
            raise SettingsError(f"{what}={args!r} cannot be split into arguments: {exc}") from None
    return tuple(str(a) for a in args)


class SlurmLauncher:
    name = "slurm"
    reaches_hosts = True
    """srun reaches every node of the allocation itself: no remote-exec prefix is needed."""

    def __init__(
        self,
        mode: str = "agent",
        extra_args: str | Sequence[str] | None = None,
        *,
        srun: str = "srun",
        device: str = "cpu",
        gpus_per_node: int | None = None,
        gpu_request: str = "gpus-per-node",
        cpus_per_node: int | None = None,
        cpu_bind: str | None = None,
        overcommit: bool | None = None,
        port_picker: Callable[[], int] | None = None,
    ) -> None:
        if mode not in MODES:
            raise SettingsError(f"slurm launcher mode {mode!r} is not one of {', '.join(MODES)}")
        if gpu_request not in GPU_REQUESTS:
            raise SettingsError(
                f"Slurm GPU request {gpu_request!r} (launch.slurm_gpu_request) is not one of {', '.join(GPU_REQUESTS)}"
            )
        self.mode = mode
        self.extra_args = split_args(extra_args)
        self.srun = srun
        self.device = device
        self.gpus_per_node = gpus_per_node
        self.gpu_request = gpu_request
        self.cpus_per_node = cpus_per_node
        """Set once known (the per-node probe); None: no ``--cpus-per-task``."""
        self.cpu_bind = cpu_bind
        self.overcommit = device == "cpu" if overcommit is None else overcommit
        self.port_picker = port_picker or next_port
        self._site_gpus = any(a.split("=", 1)[0] in SITE_GPU_FLAGS for a in self.extra_args)
        if device == "cuda" and mode == "tasks" and (why := self.per_task_binding()):
            warnings.warn(GpuClusterWarning(why), stacklevel=2)
        if device == "cuda" and not self._site_gpus and not gpus_per_node:
            raise SettingsError(
                "a CUDA job under Slurm needs its GPUs requested, or Slurm gives its tasks none: the "
                "profile names no cluster.gpus_per_node and --launcher-args holds no GPU request "
                "(e.g. --launcher-args='--gpus-per-node=8' or '--gres=gpu:8')"
            )

    def per_task_binding(self, environ: Mapping[str, str] | None = None) -> str | None:
        """Why this launcher's tasks would each see only their own GPU, or None (see the module doc)."""
        env = os.environ if environ is None else environ
        inherited = [f"{k}={env[k]}" for k in ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK") if env.get(k)]
        if env.get("SLURM_GPU_BIND") and env["SLURM_GPU_BIND"].split(",")[-1] != "none":
            inherited.append(f"SLURM_GPU_BIND={env['SLURM_GPU_BIND']}")
        if self.gpu_request == "gpus-per-task" and not self._site_gpus:
            cause = "the profile's launch.slurm_gpu_request is gpus-per-task"
        elif inherited and not self._site_gpus:
            cause = f"the environment, from sbatch/salloc, holds {' '.join(inherited)}"
        else:
            flags = [
                a for a in self.extra_args
                if a.split("=", 1)[0] in ("--gpus-per-task", "--tres-per-task")
                or (a.startswith("--gpu-bind") and a.split("=", 1)[-1].split(",")[-1] != "none")
            ]  # fmt: skip
            if not flags:
                return None
            cause = f"--launcher-args holds {' '.join(flags)}"
        return (
            f"--slurm-mode tasks with per-task GPUs ({cause}): each rank sees only its own GPU, so CUDA IPC "
            "between the ranks of a node is off and NCCL moves intra-node traffic through host memory; the "
            "NVLink tests then blame the node. Request GPUs per node (--gpus-per-node, the default) with no "
            "per-task binding: every task then sees the node's GPUs and each rank takes device SLURM_LOCALID."
        )

    def available(self) -> str | None:
        if shutil.which(self.srun) is None:
            return f"{self.srun} not found on PATH; install slurm-wlm or run inside an allocation"
        return None

    # ------------------------------------------------------------------ commands

    def srun_options(self, job: JobSpec) -> list[str]:
        """Everything between ``srun`` and the program."""
        per_node = 1 if self.mode == "agent" else job.nproc_per_node
        # Give up within the rendezvous time rather than pend (and never past the job's timeout).
        immediate = max(int(min(job.rendezvous_timeout_s, job.timeout_s)), 1)
        # A Slurm-side limit in case nobody is left to cancel the step: timeout + a margin.
        minutes = math.ceil(job.timeout_s / 60) + 1
        options = [
            f"--job-name={job.job_id}",
            f"--nodes={job.nnodes}",
            f"--ntasks={job.nnodes * per_node}",
            f"--ntasks-per-node={per_node}",
            f"--nodelist={','.join(job.hosts)}",
            "--distribution=block",
            "--kill-on-bad-exit=1",
            f"--immediate={immediate}",
            f"--time={minutes}",
            "--export=ALL",
        ]
        if self.overcommit:
            options.append("--overcommit")
        options += self.resource_options(per_node)
        return [*options, *self.extra_args]

    def resource_options(self, tasks_per_node: int) -> list[str]:
        """The GPU request (CUDA jobs), ``--cpus-per-task`` and ``--cpu-bind``."""
        options = []
        if self.device == "cuda" and not self._site_gpus and self.gpus_per_node:
            gpus = self.gpus_per_node
            if self.gpu_request == "gres":
                options.append(f"--gres=gpu:{gpus}")
            elif self.gpu_request == "gpus-per-task":
                options.append(f"--gpus-per-task={max(gpus // tasks_per_node, 1)}")
            else:
                options.append(f"--gpus-per-node={gpus}")
        if self.cpus_per_node:
            options.append(f"--cpus-per-task={max(self.cpus_per_node // tasks_per_node, 1)}")
        if self.cpu_bind:
            options.append(f"--cpu-bind={self.cpu_bind}")
        return options

    def program(self, job: JobSpec) -> list[str]:
        """What each task runs."""
        if self.mode == "agent":
            return TorchrunLauncher().agent_argv(job)
        return [job.python, *worker_argv_tail(job)]

    def task_env(self, job: JobSpec) -> dict[str, str]:
        env = dict(job.env)
        if self.mode == "tasks":
            port = job.rendezvous_port or self.port_picker()
            # Where Slurm puts task 0, not the first host given: srun sorts --nodelist into its own
            # order, so each rank reads the step's first node (workloads._runtime, MASTER_FROM_ENV).
            # hosts[0] stays as the fallback for a rank that sees no SLURM_STEP_NODELIST.
            env["MASTER_ADDR"] = job.hosts[0]
            env[MASTER_FROM_ENV] = "SLURM_STEP_NODELIST"
            env["MASTER_PORT"] = str(port)
        return env

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        argv = [self.srun, *self.srun_options(job), *self.program(job)]
        return [LaunchCommand(host=job.hosts[0], argv=tuple(argv), env=self.task_env(job))]

    def cancel_commands(self, job: JobSpec) -> list[LaunchCommand]:
        """Run when the job is stopped (timeout, failure): cancel its step through Slurm.

        The command must not carry the job id variable, or the local kill would take it too.
        """
        argv = [job.python, "-m", CANCEL_MODULE, "--cancel", job.job_id]
        if self.mode == "tasks":
            argv.append("--dump-stacks")
        env = {k: v for k, v in job.env.items() if k != JOB_ID_ENV}
        return [LaunchCommand(host=job.hosts[0], argv=tuple(argv), env=env)]


# --------------------------------------------------------------------------- allocation


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def allocation_hosts(
    environ: Mapping[str, str] | None = None, *, scontrol: str | None = "scontrol", run: Runner = _run
) -> tuple[str, ...]:
    """The allocation's nodes, in Slurm's order: ``scontrol show hostnames`` when it is on PATH
    (it knows every syntax Slurm writes), else this package's own nodelist expansion."""
    from pytest_gpucluster.cluster.nodelist import allocation_nodelist, expand_nodelist

    nodelist = allocation_nodelist(environ)
    if scontrol and shutil.which(scontrol):
        try:
            done = run([scontrol, "show", "hostnames", nodelist])
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            hosts = tuple(line.strip() for line in done.stdout.splitlines() if line.strip())
            if hosts:
                return hosts
    return tuple(expand_nodelist(nodelist))


# --------------------------------------------------------------------------- cancelling


def _checked(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise LaunchError(
            f"{' '.join(map(str, done.args))} exited with code {done.returncode}: "
            f"{said[-1] if said else 'no output'} (is SLURM_CONF pointing at a running slurmctld?)"
        )
    return done


def find_ids(name: str, *, squeue: str = "squeue", run: Runner = _run) -> list[str]:
    """Ids to scancel for jobs and steps named ``name``: a job id when srun allocated the job
    itself, ``JOBID.STEPID`` for a step inside someone's allocation."""
    jobs_out = _checked(run([squeue, "--noheader", f"--name={name}", "--format=%A"]))
    jobs = [line.strip() for line in jobs_out.stdout.splitlines() if line.strip()]
    # `squeue --steps --name` filters by the job's name, not the step's: filter here.
    steps_out = _checked(run([squeue, "--noheader", "--steps", "--format=%i %j"]))
    ids = list(jobs)
    for line in steps_out.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip() == name and parts[0].split(".")[0] not in jobs:
            ids.append(parts[0])
    return ids


def cancel_by_name(
    name: str,
    *,
    dump_stacks: bool = False,
    grace_s: float = 0.5,
    wait_s: float = 10.0,
    run: Runner = _run,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """``scancel`` the jobs and steps named ``name``; wait until squeue no longer lists them.

    ``dump_stacks``: first ``scancel --signal=USR1``, which the ranks turn into a stack dump in
    their logs (only for tasks that are ranks: a torchrun agent would die of SIGUSR1).
    Returns the ids cancelled.
    """
    ids = find_ids(name, run=run)
    if not ids:
        return []
    if dump_stacks:
        run(["scancel", "--signal=USR1", *ids])
        sleep(grace_s)
    run(["scancel", *ids])
    end = time.monotonic() + wait_s
    while time.monotonic() < end and find_ids(name, run=run):
        sleep(0.2)
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dump = "--dump-stacks" in args
    args = [a for a in args if a != "--dump-stacks"]
    if len(args) != 2 or args[0] != "--cancel":
        print(f"usage: python -m {CANCEL_MODULE} --cancel JOB_NAME [--dump-stacks]", file=sys.stderr)
        return 2
    try:
        cancelled = cancel_by_name(args[1], dump_stacks=dump)
    except (OSError, subprocess.TimeoutExpired, LaunchError) as exc:
        print(f"could not cancel Slurm job/step {args[1]}: {exc}", file=sys.stderr)
        return 1
    print(f"cancelled {' '.join(cancelled) or 'nothing (already gone)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
