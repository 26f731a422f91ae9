"""``gpucluster health-check``: the quick tier on this node alone, for Slurm's ``HealthCheckProgram``,
a prolog, or a Kubernetes-style node check.

It runs ``pytest <suite> -m quick`` on this machine only (no hostfile, the torchrun launcher even
inside an allocation, whose other nodes are not this check's business), reads the run's
results.json, and ends in one of three states, one line each:

- **healthy**, exit 0: pytest exited 0 and at least one quick test passed (0 passed is not healthy:
  nothing was checked);
- **failed**, exit 1: a check failed on this node (a quick test failed, the preflight stopped the
  run on a node finding). Only this state drains, with ``--drain``;
- **inconclusive**, exit 2: the check could not judge the node: it ran past ``--timeout``, pytest
  exited 2-5 (interrupted, internal error, usage error such as an unknown ``--hw``, nothing
  selected), 0 tests passed, no results were written, or there is no suite. The reason says which;
  the node is never drained for it (the check's own trouble is not the node's).

``--nvml-only`` launches no job: it reads NVML and sysfs (`workloads.node_readings`) and judges
them (`nvml_verdict`): fewer GPUs than the profile's ``gpus_per_node``, a GPU NVML lists and
cannot read (lost), or that PCI lists and NVML does not, uncorrectable ECC errors since the last
reset, a pending or failed row remap. It is the mode for Slurm's ``HealthCheckProgram`` (killed
after 60 s, run on every node at once and at slurmd start).

With ``--drain`` a failed node is drained through ``scontrol update NodeName=<node> State=DRAIN
Reason=<the line>``, the argv list of `burnin.drain.drain_argv` (never a shell string: the reason
holds measured text; a node name that would name several nodes is refused). The node is
``--node``, else ``SLURMD_NODENAME`` (set for prologs and the health check), else the short
hostname. Configuration recipes: docs/how-to/health-check.md.
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
from typing import Any, Literal

from pytest_gpucluster.burnin.drain import MAX_REASON, drain_argv, slurm_reason
from pytest_gpucluster.errors import GpuClusterError

__all__ = [
    "EXIT_CODES",
    "HealthVerdict",
    "add_health_check_command",
    "nvml_verdict",
    "pytest_argv",
    "verdict_of",
]

REASON_LIMIT = MAX_REASON
"""The verdict line is the drain reason: one line, as long as Slurm's reason is kept."""
DEFAULT_TIMEOUT_S = 1800.0


State = Literal["healthy", "failed", "inconclusive"]
EXIT_CODES: dict[State, int] = {"healthy": 0, "failed": 1, "inconclusive": 2}
"""The health check's exit status per state (module docstring); only ``failed`` drains."""
_PYTEST_EXITS = {
    2: "pytest was interrupted",
    3: "pytest hit an internal error",
    4: "pytest was called wrongly (a usage error)",
    5: "pytest selected no test",
}


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    healthy: bool
    reason: str
    """One line: what failed, where, measured against what; or what passed."""
    state: State = "failed"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES["healthy" if self.healthy else self.state]

    @property
    def drains(self) -> bool:
        """Only a failed check drains: never a timeout, a usage error or nothing checked."""
        return not self.healthy and self.state == "failed"


def _inconclusive(node: str, why: str) -> HealthVerdict:
    return HealthVerdict(
        False,
        slurm_reason(f"gpucluster health-check on {node}: inconclusive, not drained: {why}"),
        "inconclusive",
    )


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
    passed = sum(1 for o in outcomes if o.get("outcome") == "passed")
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
    if exit_code in _PYTEST_EXITS:
        return _inconclusive(node, f"{_PYTEST_EXITS[exit_code]} (exit {exit_code}): {last}")
    if exit_code == 0 and not failed:
        if passed == 0:
            return _inconclusive(
                node, "0 quick tests passed, so nothing was checked (all skipped or deselected)"
            )
        return HealthVerdict(
            True, f"gpucluster health-check on {node}: quick tier passed ({passed} test(s))", "healthy"
        )
    if failed:
        first = failed[0]
        test = str(first.get("test_id", "?")).split("::")[-1]
        message = " ".join(str(first.get("message") or first.get("category") or "failed").split())
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return HealthVerdict(
            False, slurm_reason(f"gpucluster health-check on {node}: {test}: {message}{more}")
        )
    if results is None:
        return _inconclusive(node, f"pytest exited {exit_code} and wrote no results: {last}")
    return _inconclusive(node, f"pytest exited {exit_code} with no failed test in its results: {last}")


