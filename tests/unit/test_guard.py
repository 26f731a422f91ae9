"""launch.guard with plain Python stand-ins (no torch): a "controller" that starts the guard and is
then killed, an "agent" that leaves a grandchild in a session of its own (as torchrun does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand, RemoteExec
from pytest_gpucluster.launch.guard import GUARD_MODULE, ORPHANED_EXIT, guard_argv, parse_args
from pytest_gpucluster.launch.job import guarded
from pytest_gpucluster.launch.process import HELLO
from pytest_gpucluster.launch.torchrun import TorchrunLauncher

# Writes its own pid and its grandchild's to argv[1], then sleeps.
AGENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

# Starts the guard as its child (argv[1:], CONTROLLER_PID replaced by its own pid), then sleeps.
CONTROLLER = """
import os, subprocess, sys, time
argv = [a.replace("CONTROLLER_PID", str(os.getpid())) for a in sys.argv[1:]]
subprocess.Popen(argv, start_new_session=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def wait_for(predicate, seconds: float = 15.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def job_env(job_id: str) -> dict[str, str]:
    return {**os.environ, "GPUCLUSTER_JOB_ID": job_id}


def agent_pids(path: Path) -> list[int]:
    assert wait_for(path.exists), "the agent never started"
    return [int(p) for p in path.read_text().split()]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- argv


def test_guard_argv_round_trips_through_parse_args():
    argv = guard_argv("/py", "job-1", watch_pid=42, on_orphan=[["/py", "-m", "x", "--cancel", "job 1"]])
    assert argv[:3] == ["/py", "-m", GUARD_MODULE] and argv[-1] == "--"
    args = parse_args([*argv[3:], "torchrun", "--nnodes=1"])
    assert (args.job_id, args.watch_pid, args.command) == ("job-1", 42, ("torchrun", "--nnodes=1"))
    assert args.on_orphan == (("/py", "-m", "x", "--cancel", "job 1"),)
    remote = parse_args([*guard_argv("/py", "j")[3:], "a"])
    assert remote.watch_pid is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--job-id=j", "--watch-stdin"], "no '--'"),
        (["--job-id=j", "--watch-stdin", "--"], "no agent command"),
        (["--watch-stdin", "--", "a"], "--job-id=ID is required"),
        (["--job-id=j", "--", "a"], "exactly one of"),
        (["--job-id=j", "--watch-pid=1", "--watch-stdin", "--", "a"], "exactly one of"),
        (["--job-id=j", "--watch-pid=me", "--", "a"], "needs a process id, got 'me'"),
        (["--job-id=j", "--watch-stdin", "--on-orphan=scancel", "--", "a"], "JSON list of strings"),
        (["--job-id=j", "--watch-stdin", "--bogus", "--", "a"], "unknown option '--bogus'"),
    ],
)
def test_bad_guard_arguments_say_what_is_wrong(argv, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_args(argv)


def test_local_commands_get_a_pid_guard_and_remote_ones_a_stdin_guard_inside_the_prefix(tmp_path):
    job = JobSpec(
        job_id="j1", job_dir=tmp_path, workload="m:f", hosts=("localhost", "node1"), nproc_per_node=1,
        env={"X": "1"}, rendezvous_port=29500, remote=RemoteExec.parse("ssh"), python="/py",
    )  # fmt: skip
    commands = TorchrunLauncher().commands(job)
    cancel = LaunchCommand(host="localhost", argv=("/py", "-m", "cancel", "j1"))
    local, far = guarded(commands, job, [cancel])
    assert list(local.argv) == [
        *guard_argv("/py", "j1", watch_pid=os.getpid(), on_orphan=[cancel.argv]),
        *commands[0].argv,
    ]
    assert far.remote and list(far.argv[:4]) == ["ssh", "-o", "BatchMode=yes", "node1"]
    # What the remote shell runs: env, then the stdin guard, then the agent.
    remote_line = " ".join(far.argv[4:])
    assert remote_line.startswith(
        f"env X=1 /py -m {GUARD_MODULE} --job-id=j1 --watch-stdin -- /py -m torch.distributed.run"
    )
    assert far.node_argv == commands[1].node_argv == commands[0].argv


# --------------------------------------------------------------------------- the controller dies


def test_when_the_controller_dies_the_guard_ends_the_job_and_runs_the_cancel(tmp_path):
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    pids_file, cancelled = tmp_path / "pids", tmp_path / "cancelled"
    cancel = [sys.executable, "-c", f"open({str(cancelled)!r}, 'w').write('scancel')"]
    guard = guard_argv(sys.executable, job_id, watch_pid=1, on_orphan=[cancel])
    guard = [a.replace("--watch-pid=1", "--watch-pid=CONTROLLER_PID") for a in guard]
    log = open(tmp_path / "guard.log", "wb")  # noqa: SIM115
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, *guard, sys.executable, "-c", AGENT, str(pids_file)],
        env=job_env(job_id), stdout=log, stderr=log,
    )  # fmt: skip
    try:
        agent, grandchild = agent_pids(pids_file)
        assert alive(agent) and alive(grandchild)
        controller.kill()
        controller.wait()
        assert wait_for(lambda: not alive(agent) and not alive(grandchild), 10), (
            "the job outlived its controller"
        )
        assert wait_for(cancelled.exists, 10) and cancelled.read_text() == "scancel"
        assert wait_for(lambda: f"job {job_id}: nothing left" in (tmp_path / "guard.log").read_text(), 10)
        said = (tmp_path / "guard.log").read_text()
        assert f"pytest (pid {controller.pid}) that owns the job has exited; stopping job {job_id}" in said
    finally:
        log.close()
        controller.kill()
        kill_all(agent_pids(pids_file) if pids_file.exists() else [])


