"""A node's NVML XID listener that spans the whole session: started by the first counters reading
on the node, read and stopped by the last.

XIDs go to the kernel log, which an ordinary user often cannot read (``workloads/_xid.py``). NVML
delivers the same events to any process that registers for them (``nvmlDeviceRegisterEvents`` with
``nvmlEventTypeXidCriticalError``), no privilege needed — but only while it listens. The health
job's own listener covers its load only; this one covers everything between the first reading
(``acceptance/test_burnin.py::test_counters_before``, run first) and the last
(``test_counters_after``, run last).

The listener is a process of its own (``python -m pytest_gpucluster.workloads.xid_watch DIR``)
because the jobs that start and stop it are different jobs. Its state lives in ``DIR`` on the node:

- ``pid``: its process id; ``ready``: written once every GPU is registered (or ``error`` saying why
  it could not start: no NVML, a GPU that refused registration);
- ``events.jsonl``: one line per XID, ``{"xid", "pci", "time", "source"}``; an Xid 154 adds the GPU's
  recovery action read from NVML as it arrived (``recovery_action``, or ``recovery_action_error``
  saying why it could not be read: `_xid.nvml_event`);
- ``stop``: written by the last reading; the listener exits within a second of seeing it.

Under Slurm a process a job leaves behind does not last: with ``proctrack/cgroup`` (Slurm's
default where cgroups exist) slurmstepd kills everything left in a step's cgroup when the step ends,
so a listener detached inside the first reading's job would die with it. There the controller holds
the listener as a step of its own (``launch/xid_step.py``: ``srun --overlap ... python -m
pytest_gpucluster.workloads.xid_watch DIR --held``): ``--held`` runs it in the foreground of that
step, writing its own ``pid`` and printing one ``xid-watch ready on HOST`` (or ``xid-watch error on
HOST: why``) line for the controller; the first reading only checks it is alive (`held`), the last
collects and stops it as above, which ends the step, and the controller cancels the step at the
session's end if it is still there.

It never outlives its cap (``--max-s``): a session cut short leaves it running at most that long.
It carries a job id of its own (``xid-watch-<folder>``) and the session's tag, so the job that
starts it does not kill it with its own processes, and a later session's ``--gpucluster-reap``
kills it once this session is gone (``launch/leftover_check.py``).

Rank-side: standard library only; pynvml is imported by the listener itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._runtime import JOB_ID_ENV
from pytest_gpucluster.workloads._xid import nvml_event

__all__ = ["HELD_SOURCE", "READY_LINE", "SOURCE", "collect", "held", "listen", "node_folder", "start"]

SOURCE = "NVML XID events (a listener spanning the session)"
HELD_SOURCE = (
    "NVML XID events (a listener spanning the session, held as the controller's srun --overlap step)"
)
READY_LINE = "xid-watch ready on"
"""The line a ``--held`` listener prints once listening (``xid-watch error on`` when it cannot)."""
_READY_WAIT_S = 15.0
_STOP_WAIT_S = 5.0


def node_folder(state_dir: str | Path) -> Path:
    """``state_dir`` on this node: ``{host}`` in it becomes this node's hostname (namespace test
    nodes share one /tmp; a real node's /tmp is its own, and the session's folder names no host)."""
    return Path(str(state_dir).replace("{host}", socket.gethostname()))


def start(state_dir: str | Path, max_s: float, python: str = sys.executable) -> tuple[bool, str]:
    """Start the listener for this node (once: a running one is kept). ``(True, "")`` when it is
    listening, else ``(False, why)``."""
    folder = node_folder(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if _alive(folder):
        return True, ""
    for name in ("ready", "error", "stop", "events.jsonl"):
        (folder / name).unlink(missing_ok=True)
    log = open(folder / "listener.log", "ab")  # noqa: SIM115 (the child keeps it)
    # A job id of its own: the job that starts it kills every process carrying *its* id when it
    # ends, and a later session's --gpucluster-reap finds this one by id and session once ours is gone.
    env = {**os.environ, JOB_ID_ENV: f"xid-watch-{folder.name}"}
    proc = subprocess.Popen(
        [python, "-m", "pytest_gpucluster.workloads.xid_watch", str(folder), "--max-s", str(max_s)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
    )  # fmt: skip
    log.close()
    (folder / "pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + _READY_WAIT_S
    while time.monotonic() < deadline:
        if (folder / "ready").exists():
            return True, ""
        if (folder / "error").exists() or proc.poll() is not None:
            proc.wait(timeout=_STOP_WAIT_S)
            why = (folder / "error").read_text().strip() if (folder / "error").exists() else "it exited"
            return False, f"the NVML XID listener could not start: {why}"
        time.sleep(0.05)
    _stop(folder, proc.pid)
    return False, f"the NVML XID listener did not register its GPUs within {_READY_WAIT_S:g} s"


def held(state_dir: str | Path) -> tuple[bool, str]:
    """Whether the listener the controller holds as a step (``--held``) is listening on this node."""
    folder = node_folder(state_dir)
    if _alive(folder):
        return True, ""
    said = (folder / "error").read_text().strip() if (folder / "error").exists() else ""
    return False, (
        f"the NVML XID listener the controller started as a step is not listening here ({said})"
        if said
        else "the NVML XID listener the controller started as a step is not running on this node"
    )


def collect(state_dir: str | Path) -> tuple[list[dict[str, Any]] | None, str]:
    """Stop the listener and return every XID it saw, or ``(None, why)`` when none listened for
    the whole session (never started on this node, or it died)."""
    folder = node_folder(state_dir)
    if not (folder / "pid").exists():
        return (
            None,
            "no NVML XID listener was started on this node (the first counters reading did not run here)",
        )
    alive = _alive(folder)
    pid = int((folder / "pid").read_text().strip() or 0)
    if alive:
        _stop(folder, pid)
    events = [
        json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.strip()
    ] if (folder / "events.jsonl").exists() else []  # fmt: skip
    for name in ("pid", "ready"):
        (folder / name).unlink(missing_ok=True)
    if not alive:
        return None, "the NVML XID listener was not running at the last reading: it did not span the session"
    return events, ""


def _alive(folder: Path) -> bool:
    try:
        pid = int((folder / "pid").read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return (folder / "ready").exists() and not (folder / "stop").exists()


def _stop(folder: Path, pid: int) -> None:
    (folder / "stop").write_text("stop\n")
    deadline = time.monotonic() + _STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        _reap(pid)
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def _reap(pid: int) -> None:
    """Collect the listener's exit status where this process started it (no zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def listen(state_dir: Path, max_s: float, pynvml: Any, on_ready: Any = None) -> int:
    """The listener's loop: register every GPU, append each XID to ``events.jsonl`` until ``stop``
    appears or ``max_s`` passes."""
    try:
        pynvml.nvmlInit()
        event_set = pynvml.nvmlEventSetCreate()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            gpus.append(handle)
    except Exception as exc:
        (state_dir / "error").write_text(f"{type(exc).__name__}: {exc}\n")
        return 1
    wait = getattr(pynvml, "nvmlEventSetWait_v2", None) or pynvml.nvmlEventSetWait
    end = time.monotonic() + max_s
    with open(state_dir / "events.jsonl", "a", encoding="utf-8") as out:
        (state_dir / "ready").write_text(f"{len(gpus)} GPU(s)\n")  # the events file exists from here on
        if on_ready is not None:
            on_ready(len(gpus))
        while time.monotonic() < end and not (state_dir / "stop").exists():
            try:
                data = wait(event_set, 500)
            except Exception as exc:  # NVMLError_Timeout: nothing in the last 500 ms
                if "Timeout" in type(exc).__name__:
                    continue
                (state_dir / "error").write_text(f"{type(exc).__name__}: {exc}\n")
                return 1
            pci = None
            try:
                pci = pynvml.nvmlDeviceGetPciInfo(data.device).busId
                pci = pci.decode() if isinstance(pci, bytes) else str(pci)
            except Exception:  # the event still counts without its address
                pass
            line = {**nvml_event(pynvml, data), "pci": pci, "time": time.time()}
            out.write(json.dumps(line) + "\n")
            out.flush()
    pynvml.nvmlEventSetFree(event_set)
    return 0


def _held_start(folder: Path) -> None:
    """``--held``: this process is the listener (a step's task); clear a previous run's files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("ready", "error", "stop", "events.jsonl"):
        (folder / name).unlink(missing_ok=True)
    (folder / "pid").write_text(f"{os.getpid()}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--max-s", type=float, required=True)
    parser.add_argument("--held", action="store_true", help="run as a step's task, in the foreground")
    args = parser.parse_args(argv)
    host = socket.gethostname()
    args.state_dir = node_folder(args.state_dir)
    if args.held:
        _held_start(args.state_dir)

    def ready(gpus: int) -> None:
        if args.held:
            print(f"{READY_LINE} {host}: {gpus} GPU(s)", flush=True)

    try:
        import pynvml
    except ImportError as exc:
        (args.state_dir / "error").write_text(f"pynvml is not importable ({exc}); pip install nvidia-ml-py\n")
        code = 1
    else:
        code = listen(args.state_dir, args.max_s, pynvml, on_ready=ready)
    if args.held and code and (args.state_dir / "error").exists():
        print(f"xid-watch error on {host}: {(args.state_dir / 'error').read_text().strip()}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
