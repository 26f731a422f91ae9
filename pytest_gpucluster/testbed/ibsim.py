"""A simulated InfiniBand fabric that the real diagnostics scan: ibsim + opensm (FEASIBILITY §9).

``with IbSim(topology_text, workdir) as sim:`` writes the topology (``ibnetdiscover`` format, e.g.
from :mod:`.ib_topology`), starts ``ibsim -s`` with its console on a fifo this object holds open
(a console that reads EOF spins a core), brings every port Active with one ``opensm -o`` sweep,
then keeps ``opensm`` running so ``sminfo`` finds a master. Any libibumad program runs against the
fabric under :attr:`IbSim.prefix` (``env IBSIM_SOCKNAME=<this sim> ibsim-run``): each simulator has
its own socket name, so simulators side by side (pytest-xdist) never answer each other's tools.

Faults go in through the console while tools run: :meth:`IbSim.set_counter` (``PerformanceSet``),
:meth:`IbSim.unlink` / :meth:`IbSim.relink`. :meth:`IbSim.close` (the context manager's exit, in a
``finally``) stops opensm and ibsim by their pids, never by name; :func:`missing_tools` says what is
not installed, for a test to skip with.

Standard library only; importable by tests and benchmarks alike. No pytest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["PRELOAD", "TOOLS", "IbSim", "IbSimError", "missing_tools"]

PRELOAD = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
TOOLS = (
    "ibsim",
    "ibsim-run",
    "opensm",
    "ibnetdiscover",
    "iblinkinfo",
    "ibqueryerrors",
    "perfquery",
    "sminfo",
)
_PACKAGES = {"ibsim": "ibsim-utils", "ibsim-run": "ibsim-utils", "opensm": "opensm"}


_DEFAULTS = {"-N": 2048, "-S": 256, "-P": 13312}
"""ibsim's built-in limits (nodes, switches, ports); a bigger fabric must raise them or ibsim refuses it."""


def _capacity(topology: str) -> list[str]:
    """``-N/-S/-P`` options that fit the topology (ibsim 0.10 stops at 2048 nodes, 256 switches)."""
    headers = re.findall(r'^\s*(Switch|Hca|Ca|Rt)\s+(\d+)\s+"', topology, flags=re.MULTILINE)
    need = {
        "-N": len(headers) + 16,
        "-S": sum(kind == "Switch" for kind, _ in headers) + 8,
        "-P": sum(int(ports) + 1 for _, ports in headers) + 64,
    }
    out: list[str] = []
    for flag, value in need.items():
        if value > _DEFAULTS[flag]:
            out += [flag, str(value)]
    return out


class IbSimError(RuntimeError):
    """The simulator could not start, or a console command was not taken."""


def missing_tools() -> list[str]:
    """Each tool (with its Debian package) not on PATH: empty when a simulated fabric can run here."""
    out = []
    for tool in TOOLS:
        if shutil.which(tool) is None:
            out.append(f"{tool} (Debian package {_PACKAGES.get(tool, 'infiniband-diags')})")
    return out