def nvml_verdict(readings: Any, node: str, gpus_per_node: int | None) -> tuple[HealthVerdict, list[str]]:
    """``--nvml-only``'s verdict from `workloads.node_readings.NodeReadings`, and the lines saying
    what was read. ``gpus_per_node``: the profile's (None: no profile given, the count not judged;
    0: a CPU profile, NVML not needed)."""
    read = [
        f"read: NVML {readings.nvml}" + (f", {len(readings.gpus)} GPU(s)" if readings.nvml == "read" else ""),
        f"read: sysfs PCI: {len(readings.pci_gpus)} NVIDIA GPU(s)"
        + (f" ({', '.join(readings.pci_gpus)})" if readings.pci_gpus else ""),
        f"read: sysfs InfiniBand: {len(readings.ib_ports)} port(s)"
        + (f" ({', '.join(f'{k} {v}' for k, v in readings.ib_ports.items())})" if readings.ib_ports else ""),
        f"read in {readings.seconds:.2f} s; no job launched",
    ]
    for gpu in readings.gpus:
        state = f"LOST ({gpu.lost})" if gpu.lost else (
            f"ecc_uncorrected_volatile={gpu.ecc_uncorrected_volatile} remap_pending={gpu.remap_pending} "
            f"remap_failure={gpu.remap_failure}"
        )  # fmt: skip
        read.append(f"read: GPU {gpu.index} {gpu.pci} {gpu.name}: {state}")
    head = f"gpucluster health-check on {node} (nvml-only)"
    problems: list[str] = []
    expects_gpus = (gpus_per_node is None and bool(readings.pci_gpus)) or bool(gpus_per_node)
    if readings.nvml != "read":
        if not expects_gpus:
            return HealthVerdict(
                True, f"{head}: healthy: no GPU expected here; NVML {readings.nvml}", "healthy"
            ), read
        if readings.nvml_missing_package:
            return _inconclusive(node, f"NVML {readings.nvml}"), read
        problems.append(f"NVML {readings.nvml} (drain node: the driver does not answer)")
    nvml_pci = {_short_pci(g.pci) for g in readings.gpus if g.pci}
    for gpu in readings.gpus:
        where = f"GPU {gpu.index}" + (f" ({gpu.pci})" if gpu.pci else "")
        if gpu.lost:
            problems.append(f"{where} is lost: NVML {gpu.lost} (reset the GPU, then RMA if it stays lost)")
        if gpu.remap_failure:
            problems.append(f"{where}: row remapping failed (RMA)")
        elif gpu.remap_pending:
            problems.append(f"{where}: a row remap is pending (reset the GPU)")
        if gpu.ecc_uncorrected_volatile:
            problems.append(
                f"{where}: {gpu.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the last reset (reset the GPU)"
            )
    if readings.nvml == "read":
        unseen = [p for p in readings.pci_gpus if _short_pci(p) not in nvml_pci]
        if unseen and len(readings.gpus) < len(readings.pci_gpus):
            problems.append(
                f"{len(unseen)} GPU(s) on the PCI bus NVML does not list: {', '.join(unseen)} (reset the GPU, then RMA)"
            )
        if gpus_per_node and len(readings.gpus) < gpus_per_node:
            problems.append(
                f"{len(readings.gpus)} GPU(s) present, the profile expects {gpus_per_node} (drain node)"
            )
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return HealthVerdict(False, slurm_reason(f"{head}: {problems[0]}{more}")), read
    counted = f"{len(readings.gpus)} GPU(s) read by NVML" if readings.nvml == "read" else "no GPU expected"
    return HealthVerdict(
        True, f"{head}: healthy: {counted}, none lost, no uncorrectable error", "healthy"
    ), read


def _short_pci(address: str) -> str:
    """``00000000:3B:00.0`` (NVML) and ``0000:3b:00.0`` (sysfs) alike: ``3b:00.0`` with its domain."""
    parts = address.lower().split(":")
    return f"{int(parts[0], 16) if len(parts) == 3 else 0}:{':'.join(parts[-2:])}"


def node_name(explicit: str | None) -> str:
    return explicit or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _profile_gpus(hw: str | None, extra: list[str]) -> int | None:
    """The profile's ``gpus_per_node`` (None without ``--hw`` or with ``--hw=auto``); raises
    GpuClusterError for an unknown profile. ``--thresholds-dir DIR`` after ``--`` is searched too."""
    if not hw or hw == "auto":
        return None
    from pytest_gpucluster.profiles.loader import load_profile

    dirs = [Path(a.split("=", 1)[1]) for a in extra if a.startswith("--thresholds-dir=")]
    dirs += [Path(extra[i + 1]) for i, a in enumerate(extra[:-1]) if a == "--thresholds-dir"]
    return int(load_profile(hw, dirs).model.cluster.gpus_per_node)


