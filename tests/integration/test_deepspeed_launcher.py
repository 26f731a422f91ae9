"""The DeepSpeed launcher (``deepspeed.launcher.runner``, as the ``deepspeed`` script runs it)
starts a real 2-rank CPU job: ``--num_gpus 2`` with a hostfile, no ssh, LOCAL_RANK from the
environment. One launch costs ~7 s here (the runner and launch.py both import DeepSpeed)."""

from __future__ import annotations

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.workloads import basic

LAUNCHER = get_launcher("deepspeed")
pytestmark = pytest.mark.skipif(LAUNCHER.available() is not None, reason=str(LAUNCHER.available()))


def test_two_cpu_ranks_through_the_deepspeed_launcher(tmp_path):
    cluster = Cluster(ClusterSpec.from_local(2, backend="gloo"), LAUNCHER, tmp_path)
    result = cluster.run(basic.all_reduce_sum, timeout=120)
    assert [v["sum"] for v in result.values] == [3.0, 3.0], result.failure_report()
    assert [(r.rank, r.local_rank) for r in result.ranks] == [(0, 0), (1, 1)]
    agent_log = result.agent_logs[0].read_text()
    # The runner took the local path with our port and spawned the worker module without --local_rank.
    assert "dist_world_size=2" in agent_log, agent_log[-2000:]
    assert "--master_port=" in " ".join(result.commands[0].argv)
    assert "'pytest_gpucluster.workloads._worker'" in agent_log and "--local_rank" not in agent_log
    assert (result.job_dir / "hostfile.deepspeed").read_text() == "localhost slots=2\n"
    assert result.agent_exit_codes == (0,)
