"""The torchrun backend's exact argv, remote-exec prefixes, Cluster dry runs and ClusterSpec sources."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.cluster import ports
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import HostfileError, LaunchError, SettingsError
from pytest_gpucluster.launch import get_launcher, launcher_names
from pytest_gpucluster.launch.base import JobSpec, RemoteExec
from pytest_gpucluster.launch.job import Cluster, workload_name
from pytest_gpucluster.launch.torchrun import TorchrunLauncher
from pytest_gpucluster.workloads import basic

WORKER = ["-m", "pytest_gpucluster.workloads._worker", "/r/j1"]


def job(**kw):
    base = dict(
        job_id="j1", job_dir=Path("/r/j1"), workload="m:f", hosts=("localhost",), nproc_per_node=2,
        env={"GPUCLUSTER_JOB_ID": "j1"}, python="/py",
    )  # fmt: skip
    base.update(kw)
    return JobSpec(**base)


def test_single_node_is_one_standalone_agent():
    (cmd,) = TorchrunLauncher().commands(job())
    assert cmd.host == "localhost"
    assert not cmd.remote
    assert list(cmd.argv) == [
        "/py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        "--nproc-per-node=2", "--max-restarts=0", *WORKER,
    ]  # fmt: skip
    assert dict(cmd.env) == {"GPUCLUSTER_JOB_ID": "j1"}


def test_multi_node_netns_one_agent_per_node_through_the_prefix():
    spec = job(
        hosts=("n0", "n1"), nproc_per_node=1, rendezvous_port=20123, remote=RemoteExec.parse("netns"),
        env={"GPUCLUSTER_JOB_ID": "j1", "NCCL_DEBUG": "INFO"},
    )  # fmt: skip
    commands = TorchrunLauncher().commands(spec)
    agent = [
        "/py", "-m", "torch.distributed.run", "--nnodes=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=n0:20123", "--rdzv-id=j1", "--rdzv-conf=join_timeout=60",
        "--nproc-per-node=1", "--max-restarts=0", *WORKER,
    ]  # fmt: skip
    for cmd, host in zip(commands, ("n0", "n1"), strict=True):
        assert cmd.remote and cmd.host == host
        assert list(cmd.argv) == [
            "ip", "netns", "exec", host, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
            "env", "GPUCLUSTER_JOB_ID=j1", "NCCL_DEBUG=INFO", *agent,
        ]  # fmt: skip


def test_ssh_quotes_what_the_remote_shell_will_split():
    spec = job(
        hosts=("a", "b"), rendezvous_port=20001, remote=RemoteExec.parse("ssh"),
        env={"NCCL_IB_HCA": "mlx5_0,mlx5_1", "X": "two words"}, users={"b": "ops"},
    )  # fmt: skip
    first, second = TorchrunLauncher().commands(spec)
    assert list(first.argv[:4]) == ["ssh", "-o", "BatchMode=yes", "a"]
    assert second.argv[3] == "ops@b"
    assert "'X=two words'" in second.argv
    # What the remote shell sees splits back into exactly the intended argv.
    remote_line = " ".join(second.argv[4:])
    assert shlex.split(remote_line)[:3] == ["env", "NCCL_IB_HCA=mlx5_0,mlx5_1", "X=two words"]


def test_custom_template_and_a_local_first_host_runs_without_prefix():
    remote = RemoteExec.parse("pdsh -w {host}")
    assert remote.quote is True
    spec = job(hosts=("localhost", "node7"), rendezvous_port=20002, remote=remote, env={})
    local, far = TorchrunLauncher().commands(spec)
    assert local.argv[0] == "/py" and not local.remote
    assert list(far.argv[:3]) == ["pdsh", "-w", "node7"] and far.argv[3] == "/py"


@pytest.mark.parametrize(("template", "message"), [("", "empty"), ("ssh -p 22 node", "never names the node")])
def test_remote_template_must_name_the_node(template, message):
    with pytest.raises(SettingsError, match=message):
        RemoteExec.parse(template)


def test_multi_node_without_port_is_a_bug_not_a_guess():
    with pytest.raises(ValueError, match="no rendezvous port"):
        TorchrunLauncher().commands(job(hosts=("a", "b"), remote=RemoteExec.parse("ssh")))


def test_registry_names_and_unknown_backend():
    assert "torchrun" in launcher_names()
    assert isinstance(get_launcher("torchrun"), TorchrunLauncher)
    with pytest.raises(SettingsError, match=r"unknown launcher .mpi2.*torchrun"):
        get_launcher("mpi2")


# --------------------------------------------------------------------------- Cluster dry run


def two_node_cluster(tmp_path, remote="ssh"):
    spec = ClusterSpec(hosts=(("node0", 4), ("node1", 4)), nproc_per_node=4, backend="nccl", source="test")
    return Cluster(spec, get_launcher("torchrun"), tmp_path / "results", remote_exec=remote)


def test_commands_for_is_a_dry_run(tmp_path):
    cluster = two_node_cluster(tmp_path)
    commands = cluster.commands_for(basic.noop, env={"NCCL_DEBUG": "WARN"}, name="probe")
    assert [c.host for c in commands] == ["node0", "node1"]
    assert not (tmp_path / "results").exists()
    line = commands[1].shell_line()
    assert "pytest_gpucluster.workloads._worker" in line and "NCCL_DEBUG=WARN" in line
    job_id = commands[0].env["GPUCLUSTER_JOB_ID"]
    assert job_id.startswith("probe-")
    assert f"--rdzv-id={job_id}" in commands[0].argv
    endpoint = next(a for a in commands[0].argv if a.startswith("--rdzv-endpoint="))
    port = int(endpoint.rpartition(":")[2])
    assert ports.BASE_PORT <= port < ports.ephemeral_range()[0]
    (single,) = cluster.commands_for(basic.noop, nodes=1)
    assert single.argv[:4] == ("ssh", "-o", "BatchMode=yes", "node0") and "--standalone" in single.argv


def test_cluster_rejects_impossible_jobs(tmp_path):
    cluster = two_node_cluster(tmp_path)
    with pytest.raises(LaunchError, match=r"asked for 3 node.*has 2"):
        cluster.commands_for("m:f", nodes=3)
    with pytest.raises(LaunchError, match="node9"):
        cluster.commands_for("m:f", nodes=["node9"])
    no_prefix = two_node_cluster(tmp_path, remote=None)
    with pytest.raises(LaunchError, match="remote-exec prefix"):
        no_prefix.commands_for("m:f")
    with pytest.raises(LaunchError, match=r"node1.*remote-exec prefix"):
        no_prefix.commands_for("m:f", nodes=["node1"])
    with pytest.raises(SettingsError, match="importable"):
        cluster.commands_for(lambda ctx: None)


def test_workload_name_of_a_function_and_its_import_root():
    name, roots = workload_name(basic.all_reduce_sum)
    assert name == "pytest_gpucluster.workloads.basic:all_reduce_sum"
    assert Path(roots[0], "pytest_gpucluster", "workloads", "basic.py").is_file()
    assert workload_name("a.b:c") == ("a.b:c", [])
    with pytest.raises(SettingsError, match=r"package\.module:function"):
        workload_name("nocolon")


# --------------------------------------------------------------------------- ClusterSpec sources


def test_from_local_without_gpus_is_gloo(monkeypatch):
    monkeypatch.setattr("pytest_gpucluster.cluster.spec.local_gpu_count", lambda: 0)
    spec = ClusterSpec.from_local(2)
    assert spec.hosts == (("localhost", 2),) and spec.nproc_per_node == 2 and spec.backend == "gloo"


def test_from_hostfile_uses_the_smallest_slots_and_keeps_users():
    hostfile = pytest.importorskip("pytest_gpucluster.cluster.hostfile")
    parsed = hostfile.parse_hostfile("ops@node001 slots=8\nnode002 slots=4\n", "hf")
    spec = ClusterSpec.from_hostfile(parsed, backend="nccl")
    assert spec.hosts == (("node001", 8), ("node002", 4))
    assert spec.nproc_per_node == 4 and spec.source == "hostfile:hf"
    assert spec.user_map == {"node001": "ops"}


def test_from_slurm_env():
    pytest.importorskip("pytest_gpucluster.cluster.nodelist")
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "1"}
    spec = ClusterSpec.from_slurm_env(env)
    assert spec.host_names == ("gpu01", "gpu02") and spec.nproc_per_node == 8 and spec.backend == "nccl"
    cpu = ClusterSpec.from_slurm_env({"SLURM_JOB_NODELIST": "c1", "SLURM_TASKS_PER_NODE": "2(x1)"})
    assert cpu.nproc_per_node == 2 and cpu.backend == "gloo" and cpu.source == "slurm"
    with pytest.raises(HostfileError, match="not inside a Slurm allocation"):
        ClusterSpec.from_slurm_env({})


def test_spec_validation():
    with pytest.raises(SettingsError, match="not one of gloo, nccl"):
        ClusterSpec(hosts=(("a", 1),), nproc_per_node=1, backend="mpi")
    with pytest.raises(SettingsError, match="no hosts"):
        ClusterSpec(hosts=(), nproc_per_node=1)


# --------------------------------------------------------------------------- ports


def test_port_blocks_are_disjoint_and_below_the_ephemeral_range():
    blocks = [ports.port_block(f"gw{i}", ceiling=32768) for i in range(8)]
    blocks.append(ports.port_block("", pid=12345, ceiling=32768))
    seen: set[int] = set()
    for block in blocks:
        assert block.stop <= 32768
        assert not seen & set(block)
        seen |= set(block)


def test_allocator_skips_a_busy_port():
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        allocator = ports.PortAllocator(range(port, port + 2))
        assert allocator.next() == port + 1 or not ports.probe_free(port + 1)


def test_python_is_this_interpreter_by_default(tmp_path):
    cluster = Cluster(ClusterSpec.from_local(1, backend="gloo"), get_launcher("torchrun"), tmp_path)
    assert cluster.commands_for("m:f")[0].argv[0] == sys.executable
