"""Run an nccl-tests binary (``all_reduce_perf``...) on the session's nodes and parse its table.

Used by ``acceptance/test_collectives.py`` when ``--nccl-tests-dir`` or the profile's
``collectives.nccl_tests_dir`` names a directory of built binaries. How a binary is started follows
the session's launcher (`how_to_start`), argv lists only:

- ``--launcher slurm``: ``srun`` with one task per GPU (``-g 1``) on the job's nodes, the GPUs
  requested as for the session's CUDA jobs (`launch.slurm.SlurmLauncher.resource_options`: its
  ``--gpus-per-node``/``--gres``/``--gpus-per-task`` choice, ``--cpus-per-task``, ``--cpu-bind``,
  the site's ``--launcher-args`` such as ``--mpi=pmix``), ``--export=ALL`` with the forwarded
  environment in srun's own; the binaries must be built with ``MPI=1``;
- ``--launcher mpirun``: mpirun as below, even on one node of this machine;
- otherwise, one node that is this machine: the binary itself with ``-g <GPUs per node>`` (one
  process driving every GPU, nccl-tests' single-node mode; no MPI build needed);
- otherwise: Open MPI's ``mpirun`` with one process per GPU (``-g 1``), the command line of
  nccl-tests' README and of seed 002 (`launch.mpi.nccl_tests_argv`), ``-x K=V`` for every variable
  of the forwarding allow-list (`launch.forward_env`: the defaults, ``--forward-env``, the
  profile's ``launch.forward_env``) and the NCCL environment; the binaries must be built with
  ``MPI=1``. torchrun and the DeepSpeed runner cannot start an MPI program, so with those launchers
  several nodes are reached through mpirun too (the mpirun launcher's own options when it is the
  session's).

``-c 1`` or ``-c 0`` is always passed: nccl-tests versions differ in their default. The output goes
to a log file in the results directory, is parsed with `parsers.nccl_tests.parse`, and its rank
count is checked against nodes x GPUs per node (`launch.nccl_tests_ranks`: a non-MPI build says
so, never a low bandwidth). No torch, no pytest.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import LaunchError, ParseError, SettingsError
from pytest_gpucluster.launch.base import LaunchCommand, is_local_host
from pytest_gpucluster.launch.forward_env import forwarded_env
from pytest_gpucluster.launch.mpi import nccl_tests_argv
from pytest_gpucluster.launch.nccl_tests_ranks import check_ranks, separate_processes
from pytest_gpucluster.maths.sweep import NCCL_TYPE_NAMES
from pytest_gpucluster.parsers.nccl_tests import Run, parse

__all__ = ["STARTERS", "NcclTestsCommand", "binary_path", "build_command", "how_to_start", "run_command"]

STARTERS = ("direct", "mpirun", "srun")
KILL_GRACE_S = 10.0
"""Between SIGTERM and SIGKILL at the timeout: srun cancels its step on SIGTERM, not on SIGKILL."""


def binary_path(directory: str | Path, collective: str) -> Path:
    """``<dir>/<collective>_perf`` (or ``<dir>/build/...``); SettingsError says what the dir holds."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise SettingsError(f"nccl-tests directory {root} does not exist or is not a directory")
    for candidate in (root / f"{collective}_perf", root / "build" / f"{collective}_perf"):
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                raise SettingsError(f"nccl-tests binary {candidate} is not executable (chmod +x)")
            return candidate
    found = sorted(p.name for p in root.glob("*_perf")) or ["no *_perf files"]
    raise SettingsError(
        f"no {collective}_perf in nccl-tests directory {root} (nor in its build/); it holds: {', '.join(found)}"
    )


@dataclass(frozen=True, slots=True)
class NcclTestsCommand:
    argv: tuple[str, ...]
    env: dict[str, str]
    """Variables added to this process's environment (the direct run, and srun's ``--export=ALL``;
    mpirun carries them as ``-x``)."""
    starter: str = "direct"
    """How it starts: one of `STARTERS`."""
    nodes: int = 1
    gpus_per_node: int = 1
    hosts: tuple[str, ...] = field(default=())

    def shell_line(self) -> str:
        """The command as one line for people, secret-looking values (``-x HF_TOKEN=...``) redacted."""
        return LaunchCommand(host="", argv=self.argv).shell_line()


def how_to_start(hosts: Sequence[str], launcher: Any = None) -> str:
    """``srun`` under the slurm launcher, ``mpirun`` under the mpirun launcher; otherwise ``direct``
    for one node that is this machine, else ``mpirun``."""
    name = getattr(launcher, "name", None)
    if name == "slurm":
        return "srun"
    if name != "mpirun" and len(hosts) == 1 and is_local_host(hosts[0]):
        return "direct"
    return "mpirun"


