"""``gpucluster health-check``: the quick tier on this node alone, for Slurm's ``HealthCheckProgram``,
a prolog, or a Kubernetes-style node check.

It runs ``pytest <suite> -m quick`` on this machine only (no hostfile, the torchrun launcher even
inside an allocation, whose other nodes are not this check's business), reads the run's
results.json and exits 0 when every quick check passed, 1 with one line naming the first failure
otherwise (a preflight that stops the run, a job that cannot start, are failures of the node too;
2 only when there is no suite to run). With
``--drain`` a failing node is drained through ``scontrol update NodeName=<node> State=DRAIN
Reason=<the line>``, the argv list of `burnin.drain.drain_argv` (never a shell string: the reason
holds measured text; a node name that would name several nodes is refused). The node is
``--node``, else ``SLURMD_NODENAME`` (set for prologs and the health check), else the short
hostname. Slurm configuration: the README's *Node health check*.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.burnin.drain import MAX_REASON, drain_argv, slurm_reason
from pytest_gpucluster.errors import GpuClusterError

__all__ = ["HealthVerdict", "add_health_check_command", "pytest_argv", "verdict_of"]

REASON_LIMIT = MAX_REASON
"""The verdict line is the drain reason: one line, as long as Slurm's reason is kept."""
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    healthy: bool
    reason: str
    """One line: what failed, where, measured against what; or what passed."""


def default_suite(package_dir: Path | None = None) -> Path | None:
    """The acceptance suite this package runs with: the one an installed wheel carries
    (``pytest_gpucluster/acceptance``), else the top-level ``acceptance/`` of the checkout the
    package runs from (a checkout, or an editable install of one: its parent holds pyproject.toml).

    The installed copy is looked for first, and the checkout's only beside a pyproject.toml, so
    that a wheel in ``site-packages`` never picks up another distribution's ``acceptance`` package.
    """
    package_dir = package_dir or Path(__file__).resolve().parent
    installed = package_dir / "acceptance"
    if (installed / "conftest.py").is_file():
        return installed
    checkout = package_dir.parent / "acceptance"
    if (package_dir.parent / "pyproject.toml").is_file() and (checkout / "conftest.py").is_file():
        return checkout
    return None


def pytest_argv(suite: Path, hw: str | None, results_dir: Path, extra: list[str]) -> list[str]:
    """The quick tier on this machine only: no hostfile, torchrun (not srun inside an allocation).

    ``--rootdir`` is the suite's parent, so test ids read ``acceptance/test_x.py::...`` both from a
    checkout (its root, as ``pytest acceptance/``) and from a wheel (``site-packages/pytest_gpucluster``),
    whatever directory the check is started from."""
    argv = [sys.executable, "-m", "pytest", str(suite), "-m", "quick", "-q", "-p", "no:cacheprovider",
            f"--rootdir={suite.parent}", f"--confcutdir={suite}", "--launcher=torchrun",
            f"--results-dir={results_dir}"]  # fmt: skip
    if hw:
        argv.append(f"--hw={hw}")
    return argv + list(extra)


def verdict_of(exit_code: int, results: dict[str, Any] | None, output: str, node: str) -> HealthVerdict:
    """The health check's verdict from pytest's exit code, its results.json and its output."""
    outcomes = (results or {}).get("outcomes") or []
    failed = [o for o in outcomes if o.get("outcome") in ("failed", "error")]
    if exit_code == 0 and not failed:
        passed = sum(1 for o in outcomes if o.get("outcome") == "passed")
        return HealthVerdict(True, f"gpucluster health-check on {node}: quick tier passed ({passed} test(s))")
    if failed:
        first = failed[0]
        test = str(first.get("test_id", "?")).split("::")[-1]
        message = " ".join(str(first.get("message") or first.get("category") or "failed").split())
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        line = f"gpucluster health-check on {node}: {test}: {message}{more}"
    else:
        last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
        line = f"gpucluster health-check on {node}: pytest exited {exit_code}: {last}"
    return HealthVerdict(False, slurm_reason(line))


def node_name(explicit: str | None) -> str:
    return explicit or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_health_check(args: argparse.Namespace) -> int:
    suite = Path(args.suite) if args.suite else default_suite()
    if suite is None or not suite.is_dir():
        where = (
            f"{args.suite} is not a directory"
            if args.suite
            else (
                "neither this installed package (pytest_gpucluster/acceptance, which a wheel carries) nor "
                "a checkout around it (acceptance/ beside pyproject.toml) holds one"
            )
        )
        print(f"gpucluster health-check: no acceptance suite here: {where}; reinstall pytest-gpucluster "
              "from a wheel or pass --suite DIR (an acceptance/ directory)", file=sys.stderr)  # fmt: skip
        return 2
    node = node_name(args.node)
    with tempfile.TemporaryDirectory(prefix="gpucluster-health-") as tmp:
        results_dir = Path(args.results_dir) if args.results_dir else Path(tmp) / "results"
        argv = pytest_argv(suite, args.hw, results_dir, args.pytest_args)
        env = {k: v for k, v in os.environ.items() if k not in ("GPUCLUSTER_HOSTFILE", "GPUCLUSTER_LAUNCHER")}
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            verdict = HealthVerdict(False, slurm_reason(
                f"gpucluster health-check on {node}: the quick tier did not finish in {args.timeout:g} s"))  # fmt: skip
        else:
            results_file = results_dir / "results.json"
            results = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else None
            verdict = verdict_of(done.returncode, results, done.stdout + done.stderr, node)
            if not verdict.healthy:  # the run's own words, for the node's log
                print((done.stdout + done.stderr)[-3000:], file=sys.stderr)
    print(verdict.reason)
    if verdict.healthy:
        return 0
    if args.drain:
        try:  # the verdict line already says who drains: no burn-in prefix
            argv = drain_argv(node, verdict.reason, prefix="")
        except GpuClusterError as exc:
            print(f"gpucluster health-check: not drained: {exc}", file=sys.stderr)
            return 1
        drained = subprocess.run(argv, capture_output=True, text=True, check=False)
        if drained.returncode != 0:
            print(f"gpucluster health-check: scontrol could not drain {node}: "
                  f"{(drained.stderr or drained.stdout).strip()}", file=sys.stderr)  # fmt: skip
    return 1


def add_health_check_command(sub: Any) -> None:
    """Register ``gpucluster health-check`` on the CLI's subparsers."""
    check = sub.add_parser(
        "health-check",
        help="run the quick tier on this node alone; exit 1 with a one-line reason when it fails "
        "(for Slurm's HealthCheckProgram or a prolog; --drain drains the node)",
    )
    check.add_argument("--hw", help="hardware profile (default: auto, as pytest's --hw)")
    check.add_argument(
        "--suite",
        help="the acceptance directory (default: the suite installed with the plugin, "
        "pytest_gpucluster/acceptance, or a checkout's acceptance/)",
    )
    check.add_argument(
        "--node", help="the Slurm node name (default: $SLURMD_NODENAME, else the short hostname)"
    )
    check.add_argument("--drain", action="store_true", help="drain this node through scontrol when it fails")
    check.add_argument("--results-dir", help="keep the run's results here (default: a temporary directory)")
    check.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before giving up")
    check.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    check.set_defaults(func=run_health_check)
