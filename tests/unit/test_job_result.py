"""JobResult from rank files and process outcomes: statuses, root cause first, the report's wording."""

from __future__ import annotations

import pytest

from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.launch.job_files import agent_log_paths
from pytest_gpucluster.launch.process import ProcessOutcome
from pytest_gpucluster.launch.result import JobSkipped, build_result, torchrun_exit_codes

TORCHRUN_SUMMARY = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_06:40:26
  host      : node1
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 8761)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8761
"""


def make(tmp_path, states, *, hosts=("n0",), nproc=2, timed_out=False, abort=None, codes=None):
    logs = agent_log_paths(tmp_path, hosts)
    for log in logs:
        log.touch()
    process = ProcessOutcome(
        agent_exit_codes=tuple(codes or [0] * len(hosts)),
        agent_logs=tuple(logs),
        duration_s=1.0,
        timed_out=timed_out,
        abort_reason=abort,
    )
    return build_result(
        job_id="j", job_dir=tmp_path, world_size=len(hosts) * nproc, nproc_per_node=nproc, hosts=hosts,
        commands=(), process=process, states=states, timeout_s=7.0,
    )  # fmt: skip


def rec(rank, status, host="n0", node=0, **kw):
    return {"rank": rank, "status": status, "host": host, "node_rank": node, "local_rank": rank % 2, **kw}


def err(message):
    return {
        "type": "RuntimeError",
        "message": message,
        "traceback": f"Traceback...\nRuntimeError: {message}\n",
    }


def test_all_ok_gives_values_by_rank(tmp_path):
    result = make(tmp_path, {1: rec(1, "ok", value={"v": 1}), 0: rec(0, "ok", value={"v": 0})})
    assert result.ok and result.values == [{"v": 0}, {"v": 1}]
    assert result.hosts == ["n0", "n0"]
    assert result.raise_on_failure() is result


def test_earliest_error_is_the_root_cause(tmp_path):
    states = {
        0: rec(0, "error", error=err("late"), finished_at=5.0),
        1: rec(1, "error", error=err("early"), finished_at=3.0),
    }
    result = make(tmp_path, states)
    assert [r.rank for r in result.failures] == [1, 0]
    with pytest.raises(JobFailed) as info:
        result.values  # noqa: B018 - strict accessor raises
    text = str(info.value)
    assert text.index("rank 1 on n0 raised RuntimeError: early") < text.index("rank 0 on n0 raised")
    assert f"log: {tmp_path / 'rank-1.log'}" in text
    assert f"job directory (per-rank logs kept): {tmp_path}" in text
    assert info.value.result is result


def test_hung_rank_shows_its_stack_and_other_ranks_are_not_blamed(tmp_path):
    (tmp_path / "rank-1.log").write_text(
        'Thread 0x01 (most recent call first):\n  File "w.py", line 9 in spin\n'
    )
    result = make(tmp_path, {0: rec(0, "ok", value={}), 1: rec(1, "running")}, timed_out=True)
    report = result.failure_report()
    assert report.startswith("job j failed: timed out after 7 s (1 of 2 ranks failed)")
    assert "rank 1 on n0 never finished" in report and "line 9 in spin" in report
    assert result.failures[0].status == "hung"


def test_collateral_ranks_are_listed_after_the_cause(tmp_path):
    states = {0: rec(0, "running"), 1: rec(1, "error", error=err("boom"), finished_at=1.0)}
    result = make(tmp_path, states, abort="rank 1 failed; the other ranks were stopped 5 s later")
    report = result.failure_report()
    assert "(1 of 2 ranks failed)" in report
    assert report.index("rank 1 on n0 raised") < report.index("rank 0 were still running and were stopped")


def test_silent_node_is_named_with_its_agent_log(tmp_path):
    states = {0: rec(0, "ok", value={}), 1: rec(1, "ok", value={})}
    result = make(tmp_path, states, hosts=("n0", "n1"), codes=[0, 255])
    (tmp_path / "agent-n1.log").write_text("ssh: connect to host n1 port 22: No route to host\n")
    report = result.failure_report()
    assert "ranks 2, 3 on n1 never started — see agent-n1.log:" in report
    assert "No route to host" in report


def test_crash_with_signal_from_torchrun_summary(tmp_path):
    assert torchrun_exit_codes(TORCHRUN_SUMMARY) == {3: -9}
    states = {r: rec(r, "ok", value={}) for r in range(3)}
    states[3] = rec(3, "running", host="n1", node=1)
    (tmp_path / "agent-n1.log").write_text(TORCHRUN_SUMMARY)
    result = make(tmp_path, states, hosts=("n0", "n1"), codes=[0, 1])
    crashed = result.failures[0]
    assert crashed.status == "crashed" and crashed.signal == 9
    assert "rank 3 on n1 killed by signal 9 (SIGKILL) before reporting a result" in result.failure_report()


def test_a_skip_is_not_a_failure(tmp_path):
    result = make(tmp_path, {0: rec(0, "ok", value={}), 1: rec(1, "skipped", reason="no NVML")})
    assert not result.ok and result.failures == []
    with pytest.raises(JobSkipped, match="skipped on rank 1: no NVML"):
        result.raise_on_failure()


def _gpu(uuid, index=0, visible=1, env=None):
    return {"index": index, "visible": visible, "cuda_visible_devices": env, "uuid": uuid}


def test_two_ranks_on_one_gpu_name_the_gpu_before_nccls_words(tmp_path):
    # what the ranks of a 2-rank job on a 1-GPU node record, then NCCL's own error at init
    nccl = "NCCL error: invalid usage ... Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3000"
    states = {
        0: rec(
            0, "error", error=err(nccl), gpu=_gpu("GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732"), finished_at=2.0
        ),
        1: rec(
            1, "error", error=err(nccl), gpu=_gpu("GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732"), finished_at=2.1
        ),
    }
    result = make(tmp_path, states)
    with pytest.raises(JobFailed) as info:
        result.raise_on_failure()
    head = str(info.value).splitlines()[0]
    assert head == (
        "job j failed (2 of 2 ranks failed); ranks 0, 1 on n0 all took GPU GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732 "
        "(CUDA device 0 of 1 visible, CUDA_VISIBLE_DEVICES=(unset)): NCCL refuses two ranks on one GPU; run at most "
        "as many ranks per node as it has GPUs, each seeing its own (Slurm: --gpus-per-node with --gpu-bind=none, "
        "not --gpus-per-task)"
    )


def test_a_shared_gpu_fails_even_a_job_whose_ranks_all_returned(tmp_path):
    # per-task binding shows every rank "device 0": the same UUID twice on one host
    same = {0: rec(0, "ok", gpu=_gpu("GPU-a", env="0")), 1: rec(1, "ok", gpu=_gpu("GPU-a", env="0"))}
    assert not make(tmp_path, same).ok
    other = tmp_path / "o"
    other.mkdir()
    own = {0: rec(0, "ok", gpu=_gpu("GPU-a")), 1: rec(1, "ok", gpu=_gpu("GPU-b", index=1, visible=2))}
    assert make(other, own).ok
    # the same UUID on two hosts is two GPUs (UUIDs are global, but a host stand-in may repeat one)
    two = tmp_path / "t"
    two.mkdir()
    hosts = {0: rec(0, "ok", gpu=_gpu("GPU-a")), 1: rec(1, "ok", host="n1", node=1, gpu=_gpu("GPU-a"))}
    assert make(two, hosts, hosts=("n0", "n1"), nproc=1).ok
