"""Run an nccl-tests binary (``all_reduce_perf``...) on the session's nodes and parse its table.

Used by ``acceptance/test_collectives.py`` when ``--nccl-tests-dir`` or the profile's
``collectives.nccl_tests_dir`` names a directory of built binaries. How a binary is started:

- one node, this machine: the binary itself with ``-g <GPUs per node>`` (one process driving
  every GPU, nccl-tests' single-node mode; no MPI build needed);
- otherwise: Open MPI's ``mpirun`` with one process per GPU (``-g 1``), the command line of
  nccl-tests' README and of seed 002 (`launch.mpi.nccl_tests_argv`); the binaries must be built
  with ``MPI=1``.

The output goes to a log file in the results directory and is parsed with
`parsers.nccl_tests.parse`. No torch, no pytest.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.errors import LaunchError, ParseError, SettingsError
from pytest_gpucluster.launch.base import is_local_host
from pytest_gpucluster.launch.mpi import nccl_tests_argv
from pytest_gpucluster.maths.sweep import NCCL_TYPE_NAMES
from pytest_gpucluster.parsers.nccl_tests import Run, parse

__all__ = ["NcclTestsCommand", "binary_path", "build_command", "run_command"]


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
    """Variables added to this process's environment (the direct run; mpirun gets ``-x``)."""

    def shell_line(self) -> str:
        import shlex

        return shlex.join(self.argv)


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
    use_mpirun: bool | None = None,
    allow_run_as_root: bool | None = None,
) -> NcclTestsCommand:
    """The command for one sweep; ``use_mpirun`` None: mpirun unless one local node."""
    if gpus_per_node < 1:
        raise SettingsError(f"nccl-tests needs at least one GPU per node, the profile has {gpus_per_node}")
    if use_mpirun is None:
        use_mpirun = len(hosts) > 1 or not all(is_local_host(h) for h in hosts)
    tail = ["-d", NCCL_TYPE_NAMES.get(dtype, dtype), "-o", op]
    if use_mpirun:
        root = (
            allow_run_as_root
            if allow_run_as_root is not None
            else hasattr(os, "geteuid") and os.geteuid() == 0
        )
        argv = nccl_tests_argv(
            binary, hosts, gpus_per_node, min_bytes=min_bytes, max_bytes=max_bytes, step_factor=factor,
            iters=iters, warmup_iters=warmup, check=check, env=env, allow_run_as_root=root,
        )  # fmt: skip
        return NcclTestsCommand(tuple(argv + tail), {})
    argv = [
        str(binary),
        "-b",
        str(min_bytes),
        "-e",
        str(max_bytes),
        "-f",
        str(factor),
        "-g",
        str(gpus_per_node),
    ]
    argv += ["-w", str(warmup), "-n", str(iters), "-c", str(int(check)), *tail]
    return NcclTestsCommand(tuple(argv), dict(env))


def run_command(command: NcclTestsCommand, log_path: Path, timeout_s: float) -> list[Run]:
    """Run it (its own process group, killed whole at the timeout); the parsed runs.

    LaunchError on a timeout or a non-zero exit, with the end of the log; ParseError (also a
    failure) when the output has no result rows.
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
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise LaunchError(
                f"nccl-tests did not finish in {timeout_s:g} s: {command.shell_line()}\n{_tail(log_path)}"
            ) from None
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        raise LaunchError(f"nccl-tests exited with code {code}: {command.shell_line()}\n{_tail(log_path)}")
    try:
        return parse(text, str(log_path))
    except ParseError as exc:
        raise ParseError(f"{exc}\n{_tail(log_path)}") from None


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in text) + f"\n  log: {path}"
