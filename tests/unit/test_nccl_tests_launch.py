"""How nccl-tests binaries are started under each launcher, and the rank-count check on their output.

Stands for the GPU path of ``test_nccl_tests``: on a real cluster the argv below starts
``all_reduce_perf`` on 8-GPU nodes (srun under Slurm with the GPUs requested, mpirun with the
forwarding allow-list as ``-x``, one process on a lone local node), and a build without ``MPI=1``
prints one table per process, which must be reported as that, never as low bandwidth. The outputs
checked here are real ones from public issue threads (tests/data/nccl_tests/SOURCES.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.launch.mpi import MpirunLauncher
from pytest_gpucluster.launch.nccl_tests import build_command, how_to_start
from pytest_gpucluster.launch.nccl_tests_ranks import (
    NonMpiBuild,
    RankMismatch,
    check_ranks,
    separate_processes,
)
from pytest_gpucluster.launch.slurm import SlurmLauncher
from pytest_gpucluster.launch.torchrun import TorchrunLauncher
from pytest_gpucluster.parsers.nccl_tests import Measurement, Row, Run, parse

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
MiB = 1 << 20
SWEEP = dict(min_bytes=MiB, max_bytes=MiB, factor=2, warmup=5, iters=20, dtype="bfloat16", op="sum")
LOGIN_NODE = {
    "LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib",
    "FI_PROVIDER": "efa",
    "CUDA_VISIBLE_DEVICES": "0",  # the login node's, never forwarded by default
    "HF_TOKEN": "hf_secret",
    "EDITOR": "vim",  # matches no pattern
}
PATTERNS = ("LD_LIBRARY_PATH", "FI_*", "HF_*")


def command(hosts, launcher=None, *, check=False, gpus=8):
    return build_command(
        "/nt/all_reduce_perf", hosts, gpus, check=check, env={"NCCL_DEBUG": "WARN"}, launcher=launcher,
        forward_patterns=PATTERNS, environ=LOGIN_NODE, **SWEEP,
    )  # fmt: skip


def after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_one_local_node_runs_the_binary_itself_driving_every_gpu():
    """A single 8-GPU node that is this machine: one process, ``-g 8``, no MPI build needed."""
    cmd = command(["localhost"], TorchrunLauncher())
    assert cmd.starter == "direct" and cmd.argv[0] == "/nt/all_reduce_perf"
    assert after(cmd.argv, "-g") == "8" and after(cmd.argv, "-c") == "0"
    assert cmd.env == {
        "FI_PROVIDER": "efa", "HF_TOKEN": "hf_secret", "LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib",
        "NCCL_DEBUG": "WARN",
    }  # fmt: skip
    assert (cmd.nodes, cmd.gpus_per_node) == (1, 8)
    assert after(command(["localhost"], check=True).argv, "-c") == "1"


def test_mpirun_forwards_the_allow_list_as_x_and_passes_c_either_way():
    """Two nodes through Open MPI: one process per GPU, the login node's LD_LIBRARY_PATH and FI_*
    reach the remote ranks as ``-x`` (mpirun forwards nothing else over ssh), secrets redacted."""
    launcher = MpirunLauncher(extra_args="--mca btl ^openib", allow_run_as_root=False)
    cmd = command(["gpu-01", "gpu-02"], launcher)
    argv = list(cmd.argv)
    assert cmd.starter == "mpirun" and argv[:5] == ["mpirun", "-np", "16", "-H", "gpu-01:8,gpu-02:8"]
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exported == [
        "FI_PROVIDER=efa", "HF_TOKEN=hf_secret", "LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib", "NCCL_DEBUG=WARN",
    ]  # fmt: skip
    assert argv[argv.index("/nt/all_reduce_perf") - 3 :][:3] == ["--mca", "btl", "^openib"]
    assert after(argv, "-g") == "1" and after(argv, "-c") == "0" and "--allow-run-as-root" not in argv
    assert after(list(command(["gpu-01", "gpu-02"], launcher, check=True).argv), "-c") == "1"
    assert "HF_TOKEN=<redacted>" in cmd.shell_line() and "hf_secret" not in cmd.shell_line()
    assert cmd.env == {}  # everything travels in argv
    # Under the mpirun launcher even one local node goes through mpirun (its MPI build is tested).
    assert how_to_start(["localhost"], launcher) == "mpirun"
    # torchrun cannot start an MPI program: several nodes go through mpirun as well.
    assert command(["gpu-01", "gpu-02"], TorchrunLauncher()).starter == "mpirun"


def test_srun_requests_the_gpus_and_exports_the_environment():
    """Under Slurm: srun, one task per GPU, the GPU request, CPU sizing and site options as the
    session's CUDA jobs get them, ``--export=ALL`` with the forwarded variables in srun's env."""
    launcher = SlurmLauncher(
        device="cuda",
        gpus_per_node=8,
        extra_args="--mpi=pmix --partition=gpu",
        cpus_per_node=96,
        cpu_bind="cores",
    )
    cmd = command(["gpu-01", "gpu-02"], launcher)
    argv = list(cmd.argv)
    program = argv.index("/nt/all_reduce_perf")
    assert cmd.starter == "srun" and argv[0] == "srun"
    assert argv[1:program] == [
        "--job-name=nccl-tests-all_reduce_perf", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
        "--nodelist=gpu-01,gpu-02", "--distribution=block", "--kill-on-bad-exit=1", "--time=11",
        "--export=ALL", "--gpus-per-node=8", "--cpus-per-task=12", "--cpu-bind=cores", "--mpi=pmix",
        "--partition=gpu",
    ]  # fmt: skip
    assert "--overcommit" not in argv and after(argv, "-g") == "1" and after(argv, "-c") == "0"
    assert cmd.env["LD_LIBRARY_PATH"] == "/opt/aws-ofi-nccl/lib" and "CUDA_VISIBLE_DEVICES" not in cmd.env
    gres = command(["gpu-01"], SlurmLauncher(device="cuda", gpus_per_node=8, gpu_request="gres"))
    assert "--gres=gpu:8" in gres.argv and gres.starter == "srun"
    assert "--gpus-per-node=8" not in gres.argv


# ------------------------------------------------------------------------ ranks, on real outputs


def test_a_non_mpi_build_under_mpirun_is_named_not_read_as_bandwidth():
    """Issue #107: two V100 hosts, ``-g 1``, two ``Rank 0`` lines and interleaved tables."""
    text = (DATA / "nccl_tests_issue107_v100x2_non_mpi_two_rank0.log").read_text()
    assert separate_processes(text) == 2
    with pytest.raises(ParseError):  # the cut excerpt has no row: run_command checks ranks anyway
        parse(text)
    with pytest.raises(
        NonMpiBuild, match=r"^nccl-tests was built without MPI \(MPI=1\): each of 2 processes ran alone"
    ) as err:
        check_ranks(text, [], nodes=2, gpus_per_node=1, source="issue107.log")
    assert "one job of 2 rank(s) (2 node(s) x 1 GPU(s) per node)" in str(err.value)
    assert "make clean; make MPI=1" in str(err.value) and "issue107.log" in str(err.value)
    assert "busbw" not in str(err.value).split("instead")[0]  # nothing parsed, nothing claimed


