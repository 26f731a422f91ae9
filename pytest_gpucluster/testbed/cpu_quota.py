"""A real slowdown to apply: a CPU quota on the ranks of a job, through a cgroup.

``with cpu_quota(0.5) as quota:`` makes a cgroup whose processes together get at most half a
CPU (cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2's ``cpu.max`` where a v2
hierarchy has the cpu controller), and ``quota.env`` is the environment that sends ranks into it:
``GPUCLUSTER_RANK_CGROUP=<its path>``. Every rank reads the variable when it starts
(``workloads/_cgroup.py``) and writes its own pid into the cgroup, so the quota applies to ranks
only: never to pytest, the launcher's agents or the shell that set the variable (a shell's pid
in a quota'd cgroup throttles the shell itself, and every command it starts). The cgroup is
removed when the block ends (its leftover processes first moved back to the parent cgroup).

From a shell, the same for one command::

    python -m pytest_gpucluster.testbed.cpu_quota --cpus 0.67 -- pytest acceptance/ --baseline run1/results.json

2 ranks sharing 0.67 CPU run each at a third of a core: a 3x slowdown of CPU-bound work on this
2-core VM. Ranks inside ``ip netns exec`` do not see the host's cgroup filesystem (it remounts
/sys), so this is for local ranks. Needs root. Standard library only; no pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gpucluster.workloads._cgroup import RANK_CGROUP_ENV

__all__ = [
    "RANK_CGROUP_ENV",
    "CpuController",
    "CpuQuota",
    "QuotaUnavailable",
    "cpu_quota",
    "find_cpu_controller",
]

PREFIX = "gpucluster-quota-"
MOUNTS = Path("/proc/self/mounts")


class QuotaUnavailable(RuntimeError):
    """No cgroup hierarchy with the cpu controller can be used here; the message says why."""


@dataclass(frozen=True, slots=True)
class CpuController:
    version: int
    """1 or 2."""
    root: Path
    """Where child cgroups of the cpu controller are made."""


def _mounts(text: str) -> list[tuple[Path, str, set[str]]]:
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            out.append((Path(fields[1]), fields[2], set(fields[3].split(","))))
    return out


def find_cpu_controller(mounts_text: str | None = None) -> CpuController:
    """The v1 ``cpu`` hierarchy, else a v2 hierarchy whose ``cgroup.controllers`` has cpu."""
    text = MOUNTS.read_text(encoding="utf-8") if mounts_text is None else mounts_text
    mounts = _mounts(text)
    for path, kind, options in mounts:
        if kind == "cgroup" and "cpu" in options:
            return CpuController(1, path)
    for path, kind, _ in mounts:
        controllers = path / "cgroup.controllers"
        if kind == "cgroup2" and controllers.is_file() and "cpu" in controllers.read_text().split():
            return CpuController(2, path)
    found = ", ".join(f"{p} ({k})" for p, k, _ in mounts) or "no cgroup filesystem"
    raise QuotaUnavailable(f"no cgroup hierarchy with the cpu controller is mounted ({found})")


def unavailable_reason() -> str | None:
    """Why a CPU quota cannot be made here, or None."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "a CPU quota needs root (it makes a cgroup), and this runs as an ordinary user"
    try:
        find_cpu_controller()
    except (QuotaUnavailable, OSError) as exc:
        return str(exc)
    return None


class CpuQuota:
    """One cgroup whose processes together get at most ``cpus`` CPUs. Build with `cpu_quota`."""

    def __init__(self, controller: CpuController, cpus: float, period_us: int = 100_000) -> None:
        if not cpus > 0:
            raise ValueError(f"a CPU quota is a positive number of CPUs, not {cpus!r}")
        self.controller = controller
        self.cpus = cpus
        self.period_us = period_us
        self.path = controller.root / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"

    @property
    def env(self) -> dict[str, str]:
        """What a job's environment needs for its ranks to join this cgroup."""
        return {RANK_CGROUP_ENV: str(self.path)}

    @property
    def quota_us(self) -> int:
        return max(1000, round(self.cpus * self.period_us))

    def create(self) -> None:
        if self.controller.version == 2:
            _enable_cpu(self.controller.root)
        self.path.mkdir()
        if self.controller.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(f"{self.period_us}\n")
            (self.path / "cpu.cfs_quota_us").write_text(f"{self.quota_us}\n")
        else:
            (self.path / "cpu.max").write_text(f"{self.quota_us} {self.period_us}\n")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def close(self) -> None:
        """Move what is still inside back to the parent cgroup (ranks of a job left running,
        never this process: it never joined), then remove the cgroup."""
        if not self.path.exists():
            return
        parent = self.path.parent / "cgroup.procs"
        for pid in self.pids():
            with contextlib.suppress(OSError):
                parent.write_text(f"{pid}\n")
        with contextlib.suppress(FileNotFoundError):
            self.path.rmdir()

    def __str__(self) -> str:
        return f"{self.cpus:g} CPU(s) for the processes of {self.path} (cgroup v{self.controller.version})"


def _enable_cpu(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu\n")


@contextlib.contextmanager
def cpu_quota(cpus: float, *, period_us: int = 100_000) -> Iterator[CpuQuota]:
    """A cgroup of ``cpus`` CPUs for the block; `QuotaUnavailable` where none can be made."""
    reason = unavailable_reason()
    if reason is not None:
        raise QuotaUnavailable(reason)
    quota = CpuQuota(find_cpu_controller(), cpus, period_us)
    try:
        quota.create()
        yield quota
    finally:
        quota.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_gpucluster.testbed.cpu_quota",
        description="Run a command whose job ranks share a CPU quota (a real slowdown); the command itself, "
        "and every process but the ranks, run unthrottled.",
    )
    parser.add_argument("--cpus", type=float, required=True, help="CPUs the ranks share, e.g. 0.67")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    try:
        with cpu_quota(args.cpus) as quota:
            print(f"cpu_quota: ranks get {quota}", file=sys.stderr, flush=True)
            return subprocess.run(command, env={**os.environ, **quota.env}, check=False).returncode
    except QuotaUnavailable as exc:
        print(f"cpu_quota: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
