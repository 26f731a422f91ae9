"""Exact argv of the slurm, mpirun and DeepSpeed backends, the Slurm cancel logic, the Cluster
hooks they use (prepare, cancel commands, reaching hosts without a prefix) and the xdist
device slices and lock. No engine needed: Slurm's tools are faked where they are called."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import HostfileError, LaunchError, SettingsError
from pytest_gpucluster.launch import get_launcher, launcher_names, xdist
from pytest_gpucluster.launch import slurm as slurm_mod
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand
from pytest_gpucluster.launch.deepspeed import DeepSpeedLauncher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.mpi import MpirunLauncher, nccl_tests_argv
from pytest_gpucluster.launch.slurm import SlurmLauncher, allocation_hosts, cancel_by_name, find_ids

WORKER = ["-m", "pytest_gpucluster.workloads._worker", "/r/j1"]
ENV = {"GPUCLUSTER_JOB_ID": "j1", "PYTHONPATH": "/src"}


def job(**kw):
    base = dict(
        job_id="j1", job_dir=Path("/r/j1"), workload="m:f", hosts=("node1",), nproc_per_node=2,
        env=ENV, python="/py", timeout_s=120.0, rendezvous_timeout_s=60.0,
    )  # fmt: skip
    base.update(kw)
    return JobSpec(**base)


def test_the_three_backends_are_registered():
    assert {"torchrun", "slurm", "mpirun", "deepspeed"} <= set(launcher_names())
    assert isinstance(get_launcher("slurm", mode="tasks"), SlurmLauncher)
    assert isinstance(get_launcher("mpirun"), MpirunLauncher)
    assert isinstance(get_launcher("deepspeed"), DeepSpeedLauncher)


# --------------------------------------------------------------------------- slurm


def test_slurm_agent_mode_one_node_is_one_task_running_standalone_torchrun():
    (cmd,) = SlurmLauncher().commands(job())
    assert cmd.host == "node1" and not cmd.remote
    assert list(cmd.argv) == [
        "srun", "--job-name=j1", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=node1",
        "--distribution=block", "--kill-on-bad-exit=1", "--immediate=60", "--time=3", "--export=ALL",
        "--overcommit",
        "/py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
        "--max-restarts=0", *WORKER,
    ]  # fmt: skip
    assert dict(cmd.env) == ENV


def test_slurm_agent_mode_two_nodes_rendezvous_on_the_first_host_with_extra_args():
    spec = job(hosts=("gpu01", "gpu02"), nproc_per_node=8, rendezvous_port=20100, timeout_s=30.0)
    launcher = SlurmLauncher(extra_args="--partition=gpu --gpus-per-node=8", overcommit=False)
    (cmd,) = launcher.commands(spec)
    assert list(cmd.argv) == [
        "srun", "--job-name=j1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=gpu01,gpu02",
        "--distribution=block", "--kill-on-bad-exit=1", "--immediate=30", "--time=2", "--export=ALL",
        "--partition=gpu", "--gpus-per-node=8",
        "/py", "-m", "torch.distributed.run", "--nnodes=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu01:20100", "--rdzv-id=j1", "--rdzv-conf=join_timeout=60",
        "--nproc-per-node=8", "--max-restarts=0", *WORKER,
    ]  # fmt: skip


def test_slurm_tasks_mode_one_task_per_rank_with_master_from_the_steps_first_node():
    spec = job(hosts=("gpu01", "gpu02"), nproc_per_node=4, rendezvous_port=20101)
    (cmd,) = SlurmLauncher(mode="tasks").commands(spec)
    assert list(cmd.argv) == [
        "srun", "--job-name=j1", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--nodelist=gpu01,gpu02",
        "--distribution=block", "--kill-on-bad-exit=1", "--immediate=60", "--time=3", "--export=ALL",
        "--overcommit", "/py", *WORKER,
    ]  # fmt: skip
    # the first host given is only the fallback: each rank reads where Slurm put task 0
    assert dict(cmd.env) == {
        **ENV, "MASTER_ADDR": "gpu01", "MASTER_PORT": "20101", "GPUCLUSTER_MASTER_ADDR_FROM": "SLURM_STEP_NODELIST"
    }  # fmt: skip


def test_slurm_tasks_mode_single_node_takes_a_port_from_the_picker():
    (cmd,) = SlurmLauncher(mode="tasks", port_picker=lambda: 23456).commands(job())
    assert cmd.env["MASTER_PORT"] == "23456" and cmd.env["MASTER_ADDR"] == "node1"


def test_slurm_cancel_command_names_the_job_and_drops_the_job_id_variable():
    (agent,) = SlurmLauncher().cancel_commands(job(env={**ENV, "SLURM_CONF": "/c"}))
    assert list(agent.argv) == ["/py", "-m", "pytest_gpucluster.launch.slurm", "--cancel", "j1"]
    # Carrying GPUCLUSTER_JOB_ID would make the local kill take the canceller down with the job.
    assert dict(agent.env) == {"PYTHONPATH": "/src", "SLURM_CONF": "/c"}
    (tasks,) = SlurmLauncher(mode="tasks").cancel_commands(job())
    assert tasks.argv[-1] == "--dump-stacks"


def test_slurm_bad_mode_and_bad_extra_args():
    with pytest.raises(SettingsError, match=r"mode 'gpu' is not one of agent, tasks"):
        SlurmLauncher(mode="gpu")
    with pytest.raises(SettingsError, match=r"--slurm-args=.*cannot be split"):
        SlurmLauncher(extra_args="--comment='open")


def test_available_names_the_missing_engine(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert SlurmLauncher().available() == (
        "srun not found on PATH; install slurm-wlm or run inside an allocation"
    )
    assert "mpirun not found on PATH; install openmpi-bin" in MpirunLauncher().available()
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert "deepspeed is not installed" in DeepSpeedLauncher().available()


class FakeSlurm:
    """squeue/scancel/scontrol answering from canned text, recording every call."""

    def __init__(self, jobs: str = "", steps: str = "", after_cancel: tuple[str, str] = ("", "")) -> None:
        self.jobs, self.steps, self.after = jobs, steps, after_cancel
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        out = ""
        if argv[0] == "squeue":
            out = self.steps if "--steps" in argv else self.jobs
        elif argv[0] == "scancel" and not any(a.startswith("--signal") for a in argv):
            self.jobs, self.steps = self.after
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_find_ids_takes_the_job_when_srun_allocated_it_and_the_step_inside_an_allocation():
    # Real squeue output shapes: `--format=%A` for jobs, `--steps --format="%i %j"` for steps.
    own = FakeSlurm(jobs="41\n", steps="41.0 j1\n40.0 other\n")
    assert find_ids("j1", run=own) == ["41"]
    assert own.calls[0] == ["squeue", "--noheader", "--name=j1", "--format=%A"]
    inside = FakeSlurm(jobs="", steps="11.0 j1\n11.1 j10\n12.0 x\n")
    assert find_ids("j1", run=inside) == ["11.0"]


def test_cancel_by_name_dumps_stacks_first_then_scancels_and_waits_until_gone():
    fake = FakeSlurm(jobs="", steps="11.2 j1\n")
    slept: list[float] = []
    assert cancel_by_name("j1", dump_stacks=True, run=fake, sleep=slept.append) == ["11.2"]
    scancels = [c for c in fake.calls if c[0] == "scancel"]
    assert scancels == [["scancel", "--signal=USR1", "11.2"], ["scancel", "11.2"]]
    assert slept[0] == 0.5
    assert cancel_by_name("j1", run=FakeSlurm()) == []


def test_find_ids_says_what_squeue_said_when_it_fails():
    def down(argv):
        return subprocess.CompletedProcess(
            argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller\n"
        )

    with pytest.raises(
        LaunchError, match=r"squeue .* exited with code 1: slurm_load_jobs error: Unable to contact"
    ):
        find_ids("j1", run=down)


def test_cancel_main_usage_and_exit_codes(monkeypatch, capsys):
    assert slurm_mod.main(["--bogus"]) == 2
    monkeypatch.setattr(slurm_mod, "cancel_by_name", lambda name, dump_stacks: ["7"])
    assert slurm_mod.main(["--cancel", "j1"]) == 0
    assert "cancelled 7" in capsys.readouterr().out


def test_allocation_hosts_prefers_scontrol_and_falls_back_to_expansion():
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]"}

    def scontrol(argv):
        assert list(argv) == ["/bin/sh", "show", "hostnames", "gpu[01-02]"]
        return subprocess.CompletedProcess(argv, 0, "gpu01\ngpu02\n", "")

    assert allocation_hosts(env, scontrol="/bin/sh", run=scontrol) == ("gpu01", "gpu02")
    assert allocation_hosts(env, scontrol="/nonexistent/scontrol") == ("gpu01", "gpu02")
    with pytest.raises(HostfileError, match="not inside a Slurm allocation"):
        allocation_hosts({})


# --------------------------------------------------------------------------- mpirun


def test_mpirun_argv_hostfile_ppr_and_environment(tmp_path):
    spec = job(job_dir=tmp_path, hosts=("node001", "node002"), nproc_per_node=8, rendezvous_port=20200,
               users={"node002": "ops"})  # fmt: skip
    launcher = MpirunLauncher(allow_run_as_root=False)
    (cmd,) = launcher.commands(spec)
    hostfile = str(tmp_path / "hostfile.openmpi")
    assert list(cmd.argv) == [
        "mpirun", "--hostfile", hostfile, "-np", "16", "--map-by", "ppr:8:node", "--bind-to", "none",
        "-x", "GPUCLUSTER_JOB_ID=j1", "-x", "PYTHONPATH=/src", "-x", "MASTER_ADDR=node001",
        "-x", "MASTER_PORT=20200", "/py", "-m", "pytest_gpucluster.workloads._worker", str(tmp_path),
    ]  # fmt: skip
    launcher.prepare(spec)
    assert Path(hostfile).read_text() == "node001 slots=8\nops@node002 slots=8\n"


def test_mpirun_single_local_host_root_oversubscribe_and_extra_args(tmp_path):
    spec = job(job_dir=tmp_path, hosts=("localhost",), env={"NCCL_DEBUG": "INFO"})
    launcher = MpirunLauncher(
        "--mca btl ^openib", allow_run_as_root=True, oversubscribe=True, port_picker=lambda: 20300
    )
    (cmd,) = launcher.commands(spec)
    argv = list(cmd.argv)
    assert argv[argv.index("none") + 1 : argv.index("-x")] == ["--oversubscribe", "--allow-run-as-root"]
    at = argv.index("MASTER_ADDR=127.0.0.1") - 1
    assert argv[at : at + 4] == ["-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=20300"]
    assert argv[argv.index("/py") - 3 : argv.index("/py")] == ["--mca", "btl", "^openib"]
    assert dict(cmd.env) == {"NCCL_DEBUG": "INFO", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "20300"}


def test_mpirun_available_refuses_a_non_open_mpi(tmp_path, monkeypatch):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = MpirunLauncher().available()
    assert reason is not None and "is not Open MPI's mpirun" in reason and "HYDRA" in reason


def test_nccl_tests_argv_is_seed_002s_command_line():
    argv = nccl_tests_argv(
        "/opt/nccl-tests/build/all_reduce_perf", ["node001", "node002"], 8, min_bytes=256, max_bytes="32G"
    )
    assert argv == [
        "mpirun", "-np", "16", "-H", "node001:8,node002:8", "--map-by", "ppr:8:node", "--bind-to", "none",
        "/opt/nccl-tests/build/all_reduce_perf", "-b", "256", "-e", "32G", "-f", "2", "-g", "1", "-c", "0",
    ]  # fmt: skip
    more = nccl_tests_argv(
        "all_gather_perf", ["a"], 2, iters=20, warmup_iters=5, check=True, env={"NCCL_DEBUG": "INFO"},
        allow_run_as_root=True,
    )  # fmt: skip
    assert more[more.index("none") + 1 :] == [
        "--allow-run-as-root", "-x", "NCCL_DEBUG=INFO", "all_gather_perf", "-b", "8", "-e", "128M",
        "-f", "2", "-g", "1", "-n", "20", "-w", "5", "-c", "1",
    ]  # fmt: skip
    with pytest.raises(SettingsError, match="step factor"):
        nccl_tests_argv("x", ["a"], 1, step_factor=1)
    with pytest.raises(SettingsError, match="at least one host"):
        nccl_tests_argv("x", [], 1)


# --------------------------------------------------------------------------- deepspeed


def test_deepspeed_single_node_num_gpus_hostfile_and_port(tmp_path):
    spec = job(job_dir=tmp_path, hosts=("localhost",))
    launcher = DeepSpeedLauncher(port_picker=lambda: 20400)
    (cmd,) = launcher.commands(spec)
    assert list(cmd.argv) == [
        "/py", "-m", "deepspeed.launcher.runner", "--hostfile", str(tmp_path / "hostfile.deepspeed"),
        "--no_ssh_check", "--master_addr=127.0.0.1", "--master_port=20400", "--num_nodes=1", "--num_gpus=2",
        "--no_local_rank", "--module", "pytest_gpucluster.workloads._worker", str(tmp_path),
    ]  # fmt: skip
    assert dict(cmd.env) == ENV
    launcher.prepare(spec)
    assert (tmp_path / "hostfile.deepspeed").read_text() == "localhost slots=2\n"
    assert not (tmp_path / "deepspeed.env").exists()


def test_deepspeed_multi_node_include_pdsh_and_env_file(tmp_path):
    spec = job(job_dir=tmp_path, hosts=("worker-1", "worker-2"), nproc_per_node=4, rendezvous_port=20500)
    launcher = DeepSpeedLauncher(include="worker-1:0,1@worker-2:0,1", extra_args=["--bind_cores_to_rank"])
    (cmd,) = launcher.commands(spec)
    assert list(cmd.argv[3:]) == [
        "--hostfile", str(tmp_path / "hostfile.deepspeed"), "--no_ssh_check", "--master_addr=worker-1",
        "--master_port=20500", "--include=worker-1:0,1@worker-2:0,1", "--launcher=pdsh", "--no_local_rank",
        "--bind_cores_to_rank", "--module", "pytest_gpucluster.workloads._worker", str(tmp_path),
    ]  # fmt: skip
    assert cmd.env["DS_ENV_FILE"] == str(tmp_path / "deepspeed.env")
    launcher.prepare(spec)
    assert (tmp_path / "deepspeed.env").read_text() == "GPUCLUSTER_JOB_ID=j1\nPYTHONPATH=/src\n"
    assert (tmp_path / "hostfile.deepspeed").read_text() == "worker-1 slots=4\nworker-2 slots=4\n"


def test_deepspeed_rejects_what_it_cannot_carry(tmp_path):
    with pytest.raises(SettingsError, match="multi-node launcher 'ssh'"):
        DeepSpeedLauncher(multinode_launcher="ssh")
    with pytest.raises(SettingsError, match="--include is empty"):
        DeepSpeedLauncher(include=" ")
    spec = job(job_dir=tmp_path, hosts=("a", "b"), rendezvous_port=1, env={"X": "two\nlines"})
    with pytest.raises(SettingsError, match="X holds a line break"):
        DeepSpeedLauncher().prepare(spec)


# --------------------------------------------------------------------------- Cluster hooks


def test_backends_that_reach_hosts_need_no_remote_exec_prefix(tmp_path):
    spec = ClusterSpec(hosts=(("gpu01", 8), ("gpu02", 8)), nproc_per_node=8, backend="nccl", source="slurm")
    for name in ("slurm", "mpirun", "deepspeed"):
        (cmd,) = Cluster(spec, get_launcher(name), tmp_path / "r").commands_for("m:f")
        assert not cmd.remote and cmd.host == "gpu01"
    with pytest.raises(LaunchError, match="remote-exec prefix"):
        Cluster(spec, get_launcher("torchrun"), tmp_path / "r").commands_for("m:f")


class HookLauncher:
    """An agent that never ends; prepare and cancel leave marker files."""

    name = "hooks"

    def __init__(self, marker_dir: Path) -> None:
        self.marker_dir = marker_dir

    def available(self):
        return None

    def prepare(self, job: JobSpec) -> None:
        (job.job_dir / "prepared").write_text(job.job_id)

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        assert (job.job_dir / "prepared").is_file(), "prepare must run before commands"
        return [
            LaunchCommand(
                host="localhost", argv=(sys.executable, "-c", "import time; time.sleep(60)"), env=job.env
            )
        ]

    def cancel_commands(self, job: JobSpec) -> list[LaunchCommand]:
        code = f"open({str(self.marker_dir / 'cancelled')!r}, 'w').write({job.job_id!r})"
        return [LaunchCommand(host="localhost", argv=(sys.executable, "-c", code))]


def test_cluster_run_prepares_files_and_runs_cancel_commands_when_it_stops_a_job(tmp_path):
    cluster = Cluster(ClusterSpec.from_local(1, backend="gloo"), HookLauncher(tmp_path), tmp_path / "r")
    result = cluster.run("m:f", timeout=1, check=False)
    assert result.timed_out and not result.ok
    assert (result.job_dir / "prepared").read_text() == result.job_id
    assert (tmp_path / "cancelled").read_text() == result.job_id


# --------------------------------------------------------------------------- xdist


@pytest.mark.parametrize(
    ("worker", "n_workers", "gpus", "expected"),
    [
        ("gw0", 1, 8, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("gw0", 2, 8, [0, 1, 2, 3]),
        ("gw1", 2, 8, [4, 5, 6, 7]),
        ("gw7", 8, 8, [7]),
        ("gw0", 4, 10, [0, 1, 2]),
        ("gw1", 4, 10, [3, 4, 5]),
        ("gw2", 4, 10, [6, 7]),
        ("gw3", 4, 10, [8, 9]),
        ("gw5", 8, 4, [1]),  # more workers than devices: shared round-robin
        (3, 4, 8, [6, 7]),
    ],
)
def test_device_slice(worker, n_workers, gpus, expected):
    assert xdist.device_slice(worker, n_workers, gpus) == expected


def test_device_slices_cover_every_device_once():
    for n_workers in range(1, 9):
        slices = [xdist.device_slice(f"gw{i}", n_workers, 8) for i in range(n_workers)]
        assert sorted(d for s in slices for d in s) == list(range(8))


def test_device_slice_errors_and_inherited_visible_devices():
    with pytest.raises(SettingsError, match="out of range for 2 worker"):
        xdist.device_slice("gw2", 2, 8)
    with pytest.raises(SettingsError, match="not of the form 'gw<N>'"):
        xdist.device_slice("worker1", 2, 8)
    with pytest.raises(SettingsError, match="gpus_per_node must be at least 1"):
        xdist.device_slice("gw0", 1, 0)
    assert xdist.cuda_visible_devices("gw1", 2, 4) == "2,3"
    assert xdist.cuda_visible_devices("gw1", 2, 4, inherited="4,5,6,7") == "6,7"
    with pytest.raises(SettingsError, match="lists 2 device"):
        xdist.cuda_visible_devices("gw0", 2, 4, inherited="0,1")


def test_launch_lock_does_nothing_outside_xdist(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with xdist.launch_lock(tmp_path, directory=str(tmp_path)) as path:
        assert path is None
    assert not list(tmp_path.glob("*.lock"))


def test_launch_lock_exclusive_excludes_and_shared_shares(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    key, where = tmp_path / "results", str(tmp_path)
    assert xdist.lock_path(key, where) == xdist.lock_path(str(key), where)
    held = threading.Event()
    release = threading.Event()

    def hold(exclusive: bool) -> None:
        with xdist.launch_lock(key, exclusive=exclusive, directory=where):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold, args=(True,))
    holder.start()
    assert held.wait(5)
    start = time.monotonic()
    with (
        pytest.raises(LaunchError, match="another pytest-xdist worker"),
        xdist.launch_lock(key, timeout=0.3, directory=where),
    ):
        pass
    assert time.monotonic() - start >= 0.3
    with pytest.raises(LaunchError), xdist.launch_lock(key, exclusive=False, timeout=0.2, directory=where):
        pass
    release.set()
    holder.join()
    with xdist.launch_lock(key, timeout=2, directory=where) as path:  # free again
        assert path == xdist.lock_path(key, where)

    held.clear()
    release.clear()
    reader = threading.Thread(target=hold, args=(False,))
    reader.start()
    assert held.wait(5)
    with xdist.launch_lock(key, exclusive=False, timeout=1, directory=where):
        pass  # two readers at once
    with pytest.raises(LaunchError), xdist.launch_lock(key, exclusive=True, timeout=0.2, directory=where):
        pass
    release.set()
    reader.join()
