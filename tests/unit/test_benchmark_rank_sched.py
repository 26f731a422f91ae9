"""The benchmarks' quiet condition (``benchmarks/rank_sched``): what a rank process gets, what
every other process is spared, and that nothing outlives the benchmark.

Real processes, real scheduler calls; pinning and SCHED_FIFO need root (or CAP_SYS_NICE), so
those tests skip elsewhere and say so.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RANK_SCHED = BENCHMARKS / "rank_sched"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
sides = importlib.import_module("sides")

REPORT = "import os; print(sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0))"


def _started_as(local_rank: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    env["PYTHONPATH"] = str(RANK_SCHED)
    if local_rank is not None:
        env["LOCAL_RANK"] = local_rank
    return subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True, text=True, timeout=60)


def _can_set_fifo() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


needs_rt = pytest.mark.skipif(
    not _can_set_fifo(), reason="SCHED_FIFO needs root or CAP_SYS_NICE, which this user lacks"
)


def test_a_process_that_is_not_a_rank_is_left_as_it_is() -> None:
    done = _started_as(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[1].strip() == str(os.SCHED_OTHER)
    assert done.stdout.startswith(str(sorted(os.sched_getaffinity(0))))


@needs_rt
def test_a_rank_is_pinned_to_its_core_and_runs_sched_fifo() -> None:
    cores = sorted(os.sched_getaffinity(0))
    done = _started_as("1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{cores[1 % len(cores)]}] {os.SCHED_FIFO}"


@needs_rt
def test_the_context_puts_ranks_in_order_and_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    with sides.rank_sched("quiet") as line:
        assert "SCHED_FIFO" in line
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(RANK_SCHED), "/somewhere/else"]
        spinners = _keep_awake_pids(expected=len(os.sched_getaffinity(0)))
        assert len(spinners) == len(os.sched_getaffinity(0))
    assert os.environ["PYTHONPATH"] == "/somewhere/else"
    assert not [p for p in spinners if _alive(p)]


def test_none_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with sides.rank_sched("none") as line:
        assert "--rank-sched none" in line
        assert "PYTHONPATH" not in os.environ
    with pytest.raises(SystemExit, match="choose from quiet, none"), sides.rank_sched("turbo"):
        pass


def test_a_spinner_leaves_when_its_parent_is_gone() -> None:
    """The benchmark kills its spinners; should it die first (SIGKILL), they go by themselves."""
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys; p = subprocess.Popen([sys.executable, sys.argv[1], '0', str(os.getpid())]);"
            " print(p.pid, flush=True); os._exit(0)",
            str(RANK_SCHED / "keep_awake.py"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    spinner = int(parent.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(spinner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(spinner), f"keep_awake.py (pid {spinner}) outlived its parent"


def _keep_awake_pids(expected: int, wait_s: float = 20.0) -> list[int]:
    """The spinners of this process, once ``expected`` of them show in /proc (a child shows its own
    argv only once it has exec'd Python: right after Popen it may still carry the parent's)."""
    deadline = time.monotonic() + wait_s
    while len(pids := _keep_awake_pids_now()) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _keep_awake_pids_now() -> list[int]:
    me = str(os.getpid())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"keep_awake.py") for a in argv) and argv[-2:-1] == [me.encode()]:
            pids.append(int(entry.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
