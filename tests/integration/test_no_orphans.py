"""No process of a job outlives the pytest that started it: kill real pytests, read /proc.

Each test runs a pytest of its own (`spawn_pytest`) whose test launches a real 2-rank job on
this machine in which rank 1 hangs, then kills that pytest and watches the process table
(`job_pids` reads /proc itself, not through the code under test):

- ``kill -9``: nothing of the pytest runs any more, so the guard around the agent
  (`launch.guard`, watching the pytest's pid) must end the job: within 15 s nothing is left;
  the same for a job on two network-namespace nodes reached through a remote-exec template,
  where each node's guard watches its stdin (as through ssh) and nothing else ends the job;
- SIGTERM: the same, through the plugin's Ctrl-C path, and results.json keeps the measurement
  the test took before the signal, and the fixtures are torn down;
- a session killed so hard that its guard died too leaves a helper process behind; the next
  session's header reports it, and ``--gpucluster-reap`` removes it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import time

import pytest
from netns_bed import netns_bed_or_skip
from proc_table import job_pids, wait_until_gone

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

GONE_WITHIN_S = 15.0

HANGING_JOB = """
def test_rank_1_hangs(cluster):
    cluster.run("pytest_gpucluster.workloads.basic:hang_on_rank", options={"rank": 1}, timeout=300)
"""

MEASURE_THEN_HANG = """
import os
from pathlib import Path

import pytest


@pytest.fixture
def torn_down():
    yield
    Path(os.environ["TEARDOWN_MARKER"]).write_text("torn down")


def test_measure_then_hang(cluster, results, torn_down):
    results.record("before_sigterm", 42.0, unit="s")
    cluster.run("pytest_gpucluster.workloads.basic:hang_on_rank", options={"rank": 1}, timeout=300)
"""

LEAVE_A_HELPER = """
def test_rank_1_leaves_a_helper(cluster):
    cluster.run("pytest_gpucluster.workloads.basic:hang_leaving_a_helper", options={"rank": 1}, timeout=300)
"""

NEXT_SESSION = """
def test_a_later_session(results):
    results.record("later", 1.0, unit="s")
