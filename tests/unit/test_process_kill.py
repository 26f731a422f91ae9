"""launch.process with plain Python stand-ins for agents (no torch): deadline, tree kill, progress."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from pytest_gpucluster.launch import process, reaper
from pytest_gpucluster.launch.process import LaunchSpec, run_commands
from pytest_gpucluster.launch.reaper import find_job_pids

# An "agent" that starts a grandchild in a session of its own (as torchrun does with its
# workers), reports progress, then sleeps: killing its process group alone would miss the child.
AGENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open(sys.argv[1], "a") as f:
    f.write("step 1/3\\nstep 2/3\\n")
time.sleep(120)
"""


@dataclass(frozen=True)
class Cmd:
    host: str
    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)


def spec(tmp_path, **kw):
    base = dict(job_id=f"t-{uuid.uuid4().hex[:8]}", job_dir=tmp_path, world_size=1, timeout_s=2.0)
    base.update(kw)
    return LaunchSpec(**base)


def test_timeout_kills_the_whole_tree_and_streams_progress(tmp_path):
    job = spec(tmp_path)
    lines: list[str] = []
    start = time.monotonic()
    outcome = run_commands(
        job,
        [Cmd("localhost", (sys.executable, "-c", AGENT, str(tmp_path / "progress.log")))],
        progress=lines.append,
    )
    assert outcome.timed_out and time.monotonic() - start < 12
    assert outcome.survivors == () and find_job_pids(job.job_id) == []
    assert outcome.agent_exit_codes[0] is not None and outcome.agent_exit_codes[0] < 0
    assert lines == ["step 1/3", "step 2/3"]
    assert (tmp_path / "agent-localhost.log").is_file()


def test_a_dead_agent_stops_the_others_after_the_grace(tmp_path):
    job = spec(tmp_path, timeout_s=60.0, failure_grace_s=0.5)
    commands = [
        Cmd("a", (sys.executable, "-c", "import time; time.sleep(120)")),
        Cmd("b", (sys.executable, "-c", "import sys; print('cannot reach b'); sys.exit(255)")),
    ]
    start = time.monotonic()
    outcome = run_commands(job, commands)
    assert time.monotonic() - start < 15
    assert not outcome.timed_out and outcome.abort_reason.startswith("the agent on b exited with code 255")
    assert outcome.agent_exit_codes[1] == 255
    assert "cannot reach b" in (tmp_path / "agent-b.log").read_text()
    assert find_job_pids(job.job_id) == []


def test_an_unstartable_command_is_reported_not_raised(tmp_path):
    job = spec(tmp_path)
    outcome = run_commands(job, [Cmd("x", ("/nonexistent/agent",))])
    assert outcome.start_error and "could not start the agent for x" in outcome.start_error


def test_the_remote_reaper_kills_by_job_id(tmp_path):
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={"GPUCLUSTER_JOB_ID": job_id},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not find_job_pids(job_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert find_job_pids(job_id) == [child.pid]
        assert reaper.main(["--reap", job_id]) == 0
        assert child.wait(timeout=10) < 0
    finally:
        child.kill()
        child.wait()
    assert reaper.main(["--bogus"]) == 2


def test_proc_readers_take_the_state_after_the_last_parenthesis(tmp_path):
    """/proc/<pid>/stat as the kernel writes it for a command named ``a) Z (b``: the state and
    start time are read after the last ``)``, never from inside the name."""
    fields = " ".join(["S"] + ["0"] * 18 + ["4242"] + ["0"] * 10)
    for pid, state in ((7, "S"), (8, "Z")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(f"{pid} (a) Z (b) {state}{fields[1:]}".encode())
    (tmp_path / "self").mkdir()
    proc = str(tmp_path)
    assert reaper.proc_pids(proc) == [7, 8]
    assert [reaper.is_zombie(pid, proc) for pid in (7, 8, 9)] == [False, True, True]  # 9: gone
    assert reaper.process_start_ticks(7, proc) == 4242 and reaper.process_start_ticks(9, proc) is None


@dataclass(frozen=True)
class RemoteCmd(Cmd):
    remote: bool = True


def test_a_host_that_never_answered_costs_its_deadline_not_the_reaper_wait(tmp_path):
    """One host answers (its agent logs a line, as the far-side guard does at once), the other never
    does (its log stays empty, as ssh to a dead host): the job ends at its deadline plus the
    answered host's reaper, not plus the 15 s a reaper for the dead host would hang for; the
    answered host's reaper still runs to its end, and nothing of the job is left."""
    job = spec(tmp_path, timeout_s=2.0)
    good_log = (
        "import sys, time; print('gpucluster guard on good: agent started', flush=True); time.sleep(120)"
    )
    commands = [
        Cmd("good", (sys.executable, "-c", good_log)),
        Cmd("bad", (sys.executable, "-c", "import time; time.sleep(120)")),
    ]
    # The answered host's reaper outlasts the silent host's short wait: it is waited for all the same.
    slow = process.SILENT_REAPER_WAIT_S + 2.0
    reaped = tmp_path / "good-reaped"
    reap = [
        RemoteCmd("good", (sys.executable, "-c", f"import time, pathlib; time.sleep({slow}); pathlib.Path({str(reaped)!r}).touch()")),
        RemoteCmd("bad", (sys.executable, "-c", "import time; time.sleep(120)")),
    ]  # fmt: skip
    outcome = run_commands(job, commands, reap_commands=reap)
    assert outcome.timed_out
    assert reaped.is_file(), "the reaper of the host that answered was not waited for"
    # Before: deadline + that reaper + 15 s for the silent host's; now the silent one gets 2 s at most.
    assert outcome.duration_s < job.timeout_s + slow + process.REAPER_WAIT_S - 5.0, outcome.duration_s
    assert outcome.survivors == () and find_job_pids(job.job_id) == []