class IbSim:
    """One running simulated fabric; see the module docstring."""

    def __init__(
        self, topology: str, workdir: Path, *, sm: bool = True, start_timeout_s: float = 60.0
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.net = self.workdir / "net"
        self.net.write_text(topology)
        self.sockname = f"gpc-ibsim-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "IBSIM_SOCKNAME": self.sockname, "OSM_CACHE_DIR": str(self.workdir)}
        self._sm = sm
        self._start_timeout_s = start_timeout_s
        self._ibsim: subprocess.Popen[bytes] | None = None
        self._opensm: subprocess.Popen[bytes] | None = None
        self._console: int | None = None
        self._fifo = self.workdir / "console"
        self.log = self.workdir / "ibsim.log"

    @property
    def prefix(self) -> list[str]:
        """The argv prefix that runs a libibumad tool against this fabric."""
        return ["env", f"IBSIM_SOCKNAME={self.sockname}", "ibsim-run"]

    def __enter__(self) -> IbSim:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        missing = missing_tools()
        if missing:
            raise IbSimError(f"cannot simulate a fabric: not installed: {', '.join(missing)}")
        if self._fifo.exists():
            self._fifo.unlink()
        os.mkfifo(self._fifo)
        # Read-write: the fifo never reaches EOF while we hold it, so ibsim's console idles.
        self._console = os.open(self._fifo, os.O_RDWR)
        with open(self.log, "wb") as log:
            self._ibsim = subprocess.Popen(
                ["ibsim", "-s", *_capacity(self.net.read_text()), str(self.net)], stdin=self._console, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self._start_timeout_s
        while "sim>" not in self._log_text():
            if self._ibsim.poll() is not None:
                raise IbSimError(f"ibsim exited with {self._ibsim.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise IbSimError(f"ibsim did not start in {self._start_timeout_s:.0f} s: {self._log_tail()}")
            time.sleep(0.05)
        self.sweep()
        if self._sm:
            self._start_opensm(deadline)

    def sweep(self) -> None:
        """One opensm sweep (``opensm -o``): links come up Active, LIDs are assigned."""
        done = self.run(
            ["opensm", "-o", "-f", str(self.workdir / "opensm-once.log")], timeout=self._start_timeout_s
        )
        if done.returncode != 0:
            raise IbSimError(f"opensm -o failed ({done.returncode}): {done.stdout[-500:]}")

    def _start_opensm(self, deadline: float) -> None:
        with open(self.workdir / "opensm.out", "wb") as out:
            self._opensm = subprocess.Popen(
                [*self.prefix, "opensm", "-f", str(self.workdir / "opensm.log")],
                stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
            )  # fmt: skip
        while self.run(["sminfo"], timeout=10).returncode != 0:
            if self._opensm.poll() is not None or time.monotonic() > deadline:
                raise IbSimError(
                    "opensm did not become master: " + (self.workdir / "opensm.out").read_text()[-500:]
                )
            time.sleep(0.2)

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run one tool against the fabric; stdout and stderr together."""
        return subprocess.run(
            [*self.prefix, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=self.env, timeout=timeout, check=False,
        )  # fmt: skip

    def console(self, command: str, settle_s: float = 0.3) -> None:
        """Send one console command (``PerformanceSet ...``, ``Unlink ...``) and wait until it is read."""
        if self._console is None or self._ibsim is None or self._ibsim.poll() is not None:
            raise IbSimError("ibsim is not running")
        if "\n" in command:
            raise IbSimError(f"one console command per call: {command!r}")
        prompts = self._log_text().count("sim>")
        os.write(self._console, (command + "\n").encode())
        deadline = time.monotonic() + 10
        while self._log_text().count("sim>") <= prompts:
            if time.monotonic() > deadline:
                raise IbSimError(f"ibsim did not answer {command!r}: {self._log_tail()}")
            time.sleep(0.02)
        time.sleep(settle_s)

    def set_counter(self, node: str, port: int, counter: str, value: int) -> None:
        """Set one PortCounters field of ``node``'s ``port`` (perfquery's name: SymbolErrorCounter)."""
        self.console(f'PerformanceSet "{node}"[{port}] PortCounters.{counter}={value}')

    def unlink(self, node: str, port: int) -> None:
        """Pull the cable at ``node``'s ``port`` (both ends go Down)."""
        self.console(f'Unlink "{node}"[{port}]')

    def relink(self, node: str, port: int) -> None:
        self.console(f'ReLink "{node}"[{port}]')

    def close(self) -> None:
        """Stop opensm and ibsim by pid (TERM, then KILL), close the console fifo."""
        for proc in (self._opensm, self._ibsim):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._opensm = self._ibsim = None
        if self._console is not None:
            os.close(self._console)
            self._console = None
        if self._fifo.exists():
            self._fifo.unlink()

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self) -> str:
        return self._log_text()[-500:].strip() or "(no output)"
