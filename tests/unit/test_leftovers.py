"""Leftovers: session tags, the judgement (pure, on hand-built scans), the node-side scan and reap on
real processes and a private shm directory, and the remote path through a stand-in prefix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from pytest_gpucluster.launch import leftovers
from pytest_gpucluster.launch.base import RemoteExec
from pytest_gpucluster.launch.leftover_check import check_leftovers, judge, scan_nodes
from pytest_gpucluster.launch.leftovers import JobProcess, NodeScan, SessionTag, ShmSegment

HOST = socket.gethostname()
ME = str(SessionTag.of_process())
DEAD = f"{HOST}:4000000:7"
"""No process has pid 4000000 (above PID_MAX_LIMIT): a session that is gone."""

# Runs the remote command here: the prefix passes the host name as $0 and runs the rest.
LOCAL_PREFIX = RemoteExec(("sh", "-c", 'exec "$@"', "{host}"))


def owner_state(tag: SessionTag) -> str:
    return tag.state_here()


# --------------------------------------------------------------------------- session tags


def test_a_session_tag_names_a_live_process_and_tells_it_from_a_dead_one():
    tag = SessionTag.parse(ME)
    assert tag is not None and str(tag) == ME and tag.pid == os.getpid() and tag.host == HOST
    assert tag.state_here() == "alive"
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = SessionTag.of_process(finished.pid)
    finished.wait()
    assert gone.state_here() == "dead"
    assert SessionTag(host=HOST, pid=os.getpid(), start=tag.start + 1).state_here() == "dead"  # a reused pid
    assert SessionTag(host="login-2", pid=os.getpid(), start=tag.start).state_here() == "unknown"
    assert SessionTag.parse("host.with:colons:12:34") == SessionTag("host.with:colons", 12, 34)
    for junk in (None, "", "vm", "vm:12", "vm:x:3", ":1:2"):
        assert SessionTag.parse(junk) is None


def wait_until_zombie(pid: int, seconds: float = 30.0) -> bool:
    """Whether ``/proc/<pid>/stat`` says Z (exited, not reaped) within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rpartition(")")[2].split()[0] == "Z":
                return True
        time.sleep(0.02)
    return False


def test_a_killed_but_unreaped_process_counts_as_dead():
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tag = SessionTag.of_process(zombie.pid)
    zombie.kill()
    # not waited for: a zombie, as a killed pytest is until its shell reaps it (a loaded machine may
    # take a while to run the kill, so wait for the kernel's word rather than a fixed time)
    assert wait_until_zombie(zombie.pid), f"pid {zombie.pid} did not become a zombie within 30 s"
    try:
        assert tag.state_here() == "dead"
    finally:
        zombie.wait()


# --------------------------------------------------------------------------- judging


def proc(pid: int, job: str, session: str | None) -> JobProcess:
    return JobProcess(pid=pid, job_id=job, session=session, command=f"python -m x {pid}")


def test_judge_sorts_jobs_by_owner_and_leaves_this_sessions_own_out():
    scan = NodeScan(
        host="vm",
        boot_id="b1",
        processes=(
            proc(11, "old", DEAD), proc(12, "old", DEAD), proc(20, "mine", ME),
            proc(30, "live", ME.replace(f":{os.getpid()}:", ":1:")), proc(40, "untagged", None),
            proc(50, "elsewhere", "login-2:77:5"),
        ),
    )  # fmt: skip
    states = {DEAD: "dead", ME.replace(f":{os.getpid()}:", ":1:"): "alive", "login-2:77:5": "unknown"}
    report = judge([scan], ME, lambda tag: states[str(tag)])
    by_job = {job.job_id: job for job in report.jobs}
    assert sorted(by_job) == ["elsewhere", "live", "old", "untagged"]
    assert (by_job["old"].owner, by_job["old"].pids, by_job["old"].is_leftover) == ("dead", (11, 12), True)
    assert by_job["live"].owner == "alive" and by_job["untagged"].owner == "unknown"
    assert [job.job_id for job in report.leftovers] == ["old"]
    lines = report.lines()
    assert lines[0] == (
        f"LEFTOVER on vm: job old of a session that is gone (pytest pid 4000000 on {HOST}): 2 process(es) "
        "(pids 11, 12; python -m x 11); --gpucluster-reap kills them"
    )
    assert any(
        line.startswith(
            "WARNING on vm: job elsewhere of a session on another machine (pytest pid 77 on login-2)"
        )
        for line in lines
    )
    assert any(
        line.startswith("WARNING on vm: job untagged (no session tag: started by hand") for line in lines
    )
    assert any("job live of another running session (pytest pid 1 on" in line for line in lines)


