"""Options that say how ranks are started and watched: launcher, its arguments, remote
execution, forwarded environment, rendezvous and job deadlines; and the Slurm-allocation rule
that picks the default launcher.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.options.spec import Option, positive_seconds
from pytest_gpucluster.profiles.estimates import DEFAULT_JOB_TIMEOUT_S

LAUNCHERS = ("torchrun", "slurm", "mpirun", "deepspeed")


def _launcher(text: str) -> str:
    if text not in LAUNCHERS:
        raise ValueError(f"expected one of {', '.join(LAUNCHERS)}, got {text!r}")
    return text


def _slurm_mode(text: str) -> str:
    if text not in ("agent", "tasks"):
        raise ValueError(f"expected 'agent' or 'tasks', got {text!r}")
    return text


def _argv_template(text: str) -> tuple[str, ...]:
    """``"ssh -o BatchMode=yes {host}"`` -> argv; the user's own template, split once here."""
    argv = tuple(shlex.split(text))
    if not argv or not any("{host}" in part for part in argv):
        raise ValueError(
            f"expected a command template containing {{host}}, such as 'ssh {{host}}', got {text!r}"
        )
    return argv


def _env_pattern(text: str) -> str:
    from pytest_gpucluster.launch.forward_env import check_pattern

    try:
        return check_pattern(text, "--forward-env")
    except SettingsError as exc:
        raise ValueError(str(exc).removeprefix("--forward-env: ")) from None


LAUNCHER = Option(
    "--launcher",
    "launcher",
    f"how ranks are started: {', '.join(LAUNCHERS)} (default: slurm inside a Slurm allocation "
    "without --hostfile, else torchrun)",
    "torchrun",
    _launcher,
    "NAME",
)
LAUNCHER_ARGS = Option(
    "--launcher-args",
    "launcher_args",
    "extra arguments for the launcher itself, e.g. '--partition=gpu --gpus-per-node=8' for slurm "
    "(not for torchrun)",
    None,
    shlex.split,
    "ARGS",
)
SLURM_MODE = Option(
    "--slurm-mode",
    "slurm_mode",
    "with --launcher slurm: 'agent' (one torchrun agent per node) or 'tasks' (one task per rank, "
    "ranks from SLURM_PROCID)",
    "agent",
    _slurm_mode,
    "MODE",
)
REMOTE_EXEC = Option(
    "--remote-exec",
    "remote_exec",
    "command template that runs a command on another node, e.g. 'ssh {host}' or 'ip netns exec {host}'",
    ("ssh", "{host}"),
    _argv_template,
    "TEMPLATE",
)
FORWARD_ENV = Option(
    "--forward-env",
    "forward_env",
    "forward this environment variable (or shell pattern, e.g. 'MY_SITE_*') from this process to "
    "every rank, besides PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, CUDA_*, NCCL_*, FI_*, OFI_*, "
    "UCX_*, TORCH_*, HF_* and OMP_NUM_THREADS (repeatable)",
    (),
    _env_pattern,
    "PATTERN",
    multiple=True,
)
RENDEZVOUS_TIMEOUT = Option(
    "--rendezvous-timeout",
    "rendezvous_timeout",
    "seconds the ranks of a one-node job get to start and meet; each further node adds 2 s "
    "(raise it where containers or a cold shared filesystem make start-up slow)",
    120.0,
    positive_seconds,
    "SECONDS",
)
SLURM_CPU_BIND = Option(
    "--slurm-cpu-bind",
    "slurm_cpu_bind",
    "with --launcher slurm: srun's --cpu-bind value for every step, e.g. 'cores' or 'none' (default: "
    "the site's)",
    None,
    str,
    "BIND",
)
JOB_TIMEOUT = Option(
    "--job-timeout",
    "job_timeout",
    "seconds before a launched job is declared hung and killed; SFT cases, sweeps, burn-in and fabric "
    "jobs otherwise get a deadline derived from their work plus the rendezvous allowance (an SFT "
    "case's own 'timeout:' wins over both)",
    DEFAULT_JOB_TIMEOUT_S,  # profiles check holds each sft case's estimated run time against it
    positive_seconds,
    "SECONDS",
)


def in_allocation(env: Mapping[str, str]) -> str | None:
    """Why the launcher defaults to slurm: pytest runs inside a Slurm allocation (``salloc``, an
    ``sbatch`` script; not inside one of its steps, where a rank-side pytest runs), so the nodes to
    test are the allocation's, not this machine. None outside one."""
    if (
        not env.get("SLURM_JOB_NODELIST")
        or env.get("SLURM_STEP_ID")
        or env.get("GPUCLUSTER_RANK_SIDE") == "1"
    ):
        return None
    return f"inside Slurm allocation {env.get('SLURM_JOB_ID', '?')} (SLURM_JOB_NODELIST set, no --hostfile)"
