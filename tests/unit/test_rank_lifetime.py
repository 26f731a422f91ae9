"""A rank's own limits, with real processes: it dies with its parent (PR_SET_PDEATHSIG), and past the
job's hard deadline it dumps its stack into its log and exits, with nobody left to kill it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from pytest_gpucluster.workloads._parent_death import die_with_parent

# A "parent" that starts a child which asks to die with it; prints the child's pid, then sleeps.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
from pytest_gpucluster.workloads._parent_death import die_with_parent
why = die_with_parent(signal.SIGKILL, expected_parent=os.getppid())
print("armed" if why is None else why, flush=True)
time.sleep(300)
'''], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_process_that_asked_to_die_with_its_parent_does():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "armed"
        assert _alive(child)
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while _alive(child) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its parent"
    finally:
        parent.kill()


def test_die_with_parent_reports_instead_of_raising_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert die_with_parent() == "PR_SET_PDEATHSIG is Linux-only (this is darwin)"


def test_a_hung_rank_ends_itself_at_the_hard_deadline_with_its_stack_in_its_log(tmp_path):
    job = {
        "job_id": "deadline",
        "workload": "pytest_gpucluster.workloads.basic:hang_on_rank",
        "options": {"rank": 0},
        "backend": "gloo",
        "timeout_s": 1.0,
        "hard_deadline_s": 2.0,
        "env": {},
        "init_process_group": False,
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    start = time.monotonic()
    # Nobody sends it anything: it ends by itself.
    done = subprocess.run(
        [sys.executable, "-m", "pytest_gpucluster.workloads._worker", str(tmp_path)], timeout=60, check=False
    )
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert 2.0 <= elapsed < 30, elapsed
    log = (tmp_path / "rank-0.log").read_text()
    assert "this rank ends itself at" in log and "(2 s from now)" in log
    assert "Timeout (0:00:02)!" in log  # faulthandler's dump, from its own C thread
    assert "in hang_on_rank" in log
    assert json.loads((tmp_path / "rank-0.json").read_text())["status"] == "running"  # it never finished
