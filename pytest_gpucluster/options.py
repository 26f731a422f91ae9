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
    dest: str
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    metavar: str | None = None
    multiple: bool = False

    @property
    def ini(self) -> str:
        return f"gpucluster_{self.dest.removeprefix('gpucluster_')}"

    @property
    def env(self) -> str:
        return f"GPUCLUSTER_{self.dest.removeprefix('gpucluster_').upper()}"


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


def _percent(text: str) -> float:
    from pytest_gpucluster.profiles.quantities import parse_fraction

    return parse_fraction(text if text.endswith("%") else f"{text}%" if float(text) > 1 else text)


def _path(text: str) -> Path:
    return Path(text).expanduser()


OPTIONS: tuple[_Option, ...] = (
    _Option(
        "--hw",
        "gpucluster_hw",
        "hardware profile: a name from thresholds/ or a path to a YAML file; "
        "'auto' picks cpu-local without CUDA, else the profile whose GPU model matches",
        "auto",
        metavar="PROFILE|PATH",
    ),
    _Option(
        "--thresholds-dir",
        "gpucluster_thresholds_dir",
        "extra directory of profile YAML files, searched before the shipped ones",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--hostfile",
        "gpucluster_hostfile",
        "hostfile (DeepSpeed 'host slots=N' or Open MPI format) naming the nodes to test",
        None,
        _path,
        "FILE",
    ),
    _Option(
        "--nnodes",
        "gpucluster_nnodes",
        "number of nodes to use (default: all the cluster has)",
        None,
        _positive_int,
        "N",
    ),
    _Option(
        "--nproc-per-node",
        "gpucluster_nproc_per_node",
        "ranks per node (default: the profile's)",
        None,
        _positive_int,
        "N",
    ),
    _Option(
        "--launcher",
        "gpucluster_launcher",
        f"how ranks are started: {', '.join(LAUNCHERS)}",
        "torchrun",
        _launcher,
        "NAME",
    ),
    _Option(
        "--launcher-args",
        "gpucluster_launcher_args",
        "extra arguments for the launcher itself, e.g. '--partition=gpu --gpus-per-node=8' for slurm "
        "(not for torchrun)",
        None,
        shlex.split,
        "ARGS",
    ),
    _Option(
        "--slurm-mode",
        "gpucluster_slurm_mode",
        "with --launcher slurm: 'agent' (one torchrun agent per node) or 'tasks' (one task per rank, "
        "ranks from SLURM_PROCID)",
        "agent",
        _slurm_mode,
        "MODE",
    ),
    _Option(
        "--remote-exec",
        "gpucluster_remote_exec",
        "command template that runs a command on another node, e.g. 'ssh {host}' or 'ip netns exec {host}'",
        ("ssh", "{host}"),
        _argv_template,
        "TEMPLATE",
    ),
    _Option(
        "--results-dir",
        "gpucluster_results_dir",
        "where results.json, reports and per-rank logs go (default: gpucluster-results/<timestamp>)",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--job-timeout",
        "gpucluster_job_timeout",
        "seconds before a launched job is declared hung and killed (tests may ask for less)",
        DEFAULT_JOB_TIMEOUT_S,  # profiles check holds each sft case's estimated run time against it
        _positive_seconds,
        "SECONDS",
    ),
    _Option(
        "--nccl-log",
        "gpucluster_nccl_log",
        "check an existing NCCL_DEBUG=INFO log instead of launching (repeatable, globs allowed)",
        (),
        str,
        "PATH",
        multiple=True,
    ),
    _Option(
        "--train-log",
        "gpucluster_train_log",
        "gate on an existing training log (repeatable, globs)",
        (),
        str,
        "PATH",
        multiple=True,
    ),
    _Option(
        "--nccl-tests-dir",
        "gpucluster_nccl_tests_dir",
        "directory of nccl-tests binaries (all_reduce_perf, ...) to run through the launcher",
        None,
        _path,
        "DIR",
    ),
    _Option(
        "--baseline",
        "gpucluster_baseline",
        "an earlier results.json to gate regressions against",
        None,
        _path,
        "RESULTS_JSON",
    ),
    _Option(
        "--max-regression",
        "gpucluster_max_regression",
        "largest allowed regression against --baseline, e.g. 5%",
        0.05,
        _percent,
        "PERCENT",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpucluster", "GPU cluster acceptance (pytest-gpucluster)")
    for opt in OPTIONS:
        extra = f" [env {opt.env}, ini {opt.ini}]"
        if opt.multiple:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="append",
                default=None,
                metavar=opt.metavar,
                help=opt.help + extra,
            )
            parser.addini(opt.ini, opt.help, type="linelist", default=[])
        else:
            group.addoption(opt.flag, dest=opt.dest, default=None, metavar=opt.metavar, help=opt.help + extra)
            parser.addini(opt.ini, opt.help, default=None)
    group.addoption(
        "--gpucluster-dry-run",
        dest="gpucluster_dry_run",
        action="store_true",
        default=False,
        help="print, per host, the exact commands each test would launch, and launch nothing",
    )
    group.addoption(
        "--gpucluster-drain",
        dest="gpucluster_drain",
        action="store_true",
        default=False,
        help="burn-in: run the printed 'scontrol update ... State=DRAIN' command for each suspect node "
        "(without it, suspects.json is written and the commands are only printed)",
    )


@dataclass(frozen=True)
class Settings:
    """The effective settings of one session, each with its source."""

    values: Mapping[str, Setting[Any]] = field(default_factory=dict)
    dry_run: bool = False

    def __getitem__(self, dest: str) -> Any:
        return self.values[dest].value

    def source(self, dest: str) -> str:
        return self.values[dest].source

    def describe(self, dest: str) -> str:
        setting = self.values[dest]
        return f"{setting.value} (from {setting.source})"


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option: CLI > env > ini > default; bad values raise SettingsError naming the source."""
    env = os.environ if environ is None else environ
    resolved: dict[str, Setting[Any]] = {}
    for opt in OPTIONS:
        raw, source = _raw_value(config, env, opt)
        if raw is None:
            resolved[opt.dest] = Setting(opt.default, "default")
            continue
        try:
            if opt.multiple:
                value: Any = tuple(opt.parse(item) for item in raw)
            else:
                value = opt.parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{opt.flag}: {exc} (from {source})") from None
        resolved[opt.dest] = Setting(value, source)
    return Settings(values=resolved, dry_run=bool(config.getoption("gpucluster_dry_run")))


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