def _run_nvml_only(args: argparse.Namespace, node: str) -> tuple[HealthVerdict, list[str]]:
    from pytest_gpucluster.workloads.node_readings import read_node

    try:
        expected = _profile_gpus(args.hw, args.pytest_args)
    except GpuClusterError as exc:
        return _inconclusive(node, f"the profile could not be read: {' '.join(str(exc).split())}"), []
    return nvml_verdict(read_node(), node, expected)


def _run_quick_tier(args: argparse.Namespace, node: str) -> HealthVerdict:
    suite = Path(args.suite) if args.suite else default_suite()
    if suite is None or not suite.is_dir():
        where = (
            f"{args.suite} is not a directory"
            if args.suite
            else "none in pytest_gpucluster/acceptance (a wheel carries it) nor a checkout's acceptance/"
        )
        # the reason is also Slurm's (truncated): what to do first
        return _inconclusive(
            node, f"no acceptance suite here: pass --suite DIR or reinstall the wheel ({where})"
        )
    with tempfile.TemporaryDirectory(prefix="gpucluster-health-") as tmp:
        results_dir = Path(args.results_dir) if args.results_dir else Path(tmp) / "results"
        argv = pytest_argv(suite, args.hw, results_dir, args.pytest_args)
        env = {k: v for k, v in os.environ.items() if k not in ("GPUCLUSTER_HOSTFILE", "GPUCLUSTER_LAUNCHER")}
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            return _inconclusive(
                node,
                f"the quick tier did not finish in {args.timeout:g} s (a check that ran out of time judged nothing)",
            )
        results_file = results_dir / "results.json"
        results = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else None
        verdict = verdict_of(done.returncode, results, done.stdout + done.stderr, node)
        if not verdict.healthy:  # the run's own words, for the node's log
            print((done.stdout + done.stderr)[-3000:], file=sys.stderr)
        return verdict


def run_health_check(args: argparse.Namespace) -> int:
    node = node_name(args.node)
    if args.nvml_only:
        verdict, read = _run_nvml_only(args, node)
    else:
        verdict, read = _run_quick_tier(args, node), []
    print(verdict.reason)
    for line in read:
        print(f"  {line}")
    if args.inconclusive_ok and verdict.state == "inconclusive" and not verdict.healthy:
        return 0  # a Slurm prolog: Slurm drains the node on any non-zero exit of its prolog
    if args.drain and verdict.drains:
        try:  # the verdict line already says who drains: no burn-in prefix
            argv = drain_argv(node, verdict.reason, prefix="")
        except GpuClusterError as exc:
            print(f"gpucluster health-check: not drained: {exc}", file=sys.stderr)
            return verdict.exit_code
        drained = subprocess.run(argv, capture_output=True, text=True, check=False)
        if drained.returncode != 0:
            print(f"gpucluster health-check: scontrol could not drain {node}: "
                  f"{(drained.stderr or drained.stdout).strip()}", file=sys.stderr)  # fmt: skip
    return verdict.exit_code


def add_health_check_command(sub: Any) -> None:
    """Register ``gpucluster health-check`` on the CLI's subparsers."""
    check = sub.add_parser(
        "health-check",
        help="run the quick tier on this node alone (or, with --nvml-only, read NVML and sysfs); exit 0 "
        "healthy, 1 failed (--drain drains the node), 2 inconclusive (a timeout, a pytest usage or "
        "internal error, nothing checked: never drained), each with a one-line reason",
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
    check.add_argument(
        "--drain",
        action="store_true",
        help="drain this node through scontrol when a check failed (exit 1); never on a timeout or "
        "an inconclusive run (exit 2)",
    )
    check.add_argument(
        "--inconclusive-ok",
        action="store_true",
        help="exit 0 on an inconclusive result (its reason still printed): for a Slurm Prolog, where "
        "Slurm itself drains the node on any non-zero exit",
    )
    check.add_argument(
        "--nvml-only",
        action="store_true",
        help="launch no job: read NVML and sysfs only, judge the GPU count against --hw's gpus_per_node, "
        "lost GPUs, uncorrectable ECC and row remaps, list the InfiniBand ports' states, and print what was "
        "read; seconds on a cold node, for Slurm's HealthCheckProgram (killed after 60 s)",
    )
    check.add_argument("--results-dir", help="keep the run's results here (default: a temporary directory)")
    check.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds before giving up on the quick tier (inconclusive, exit 2, never drained)",
    )
    check.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    check.set_defaults(func=run_health_check)