def build_command(
    binary: str | Path,
    hosts: Sequence[str],
    gpus_per_node: int,
    *,
    min_bytes: int,
    max_bytes: int,
    factor: int,
    warmup: int,
    iters: int,
    dtype: str,
    op: str,
    check: bool,
    env: Mapping[str, str],
    launcher: Any = None,
    forward_patterns: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    time_limit_s: float = 600.0,
    allow_run_as_root: bool | None = None,
) -> NcclTestsCommand:
    """The command for one sweep on ``hosts``, started as `how_to_start` says for ``launcher`` (the
    session's launcher object, or None). The job carries ``env`` (NCCL and scope variables) over the
    variables of ``environ`` (default: this process's) that ``forward_patterns`` select."""
    if gpus_per_node < 1:
        raise SettingsError(f"nccl-tests needs at least one GPU per node, the profile has {gpus_per_node}")
    if not hosts:
        raise SettingsError("nccl-tests needs at least one host to run on")
    carried = {**forwarded_env(forward_patterns, environ), **env} if forward_patterns else dict(env)
    starter = how_to_start(hosts, launcher)
    shape = {"starter": starter, "nodes": len(hosts), "gpus_per_node": gpus_per_node, "hosts": tuple(hosts)}
    tail = ["-d", NCCL_TYPE_NAMES.get(dtype, dtype), "-o", op]
    if starter == "mpirun":
        mpi = launcher if getattr(launcher, "name", None) == "mpirun" else None
        root = allow_run_as_root if allow_run_as_root is not None else getattr(mpi, "allow_run_as_root", None)
        if root is None:
            root = hasattr(os, "geteuid") and os.geteuid() == 0
        argv = nccl_tests_argv(
            binary, hosts, gpus_per_node, min_bytes=min_bytes, max_bytes=max_bytes, step_factor=factor,
            iters=iters, warmup_iters=warmup, check=check, env=carried, allow_run_as_root=root,
            mpirun=getattr(mpi, "mpirun", "mpirun"), extra_args=tuple(getattr(mpi, "extra_args", ())),
        )  # fmt: skip
        return NcclTestsCommand(tuple(argv + tail), {}, **shape)
    per_process = 1 if starter == "srun" else gpus_per_node
    program = [
        str(binary), "-b", str(min_bytes), "-e", str(max_bytes), "-f", str(factor), "-g", str(per_process),
        "-w", str(warmup), "-n", str(iters), "-c", "1" if check else "0", *tail,
    ]  # fmt: skip
    if starter == "srun":
        program = [*srun_options(launcher, hosts, gpus_per_node, binary, time_limit_s), *program]
    return NcclTestsCommand(tuple(program), carried, **shape)


def srun_options(
    launcher: Any, hosts: Sequence[str], gpus_per_node: int, binary: str | Path, time_limit_s: float
) -> list[str]:
    """``srun`` and its options for one task per GPU on ``hosts`` (the step named after the binary)."""
    nodes = len(hosts)
    options = [
        launcher.srun,
        f"--job-name=nccl-tests-{Path(binary).name}",
        f"--nodes={nodes}",
        f"--ntasks={nodes * gpus_per_node}",
        f"--ntasks-per-node={gpus_per_node}",
        f"--nodelist={','.join(hosts)}",
        "--distribution=block",
        "--kill-on-bad-exit=1",
        f"--time={math.ceil(time_limit_s / 60) + 1}",
        "--export=ALL",
    ]
    if launcher.overcommit:
        options.append("--overcommit")
    return [*options, *launcher.resource_options(gpus_per_node), *launcher.extra_args]


def run_command(command: NcclTestsCommand, log_path: Path, timeout_s: float) -> list[Run]:
    """Run it (its own process group, stopped whole at the timeout); the parsed runs, checked to be
    one job of the command's nodes x GPUs per node ranks.

    LaunchError on a timeout or a non-zero exit, with the end of the log; `NonMpiBuild` when several
    processes each ran alone, `RankMismatch` for another rank count (both LaunchErrors, naming the
    log); ParseError (also a failure) when the output has no result rows.
    """
    if shutil.which(command.argv[0]) is None and not Path(command.argv[0]).is_file():
        raise LaunchError(f"cannot run nccl-tests: {command.argv[0]} not found")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {command.shell_line()}\n")
        log.flush()
        proc = subprocess.Popen(
            list(command.argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **command.env},
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise LaunchError(
                f"nccl-tests did not finish in {timeout_s:g} s: {command.shell_line()}\n{_tail(log_path)}"
            ) from None
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        raise LaunchError(f"nccl-tests exited with code {code}: {command.shell_line()}\n{_tail(log_path)}")
    try:
        runs = parse(text, str(log_path))
    except ParseError as exc:
        if separate_processes(text) <= 1:
            raise ParseError(f"{exc}\n{_tail(log_path)}") from None
        runs = []  # interleaved tables of several lone processes: check_ranks says what happened
    check_ranks(text, runs, nodes=command.nodes, gpus_per_node=command.gpus_per_node, source=str(log_path))
    return runs


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (srun then cancels its step), SIGKILL what is left after a grace."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in text) + f"\n  log: {path}"