def test_nodes_sharing_a_kernel_report_a_process_once_and_only_unmapped_segments_are_stale():
    shared = (proc(11, "old", DEAD),)
    segments = (
        ShmSegment("/dev/shm/deepspeed_a", 66 * 2**20, ()),
        ShmSegment("/dev/shm/deepspeed_b", 66 * 2**20, (123,)),
    )
    scans = [
        NodeScan(host="vm", boot_id="b1", processes=shared, shm=segments),
        NodeScan(host="ns-node1", boot_id="b1", processes=shared, shm=segments),  # the same kernel
        NodeScan(host="node2", boot_id="b2", processes=(proc(11, "old", DEAD),)),  # another machine
        NodeScan(host="node3", error="exit code 255: ssh: connect to host node3 port 22: No route to host"),
    ]
    report = judge(scans, ME, lambda tag: "dead")
    assert [(job.host, job.pids) for job in report.jobs] == [("vm", (11,)), ("node2", (11,))]
    assert [(s.host, s.path) for s in report.segments] == [("vm", "/dev/shm/deepspeed_a")]
    assert report.unchecked == (
        ("node3", "exit code 255: ssh: connect to host node3 port 22: No route to host"),
    )
    assert (
        "LEFTOVER on vm: /dev/shm/deepspeed_a (66 MiB), mapped by no process; --gpucluster-reap removes it"
        in report.lines()
    )
    assert report.lines()[-1] == (
        "WARNING: could not look for leftovers on node3: exit code 255: ssh: connect to host node3 port 22: No route to host"
    )
    data = report.to_json()
    assert data["jobs"][0]["owner"] == "dead" and data["shm_segments"][0]["action"] == "reported"
    assert json.loads(json.dumps(data)) == data


def test_a_long_report_is_cut_in_the_header_but_not_in_results_json():
    scan = NodeScan(host="vm", processes=tuple(proc(100 + i, f"job{i}", DEAD) for i in range(30)))
    report = judge([scan], ME, lambda tag: "dead")
    assert len(report.lines()) == 12 and report.lines()[-1] == "... and 19 more (all in results.json)"
    assert len(report.to_json()["jobs"]) == 30


# --------------------------------------------------------------------------- scanning and reaping for real


@pytest.fixture
def leftover(tmp_path):
    """A process carrying a job id of a session that is gone, and a stale DeepSpeed segment."""
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "GPUCLUSTER_JOB_ID": job_id, "GPUCLUSTER_SESSION": DEAD}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "deepspeed_allreduce_buffer_0_127.0.0.1_29511_0").write_bytes(b"\0" * 1024)
    (shm / "not_deepspeed").write_bytes(b"keep")
    end = time.monotonic() + 10
    while job_id not in {p.job_id for p in leftovers.job_processes()} and time.monotonic() < end:
        time.sleep(0.05)
    yield job_id, child, shm
    child.kill()
    child.wait()


def test_the_node_scan_finds_the_process_and_the_segment(leftover):
    job_id, child, shm = leftover
    scan = leftovers.scan_node(shm=str(shm))
    [found] = [p for p in scan.processes if p.job_id == job_id]
    assert (found.pid, found.session) == (child.pid, DEAD) and "time.sleep(120)" in found.command
    assert [(s.path, s.size_bytes, s.mapped_by) for s in scan.shm] == [
        (str(shm / "deepspeed_allreduce_buffer_0_127.0.0.1_29511_0"), 1024, ())
    ]
    assert scan.boot_id
    assert NodeScan.from_json(json.loads(json.dumps(scan.to_json()))) == scan


def test_reap_kills_by_job_id_and_removes_only_deepspeed_segments(leftover):
    job_id, child, shm = leftover
    done = leftovers.reap(
        [job_id],
        ["deepspeed_allreduce_buffer_0_127.0.0.1_29511_0", "not_deepspeed", "/etc/passwd"],
        shm=str(shm),
    )
    assert child.wait(timeout=10) < 0
    assert done["survivors"] == {} and done["removed"] == [
        str(shm / "deepspeed_allreduce_buffer_0_127.0.0.1_29511_0")
    ]
    assert set(done["not_removed"]) == {"not_deepspeed", "/etc/passwd"}
    assert (shm / "not_deepspeed").read_bytes() == b"keep"


def test_the_remote_path_lists_and_reaps_through_the_prefix(leftover):
    job_id, child, _shm = leftover
    scans = scan_nodes([("far-node", None), ("localhost", None)], LOCAL_PREFIX, sys.executable)
    assert [s.host for s in scans] == [HOST, "far-node"]  # localhost is this machine: scanned once
    assert job_id in {p.job_id for p in scans[1].processes} and scans[1].boot_id == scans[0].boot_id
    report = check_leftovers([("far-node", None)], LOCAL_PREFIX, sys.executable, ME, kill=True)
    [job] = [j for j in report.jobs if j.job_id == job_id]
    assert (job.host, job.owner, job.action) == (HOST, "dead", "killed")
    assert child.wait(timeout=10) < 0


def test_an_unreachable_node_is_named_with_its_reason():
    broken = RemoteExec(("sh", "-c", 'echo "ssh: Could not resolve hostname $0" >&2; exit 255', "{host}"))
    scans = scan_nodes([("ghost", None)], broken, sys.executable)
    assert scans[1] == NodeScan(host="ghost", error="exit code 255: ssh: Could not resolve hostname ghost")
    assert scan_nodes([("ghost", None)], None, sys.executable)[1].error == "no remote-exec prefix to reach it"


def test_the_cli_prints_json_and_refuses_bad_usage(capsys):
    assert leftovers.main(["--list"]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == HOST
    assert leftovers.main([]) == 2 and "usage:" in capsys.readouterr().err
    assert leftovers.main(["--reap"]) == 2
