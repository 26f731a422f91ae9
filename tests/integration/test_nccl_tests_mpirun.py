"""nccl-tests started through the real Open MPI mpirun, with stand-in binaries replaying real outputs.

Stands for ``test_nccl_tests`` under ``--launcher mpirun`` on a GPU node: mpirun starts one process
per GPU with the forwarding allow-list as ``-x``, and the output is checked to be one job of nodes x
GPUs per node. The stand-in prints, per rank, what the real binary printed in a recorded run
(tests/data/nccl_tests/SOURCES.md): an MPI build prints its table from rank 0 only (issue #82's
two-rank broadcast); a build without MPI prints a header and a ``Rank 0`` of its own in every
process (issue #107), which must fail as a non-MPI build, never as low bandwidth.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.launch.mpi import MpirunLauncher
from pytest_gpucluster.launch.nccl_tests import build_command, run_command
from pytest_gpucluster.launch.nccl_tests_ranks import NonMpiBuild

LAUNCHER = MpirunLauncher()
pytestmark = pytest.mark.skipif(LAUNCHER.available() is not None, reason=str(LAUNCHER.available()))
DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"

STAND_IN = """#!{python}
import os, sys
from pathlib import Path

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
here = Path(__file__).parent
(here / f"seen.{{rank}}").write_text(os.environ.get("GPUCLUSTER_PROBE_VAR", "<unset>") + "\\n" + " ".join(sys.argv[1:]))
lines = Path({recorded!r}).read_text().splitlines()
{select}
sys.stdout.write("\\n".join(lines[i] for i in keep) + "\\n")
"""
MPI_BUILD = "keep = range(len(lines)) if rank == 0 else []  # only rank 0 prints, as with MPI=1"
NON_MPI_BUILD = """zeros = [i for i, line in enumerate(lines) if "Rank  0 Pid" in line]
keep = [1, 2, 3, zeros[rank], 9, 10, 11, 12]  # this process's header, Rank 0 and table head"""


def stand_in(directory: Path, recorded: str, select: str) -> Path:
    path = directory / "all_reduce_perf"
    path.write_text(STAND_IN.format(python=sys.executable, recorded=str(DATA / recorded), select=select))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def mpirun_command(binary: Path):
    return build_command(
        binary, ["localhost"], 2, min_bytes=8, max_bytes=8, factor=2, warmup=1, iters=1, dtype="float32",
        op="sum", check=True, env={"NCCL_DEBUG": "WARN"}, launcher=LAUNCHER,
        forward_patterns=("GPUCLUSTER_PROBE_*",), environ={"GPUCLUSTER_PROBE_VAR": "only-on-the-controller"},
    )  # fmt: skip


def test_an_mpi_build_runs_as_one_job_and_gets_the_forwarded_environment(tmp_path):
    binary = stand_in(tmp_path, "nccl_tests_issue82_v100x2_broadcast_root_column.log", MPI_BUILD)
    command = mpirun_command(binary)
    assert command.starter == "mpirun" and "-x" in command.argv

    [run] = run_command(command, tmp_path / "logs" / "ar.log", timeout_s=120)

    assert (run.collective, run.nranks, run.nnodes) == ("broadcast", 2, 2)
    for rank in (0, 1):  # reached each rank through -x only: this process's environ lacks it
        seen, args = (tmp_path / f"seen.{rank}").read_text().splitlines()
        assert seen == "only-on-the-controller"
        assert args.endswith("-g 1 -n 1 -w 1 -c 1 -d float -o sum")


def test_a_non_mpi_build_fails_saying_each_process_ran_alone(tmp_path):
    binary = stand_in(tmp_path, "nccl_tests_issue107_v100x2_non_mpi_two_rank0.log", NON_MPI_BUILD)
    log = tmp_path / "ar.log"

    with pytest.raises(
        NonMpiBuild, match=r"built without MPI \(MPI=1\): each of 2 processes ran alone"
    ) as err:
        run_command(mpirun_command(binary), log, timeout_s=120)

    assert str(log) in str(err.value) and "1 node(s) x 2 GPU(s) per node" in str(err.value)
    assert log.read_text().count("Rank  0 Pid") == 2