def test_a_non_mpi_build_with_several_gpus_per_process_is_named_too():
    """Issue #213: ``-g 8`` on 2 H800 nodes: two headers, each process a job of its own 8 GPUs."""
    text = (DATA / "nccl_tests_issue213_h800x2_non_mpi_g8.log").read_text()
    assert separate_processes(text) == 2
    with pytest.raises(NonMpiBuild, match="each of 2 processes ran alone"):
        check_ranks(text, [], nodes=2, gpus_per_node=8, source="issue213.log")


@pytest.mark.parametrize(
    ("name", "nodes", "gpus"),
    [
        ("gcp_a3mega_h100x16_all_reduce_2node.md", 2, 8),
        ("aws_efa_eks_p4d_a100x16_mpi_tags.log", 2, 8),
        ("rtx6000d_x16_nccl_tests_2.18.3_mpi_warnings.log", 2, 8),
        ("superbench_a100x8_all_reduce_error_column.log", 1, 8),
        ("nccl_tests_issue214_a40x2_truncated.log", 2, 1),
    ],
)
def test_a_real_mpi_run_of_the_expected_shape_passes(name, nodes, gpus):
    """One job per invocation, as MPI builds print it (one header, prefixes and all)."""
    text = (DATA / name).read_text()
    runs = parse(text)
    assert separate_processes(text) == 1
    check_ranks(text, runs, nodes=nodes, gpus_per_node=gpus, source=name)


def test_a_run_with_other_than_nodes_x_gpus_ranks_says_expected_and_parsed():
    """16 ranks came back where 2 nodes x 4 GPUs were asked for (e.g. CUDA_VISIBLE_DEVICES)."""
    name = "gcp_a3mega_h100x16_all_reduce_2node.md"
    text = (DATA / name).read_text()
    with pytest.raises(RankMismatch, match=r"ran with 16 rank\(s\) on .*; expected 8 rank\(s\) \(2 node"):
        check_ranks(text, parse(text), nodes=2, gpus_per_node=4, source=name)


def test_an_output_without_rank_lines_cannot_be_vouched_for():
    name = "gcp_a3mega_all_gather_srun_label.md"
    text = (DATA / name).read_text()
    with pytest.raises(RankMismatch, match=r"printed no '# Rank N \.\.\. on HOST device D' lines"):
        check_ranks(text, parse(text), nodes=2, gpus_per_node=8, source=name)


def test_parsed_single_rank_tables_with_zero_busbw_are_described():
    """When the lone processes' tables did parse, the message names what they show."""
    zero = Measurement(time_us=10.0, algbw_gbs=5.0, busbw_gbs=0.0, wrong=0)
    run = Run("all_reduce", 1, 1, (Row(MiB, MiB // 4, "float", "sum", -1, zero, zero),), 0.0, ("a",))
    text = "# nThread 1 nGpus 1\n# nThread 1 nGpus 1\n"
    with pytest.raises(NonMpiBuild, match=r"ran alone \(tables of 1 rank\(s\), busbw 0\) instead"):
        check_ranks(text, [run, run], nodes=2, gpus_per_node=1, source="x")
