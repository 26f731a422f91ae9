"""Command-line options, their ini keys and environment variables, resolved into `Settings`.

One precedence order, everywhere: command line > environment (``GPUCLUSTER_*``) > ini key in
``[tool.pytest.ini_options]`` > built-in default. Each resolved value remembers where it came
from, so an error can say ``--nnodes=0 (from GPUCLUSTER_NNODES)`` and the report header can
show the effective settings.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.profiles.estimates import DEFAULT_JOB_TIMEOUT_S

T = TypeVar("T")

LAUNCHERS = ("torchrun", "slurm", "mpirun", "deepspeed")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    value: T
    source: str
    """'command line', 'environment GPUCLUSTER_X', 'ini key gpucluster_x' or 'default'."""


@dataclass(frozen=True, slots=True)
class _Option:
    flag: str
    name: str
    """The `Settings` attribute; the option's dest is ``gpucluster_<name>``."""
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    metavar: str | None = None
    multiple: bool = False

    @property
    def dest(self) -> str:
        return f"gpucluster_{self.name}"

    @property
    def ini(self) -> str:
        return f"gpucluster_{self.name}"

    @property
    def env(self) -> str:
        return f"GPUCLUSTER_{self.name.upper()}"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise ValueError(f"expected a number of seconds such as 600, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


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


def _gate_mode(text: str) -> str:
    if text not in ("fail", "warn"):
        raise ValueError(f"expected 'fail' or 'warn', got {text!r}")
    return text


def _percent(text: str) -> float:
    from pytest_gpucluster.profiles.quantities import parse_fraction

    return parse_fraction(text if text.endswith("%") else f"{text}%" if float(text) > 1 else text)


def _env_pattern(text: str) -> str:
    from pytest_gpucluster.launch.forward_env import check_pattern

    try:
        return check_pattern(text, "--forward-env")
    except SettingsError as exc:
        raise ValueError(str(exc).removeprefix("--forward-env: ")) from None


def _soak_duration(text: str) -> float:
    """``"10m"``, ``"10min"``, ``"90s"``, ``"1h"`` or a bare number of seconds -> seconds."""
    from pytest_gpucluster.profiles.quantities import parse_duration

    value = text.strip()
    if value.replace(".", "", 1).isdigit():
        value += "s"
    elif value.endswith("m") and value[:-1].replace(".", "", 1).isdigit():
        value += "in"  # "10m" is minutes here: a soak is never measured in metres or milliseconds
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise ValueError(f"expected a duration such as 10m, 90s or 1h, got {text!r}") from None
    if seconds <= 0:
        raise ValueError(f"expected a positive duration such as 10m, got {text!r}")
    return seconds


def _path(text: str) -> Path:
    return Path(text).expanduser()


OPTIONS: tuple[_Option, ...] = (
    _Option(
        "--hw",
        "hw",
        "hardware profile: a name from thresholds/ or a path to a YAML file; "
        "'auto' picks cpu-local without CUDA, else the profile whose GPU model matches",
        "auto",
        metavar="PROFILE|PATH",
    ),
    _Option(
        "--thresholds-dir",
        "thresholds_dir",
        "extra directory of profile YAML files, searched before the shipped ones",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--hostfile",
        "hostfile",
        "hostfile (DeepSpeed 'host slots=N' or Open MPI format) naming the nodes to test",
        None,
        _path,
        "FILE",
    ),
    _Option(
        "--nnodes",
        "nnodes",
        "number of nodes to use (default: all the cluster has)",
        None,
        _positive_int,
        "N",
    ),
    _Option(
        "--nproc-per-node",
        "nproc_per_node",
        "ranks per node (default: the profile's)",
        None,
        _positive_int,
        "N",
    ),
    _Option(
        "--launcher",
        "launcher",
        f"how ranks are started: {', '.join(LAUNCHERS)} (default: slurm inside a Slurm allocation "
        "without --hostfile, else torchrun)",
        "torchrun",
        _launcher,
        "NAME",
    ),
    _Option(
        "--launcher-args",
        "launcher_args",
        "extra arguments for the launcher itself, e.g. '--partition=gpu --gpus-per-node=8' for slurm "
        "(not for torchrun)",
        None,
        shlex.split,
        "ARGS",
    ),
    _Option(
        "--slurm-mode",
        "slurm_mode",
        "with --launcher slurm: 'agent' (one torchrun agent per node) or 'tasks' (one task per rank, "
        "ranks from SLURM_PROCID)",
        "agent",
        _slurm_mode,
        "MODE",
    ),
    _Option(
        "--remote-exec",
        "remote_exec",
        "command template that runs a command on another node, e.g. 'ssh {host}' or 'ip netns exec {host}'",
        ("ssh", "{host}"),
        _argv_template,
        "TEMPLATE",
    ),
    _Option(
        "--forward-env",
        "forward_env",
        "forward this environment variable (or shell pattern, e.g. 'MY_SITE_*') from this process to "
        "every rank, besides PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, CUDA_*, NCCL_*, FI_*, OFI_*, "
        "UCX_*, TORCH_*, HF_* and OMP_NUM_THREADS (repeatable)",
        (),
        _env_pattern,
        "PATTERN",
        multiple=True,
    ),
    _Option(
        "--rendezvous-timeout",
        "rendezvous_timeout",
        "seconds the ranks of a one-node job get to start and meet; each further node adds 2 s "
        "(raise it where containers or a cold shared filesystem make start-up slow)",
        120.0,
        _positive_seconds,
        "SECONDS",
    ),
    _Option(
        "--slurm-cpu-bind",
        "slurm_cpu_bind",
        "with --launcher slurm: srun's --cpu-bind value for every step, e.g. 'cores' or 'none' (default: "
        "the site's)",
        None,
        str,
        "BIND",
    ),
    _Option(
        "--results-dir",
        "results_dir",
        "where results.json, reports and per-rank logs go (default: gpucluster-results/<timestamp>)",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--job-timeout",
        "job_timeout",
        "seconds before a launched job is declared hung and killed; SFT cases and sweeps otherwise get a "
        "deadline derived from their work (an SFT case's own 'timeout:' wins over both)",
        DEFAULT_JOB_TIMEOUT_S,  # profiles check holds each sft case's estimated run time against it
        _positive_seconds,
        "SECONDS",
    ),
    _Option(
        "--nccl-log",
        "nccl_log",
        "check an existing NCCL_DEBUG=INFO log instead of launching (repeatable, globs allowed)",
        (),
        str,
        "PATH",
        multiple=True,
    ),
    _Option(
        "--train-log",
        "train_log",
        "gate on an existing training log (repeatable, globs)",
        (),
        str,
        "PATH",
        multiple=True,
    ),
    _Option(
        "--nccl-tests-dir",
        "nccl_tests_dir",
        "directory of nccl-tests binaries (all_reduce_perf, ...) to run through the launcher",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--baseline",
        "baseline",
        "an earlier results.json to gate regressions against",
        None,
        _path,
        "RESULTS_JSON",
    ),
    _Option(
        "--gpucluster-soak",
        "soak",
        "burn-in soak: repeat the gated collectives for this long (e.g. 10m, 90s, 1h) and gate the lowest "
        "busbw and its variation over the window (acceptance/test_fabric.py::test_soak)",
        None,
        _soak_duration,
        "DURATION",
    ),
    _Option(
        "--max-regression",
        "max_regression",
        "largest allowed regression against --baseline past the baseline's noise, e.g. 5%, for metrics "
        "the profile's regression: tolerances do not name",
        0.05,
        _percent,
        "PERCENT",
    ),
    _Option(
        "--regression-gate",
        "regression_gate",
        "with --baseline: 'fail' (a confirmed regression fails its test) or 'warn' (compared and "
        "reported, never failed on: runs on different machines)",
        "fail",
        _gate_mode,
        "MODE",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpucluster", "GPU cluster acceptance (pytest-gpucluster)")
    for opt in OPTIONS:
        extra = f" [env {opt.env}, ini {opt.ini}]"
        # argparse %-formats an option's help ("e.g. 5%" would crash --help); pytest prints ini help as is.
        cli_help = (opt.help + extra).replace("%", "%%")
        if opt.multiple:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="append",
                default=None,
                metavar=opt.metavar,
                help=cli_help,
            )
            parser.addini(opt.ini, opt.help, type="linelist", default=[])
        else:
            group.addoption(opt.flag, dest=opt.dest, default=None, metavar=opt.metavar, help=cli_help)
            parser.addini(opt.ini, opt.help, default=None)
    group.addoption(
        "--gpucluster-dry-run",
        dest="gpucluster_dry_run",
        action="store_true",
        default=False,
        help="print, per host, the exact commands each test would launch, and launch nothing",
    )
    group.addoption(
        "--gpucluster-reap",
        dest="gpucluster_reap",
        action="store_true",
        default=False,
        help="at session start, kill the processes that crashed earlier sessions left on the nodes and "
        "remove stale DeepSpeed /dev/shm segments (without it they are only reported)",
    )
    group.addoption(
        "--gpucluster-drain",
        dest="gpucluster_drain",
        action="store_true",
        default=False,
        help="burn-in: run the printed 'scontrol update ... State=DRAIN' command for each suspect node "
        "(without it, suspects.json is written and the commands are only printed)",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The effective settings of one session; ``sources`` says where each came from."""

    hw: str
    thresholds_dir: Path | None
    hostfile: Path | None
    nnodes: int | None
    nproc_per_node: int | None
    launcher: str
    launcher_args: tuple[str, ...] | None
    slurm_mode: str
    remote_exec: tuple[str, ...]
    forward_env: tuple[str, ...]
    rendezvous_timeout: float
    slurm_cpu_bind: str | None
    results_dir: Path | None
    job_timeout: float
    nccl_log: tuple[str, ...]
    train_log: tuple[str, ...]
    nccl_tests_dir: Path | None
    baseline: Path | None
    soak: float | None
    max_regression: float
    regression_gate: str = "fail"
    dry_run: bool = False
    drain: bool = False
    reap: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    """Option name -> 'command line', 'environment GPUCLUSTER_X', 'ini key gpucluster_x' or 'default'."""

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def describe(self, name: str) -> str:
        return f"{getattr(self, name)} (from {self.source(name)})"

    def recorded(self) -> dict[str, Setting[Any]]:
        """Every option's value and source, by option dest (as results.json's header keeps them)."""
        return {opt.dest: Setting(getattr(self, opt.name), self.source(opt.name)) for opt in OPTIONS}


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option: CLI > env > ini > default; bad values raise SettingsError naming the source."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        raw, source = _raw_value(config, env, opt)
        sources[opt.name] = source
        if raw is None:
            values[opt.name] = opt.default
            continue
        try:
            values[opt.name] = tuple(opt.parse(item) for item in raw) if opt.multiple else opt.parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{opt.flag}: {exc} (from {source})") from None
    if sources["launcher"] == "default" and values["hostfile"] is None and (why := _in_allocation(env)):
        values["launcher"], sources["launcher"] = "slurm", f"default {why}"
    return Settings(
        **values,
        dry_run=bool(config.getoption("gpucluster_dry_run")),
        drain=bool(config.getoption("gpucluster_drain")),
        reap=bool(config.getoption("gpucluster_reap")),
        sources=sources,
    )


def _in_allocation(env: Mapping[str, str]) -> str | None:
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


def _raw_value(config: pytest.Config, env: Mapping[str, str], opt: _Option) -> tuple[Any, str]:
    cli = config.getoption(opt.dest)
    if cli:
        return (list(cli) if opt.multiple else cli), "command line"
    if env.get(opt.env):
        value = env[opt.env]
        return (value.split(os.pathsep) if opt.multiple else value), f"environment {opt.env}"
    ini = config.getini(opt.ini)
    if ini:
        return (list(ini) if opt.multiple else ini), f"ini key {opt.ini}"
    return None, "default"
