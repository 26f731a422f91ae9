"""Real 2-rank gloo jobs on this machine through torchrun: values, a raising rank, a hanging rank.

Each launch costs a few seconds (two ranks importing torch), so there are only three.
"""

from __future__ import annotations

import time

import pytest
from proc_table import job_pids

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.workloads import basic

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)


@pytest.fixture
def local_cluster(tmp_path):
    lines: list[str] = []
    made = Cluster(
        ClusterSpec.from_local(2, backend="gloo"), get_launcher("torchrun"), tmp_path / "results",
        progress=lines.append,
    )  # fmt: skip
    made.progress_lines = lines  # type: ignore[attr-defined]
    return made


def test_values_come_back_per_rank(local_cluster):
    result = local_cluster.run(basic.all_reduce_sum, timeout=90)
    values = result.values
    assert [v["sum"] for v in values] == [3.0, 3.0]
    assert [r.rank for r in result.ranks] == [0, 1] and [r.local_rank for r in result.ranks] == [0, 1]
    assert all(r.log_path.is_file() for r in result.ranks)
    assert any("all_reduce_sum: 2 ranks, sum 3" in line for line in local_cluster.progress_lines)
    assert (result.job_dir / "agent-localhost.log").is_file()
    assert job_pids(result.job_id) == []


def test_a_raising_rank_fails_with_its_traceback_and_host(local_cluster):
    result = local_cluster.run(
        "pytest_gpucluster.workloads.basic:fail_on_rank", options={"rank": 1}, timeout=90, check=False
    )
    assert not result.ok
    assert [r.status for r in result.ranks] == ["ok", "error"]
    with pytest.raises(JobFailed) as info:
        result.raise_on_failure()
    text = str(info.value)
    host = result.ranks[1].host
    assert f"rank 1 on {host} raised RuntimeError: injected failure on rank 1" in text
    assert 'basic.py", line' in text and "in fail_on_rank" in text
    assert str(result.job_dir / "rank-1.log") in text and result.job_dir.is_dir()


def test_a_hanging_rank_is_killed_with_its_stack_and_nothing_survives(local_cluster):
    timeout = 20.0
    start = time.monotonic()
    result = local_cluster.run(basic.hang_on_rank, options={"rank": 1}, timeout=timeout, check=False)
    elapsed = time.monotonic() - start
    assert elapsed < timeout + 10, f"the hung job took {elapsed:.1f} s to be stopped"
    assert result.timed_out and not result.ok
    assert result.ranks[0].status == "ok"
    hung = result.ranks[1]
    assert hung.status == "hung", result.failure_report()
    report = result.failure_report()
    assert "rank 1 on" in report and "never finished" in report
    assert "hang_on_rank" in report  # the faulthandler dump that SIGUSR1 wrote into its log
    assert job_pids(result.job_id) == []
    assert result.survivors == ()