"""


def test_kill_9_of_pytest_leaves_no_process_of_its_job(spawn_pytest):
    run = spawn_pytest(HANGING_JOB, "--hw=cpu-local")
    job = run.wait_for_hung_rank()
    assert len(job_pids(job.name)) >= 3  # the guard, the agent and the ranks
    os.kill(run.pid, signal.SIGKILL)
    start = time.monotonic()
    left = wait_until_gone(job.name, GONE_WITHIN_S)
    assert left == [], f"still alive {GONE_WITHIN_S:g} s after kill -9 of pytest: {left}"
    print(f"job {job.name}: nothing left {time.monotonic() - start:.1f} s after kill -9")
    agent_log = (job / "agent-localhost.log").read_text()
    assert f"pytest (pid {run.pid}) that owns the job has exited; stopping job {job.name}" in agent_log
    assert "in hang_on_rank" in (job / "rank-1.log").read_text()  # the guard had its stack dumped


def test_sigterm_of_pytest_stops_the_job_and_keeps_the_results(spawn_pytest, tmp_path):
    marker = tmp_path / "teardown-ran"
    run = spawn_pytest(MEASURE_THEN_HANG, "--hw=cpu-local", env={"TEARDOWN_MARKER": str(marker)})
    job = run.wait_for_hung_rank()
    os.kill(run.pid, signal.SIGTERM)
    left = wait_until_gone(job.name, GONE_WITHIN_S)
    assert left == [], f"still alive {GONE_WITHIN_S:g} s after SIGTERM of pytest: {left}"
    assert run.wait(GONE_WITHIN_S) == pytest.ExitCode.INTERRUPTED, run.output()
    output = run.output()
    assert "SIGTERM received: stopping as on Ctrl-C" in output
    assert marker.read_text() == "torn down"
    results = json.loads((run.results / "results.json").read_text())
    assert [(m["metric"], m["value"]) for m in results["measurements"]] == [("before_sigterm", 42.0)]
    assert "in hang_on_rank" in (job / "rank-1.log").read_text()


def test_a_leftover_of_a_killed_session_is_reported_then_reaped(spawn_pytest, tmp_path):
    crashed = spawn_pytest(LEAVE_A_HELPER, "--hw=cpu-local", name="crashed")
    job = crashed.wait_for_hung_rank(workload="hang_leaving_a_helper")
    guards = [pid for pid in job_pids(job.name) if b"pytest_gpucluster.launch.guard" in _cmdline(pid)]
    assert len(guards) == 1, [_cmdline(pid) for pid in job_pids(job.name)]
    # As hard as an OOM killer or a cgroup kill: the guard dies with its pytest.
    os.kill(guards[0], signal.SIGKILL)
    os.kill(crashed.pid, signal.SIGKILL)
    crashed.wait(10)
    # The agent and the ranks die with their parents; the helper rank 1 started does not.
    end = time.monotonic() + GONE_WITHIN_S
    while len(job_pids(job.name)) > 1 and time.monotonic() < end:
        time.sleep(0.1)
    [helper] = job_pids(job.name)
    assert b"time.sleep(600)" in _cmdline(helper)

    # A DeepSpeed segment nobody maps any more, in a /dev/shm of this test's own.
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = shm / "deepspeed_allreduce_buffer_0_127.0.0.1_29999_0"
    stale.write_bytes(b"\0" * 4096)

    later = spawn_pytest(NEXT_SESSION, "--hw=cpu-local", name="later", shm=shm)
    assert later.wait(60) == 0, later.output()
    host = socket.gethostname()
    owner = f"a session that is gone (pytest pid {crashed.pid} on {host})"
    reported = f"gpucluster: LEFTOVER on {host}: job {job.name} of {owner}: 1 process(es) (pids {helper};"
    assert reported in later.output()
    assert "--gpucluster-reap kills them" in later.output()
    [found] = [j for j in json.loads((later.results / "results.json").read_text())["leftovers"]["jobs"]
               if j["job_id"] == job.name]  # fmt: skip
    assert (found["owner"], found["pids"], found["action"]) == ("dead", [helper], "reported")
    assert job_pids(job.name) == [helper]  # reported, not touched
    assert f"LEFTOVER on {host}: /dev/shm/{stale.name} (0 MiB), mapped by no process;" in later.output()
    assert stale.exists()

    reaping = spawn_pytest(NEXT_SESSION, "--hw=cpu-local", "--gpucluster-reap", name="reaping", shm=shm)
    assert reaping.wait(60) == 0, reaping.output()
    assert f"LEFTOVER on {host}: job {job.name} of {owner}: 1 process(es) (pids {helper};" in reaping.output()
    assert wait_until_gone(job.name, 1.0) == []
    [reaped] = [j for j in json.loads((reaping.results / "results.json").read_text())["leftovers"]["jobs"]
                if j["job_id"] == job.name]  # fmt: skip
    assert reaped["action"] == "killed"
    assert not stale.exists()
    assert (
        f"LEFTOVER on {host}: /dev/shm/{stale.name} (0 MiB), mapped by no process; removed"
        in reaping.output()
    )


def test_kill_9_of_pytest_leaves_no_process_on_remote_nodes(spawn_pytest, tmp_path):
    with netns_bed_or_skip(2) as bed:
        hostfile = tmp_path / "hosts"
        hostfile.write_text(bed.hostfile_text(slots=1))
        # A template, not the "netns" preset: the launch takes the nodes for truly remote ones,
        # whose processes it cannot see, so nothing on this side is meant to end them.
        template = shlex.join(bed.remote_exec_template)
        run = spawn_pytest(
            HANGING_JOB, "--hw=cpu-local", f"--hostfile={hostfile}", "--nproc-per-node=1",
            f"--remote-exec={template}",
        )  # fmt: skip
        job = run.wait_for_hung_rank()
        os.kill(run.pid, signal.SIGKILL)
        left = wait_until_gone(job.name, GONE_WITHIN_S)
        assert left == [], f"still alive {GONE_WITHIN_S:g} s after kill -9 of pytest: {left}"
        # Each node's own guard saw its stdin close and stopped the job there.
        for node in bed.names:
            log = (job / f"agent-{node}.log").read_text()
            said = f"gpucluster guard on {node}: stdin closed: the pytest that owns the job, or the connection to it, is gone; stopping job {job.name}"
            assert said in log, log
        assert "in hang_on_rank" in (job / "rank-1.log").read_text()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ")
    except OSError:
        return b""
