"""Command-line options, their ini keys and environment variables, resolved into `Settings`.

One precedence order, everywhere: command line > environment (``GPUCLUSTER_*``) > ini key in
``[tool.pytest.ini_options]`` > built-in default. Each resolved value remembers where it came
from, so an error can say ``--nnodes=0 (from GPUCLUSTER_NNODES)`` and the report header can
show the effective settings.

The option table is declared by subject in pytest-free modules of this package (`cluster`,
`launch`, `files`, `gate`, `burnin`, `history`, `tiers`; `spec` says what an option is). This package's `__init__` is
the one entry point `plugin` calls and the only one of them that imports pytest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.options import burnin as options_burnin
from pytest_gpucluster.options import cluster as options_cluster
from pytest_gpucluster.options import files as options_files
from pytest_gpucluster.options import gate as options_gate
from pytest_gpucluster.options import history as options_history
from pytest_gpucluster.options import launch as options_launch
from pytest_gpucluster.options import tiers as options_tiers
from pytest_gpucluster.options.spec import Option, Setting

__all__ = ["OPTIONS", "Setting", "Settings", "add_options", "resolve_settings"]

OPTIONS: tuple[Option, ...] = (
    options_cluster.HW,
    options_cluster.THRESHOLDS_DIR,
    options_cluster.HOSTFILE,
    options_cluster.NNODES,
    options_cluster.NPROC_PER_NODE,
    options_launch.LAUNCHER,
    options_launch.LAUNCHER_ARGS,
    options_launch.SLURM_MODE,
    options_launch.REMOTE_EXEC,
    options_launch.FORWARD_ENV,
    options_launch.RENDEZVOUS_TIMEOUT,
    options_launch.SLURM_CPU_BIND,
    options_files.RESULTS_DIR,
    options_launch.JOB_TIMEOUT,
    options_files.NCCL_LOG,
    options_files.TRAIN_LOG,
    options_files.NCCL_TESTS_DIR,
    options_gate.BASELINE,
    options_burnin.SOAK,
    options_gate.MAX_REGRESSION,
    options_gate.REGRESSION_GATE,
    options_history.HISTORY,
    options_tiers.BUDGET,
    options_cluster.EXCLUDE,
)
"""Every option, in the order --help lists them and results.json's header records them (the order
they had before the table was split by subject; users and stored baselines know it)."""


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
        help="launch nothing: print the plan as a table (each job, its nodes x ranks, tier, estimated run and "
        "deadline) with the session's total and each tier's; with -v also each job's deadline arithmetic and "
        "exact commands, environment included",
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
        "--gpucluster-retest-suspects",
        dest="gpucluster_retest_suspects",
        action="store_true",
        default=False,
        help="after the run, run the tests that named a node to drain once more on those nodes only; a "
        "node is listed to drain only if its retest fails too (both values are reported)",
    )
    group.addoption(
        "--gpucluster-strict-nodes",
        dest="gpucluster_strict_nodes",
        action="store_true",
        default=False,
        help="stop before the first job when any node fails a node-level requirement (unreachable, "
        "probe failed, too few usable GPUs, a required interface or HCA absent or down), instead of "
        "setting that node aside and measuring the others",
    )
    group.addoption(
        "--gpucluster-drain",
        dest="gpucluster_drain",
        action="store_true",
        default=False,
        help="at the end of the session, run the drain list's 'scontrol update ... State=DRAIN' command "
        "for each host whose finding's next action drains it (drain node, reset GPU, reseat/replace "
        "cable or NIC, RMA); a burn-in suspect whose finding says rerun stays listed in suspects.json "
        "and is never drained (without the option, suspects.json is written and nothing is run)",
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
    baseline: Path | options_gate.HistoryRuns | None
    soak: float | None
    max_regression: float
    regression_gate: str = "fail"
    history: Path | None = None
    budget: float | None = None
    exclude: tuple[str, ...] = ()
    """``--gpucluster-exclude``: the nodes left out from the start, every name once, in order."""
    dry_run: bool = False
    strict_nodes: bool = False
    drain: bool = False
    reap: bool = False
    retest_suspects: bool = False
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
            if opt is options_cluster.EXCLUDE:  # HOST[,HOST...], repeatable: one flat list
                values[opt.name] = tuple(dict.fromkeys(h for group in values[opt.name] for h in group))
        except ValueError as exc:
            raise SettingsError(f"{opt.flag}: {exc} (from {source})") from None
    if (
        sources["launcher"] == "default"
        and values["hostfile"] is None
        and (why := options_launch.in_allocation(env))
    ):
        values["launcher"], sources["launcher"] = "slurm", f"default {why}"
    return Settings(
        **values,
        dry_run=bool(config.getoption("gpucluster_dry_run")),
        drain=bool(config.getoption("gpucluster_drain")),
        reap=bool(config.getoption("gpucluster_reap")),
        retest_suspects=bool(config.getoption("gpucluster_retest_suspects")),
        strict_nodes=bool(config.getoption("gpucluster_strict_nodes")),
        sources=sources,
    )


def _raw_value(config: pytest.Config, env: Mapping[str, str], opt: Option) -> tuple[Any, str]:
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