def _stdin_guard(tmp_path: Path, job_id: str, hello: bool) -> tuple[subprocess.Popen, Path]:
    pids_file = tmp_path / "pids"
    guard = subprocess.Popen(
        [*guard_argv(sys.executable, job_id), sys.executable, "-c", AGENT, str(pids_file)],
        env=job_env(job_id), stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=False,
    )  # fmt: skip
    if hello:
        guard.stdin.write(HELLO)
        guard.stdin.flush()
    return guard, pids_file


def test_a_remote_guard_ends_the_job_when_its_stdin_closes_after_the_hello(tmp_path):
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    guard, pids_file = _stdin_guard(tmp_path, job_id, hello=True)
    try:
        agent, grandchild = agent_pids(pids_file)
        guard.stdin.close()  # the controller (or ssh) is gone
        assert guard.wait(timeout=15) == ORPHANED_EXIT
        assert not alive(agent) and not alive(grandchild)
        assert b"stdin closed: the pytest that owns the job" in guard.stderr.read()
    finally:
        guard.kill()
        kill_all(agent_pids(pids_file) if pids_file.exists() else [])


def test_a_remote_prefix_that_does_not_forward_stdin_leaves_the_job_running(tmp_path):
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    guard, pids_file = _stdin_guard(tmp_path, job_id, hello=False)
    try:
        agent, grandchild = agent_pids(pids_file)
        guard.stdin.close()  # end-of-file before any hello: pdsh, or stdin from /dev/null
        time.sleep(1.0)
        assert guard.poll() is None and alive(agent)
        os.kill(agent, signal.SIGKILL)
        assert guard.wait(timeout=10) == -signal.SIGKILL  # the guard leaves as its agent did
        kill_all([grandchild])  # it holds the stderr pipe open
        assert b"does not forward stdin" in guard.stderr.read()
    finally:
        guard.kill()
        kill_all(agent_pids(pids_file) if pids_file.exists() else [])


# --------------------------------------------------------------------------- otherwise invisible


def _guard_over_agent(job_id: str, pids_file: Path) -> subprocess.Popen:
    """The guard of job ``job_id`` watching this process, running `AGENT` (which writes its pids
    to ``pids_file``)."""
    argv = guard_argv(sys.executable, job_id, watch_pid=os.getpid())
    return subprocess.Popen([*argv, sys.executable, "-c", AGENT, str(pids_file)])


def test_the_guard_exits_with_its_agents_code_and_passes_sigterm_on(tmp_path):
    done = subprocess.run(
        [*guard_argv(sys.executable, "t-code", watch_pid=os.getpid()), sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 3 and done.stderr == b""
    pids_file = tmp_path / "pids"
    guard = _guard_over_agent("t-term", pids_file)
    agent, grandchild = agent_pids(pids_file)
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(timeout=10) == -signal.SIGTERM and not alive(agent)
    kill_all([grandchild])


def test_killing_the_guard_takes_its_agent_along(tmp_path):
    pids_file = tmp_path / "pids"
    guard = _guard_over_agent("t-kill", pids_file)
    agent, grandchild = agent_pids(pids_file)
    guard.kill()
    guard.wait()
    assert wait_for(lambda: not alive(agent), 5), "PR_SET_PDEATHSIG did not end the agent"
    kill_all([grandchild])


def test_a_cluster_run_starts_its_agents_under_guards(tmp_path):
    """Through Cluster.run with a stand-in launcher: the agent's parent is a guard."""

    class Probe:
        name = "probe"

        def available(self):
            return None

        def commands(self, job):
            code = "import os, json; print(json.dumps(open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0))))"
            return [LaunchCommand(host="localhost", argv=(sys.executable, "-c", code))]

    from pytest_gpucluster.launch.job import Cluster

    cluster = Cluster(ClusterSpec.from_local(1), Probe(), tmp_path)
    result = cluster.run("m:f", timeout=30, check=False)
    parent_argv = json.loads(result.agent_logs[0].read_text().splitlines()[0])
    assert parent_argv[1:3] == ["-m", GUARD_MODULE] and f"--job-id={result.job_id}" in parent_argv
