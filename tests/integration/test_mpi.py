"""Open MPI's mpirun (Debian's openmpi-bin) starts a real 2-rank gloo job through the mpirun backend."""

from __future__ import annotations

import os
import subprocess

import pytest
from proc_table import job_pids

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.mpi import nccl_tests_argv
from pytest_gpucluster.workloads import basic

LAUNCHER = get_launcher("mpirun")
pytestmark = pytest.mark.skipif(LAUNCHER.available() is not None, reason=str(LAUNCHER.available()))


def test_two_ranks_from_ompi_comm_world_get_the_sum(tmp_path):
    cluster = Cluster(ClusterSpec.from_local(2, backend="gloo"), LAUNCHER, tmp_path)
    result = cluster.run(basic.all_reduce_sum, timeout=90)
    assert [v["sum"] for v in result.values] == [3.0, 3.0], result.failure_report()
    assert [(r.rank, r.local_rank) for r in result.ranks] == [(0, 0), (1, 1)]
    (command,) = result.commands
    assert command.argv[0] == "mpirun" and "ppr:2:node" in command.argv
    assert (result.job_dir / "hostfile.openmpi").read_text() == "localhost slots=2\n"
    assert result.agent_exit_codes == (0,)
    assert job_pids(result.job_id) == []


def test_the_nccl_tests_command_line_is_accepted_by_open_mpi():
    # A stand-in binary: Open MPI must accept -H host:slots with ppr mapping and start 2 copies,
    # each seeing the nccl-tests arguments.
    argv = nccl_tests_argv("/bin/echo", ["localhost"], 2, allow_run_as_root=os.geteuid() == 0)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["-b 8 -e 128M -f 2 -g 1"] * 2
