"""A real single-node Slurm (Debian's slurm-wlm), started here, runs jobs through the slurm launcher.

The ``slurm_cluster`` fixture writes a slurm.conf into a temp directory (`slurm_daemons.write_conf`:
free ports, its own state and spool directories, ``auth/none``), starts slurmctld and slurmd in the
foreground, waits until the node is idle, and in its finalizer cancels every job, stops both daemons
and kills whatever still carries its ``SLURM_CONF`` (slurmstepd, ranks). It skips, saying why, when a
binary is missing or a daemon does not come up. The node claims 8 CPUs (``config_overrides``) so
that an allocation and a job of its own fit side by side on a 2-core machine, and 8 GPUs as generic
resources (``Gres=gpu:8``, over `slurm_daemons.gpu_devices`' stand-in device files): Slurm accounts
for them and hands them to steps that ask, which is the GPU request path of a CUDA profile, end to end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_daemons import SBIN, SlurmClient, pids_with_env, require_slurm, start_daemon, stop, write_conf

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import GpuClusterWarning
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.launch.slurm import cancel_by_name, find_ids
from pytest_gpucluster.workloads import _worker, basic

REPO = Path(__file__).parents[2]
TOOLS = ("slurmctld", "slurmd", "srun", "salloc", "sinfo", "squeue", "scancel")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster(SlurmClient):
    def __init__(self, directory: Path, node: str) -> None:
        super().__init__(directory, {**os.environ, "SLURM_CONF": str(directory / "slurm.conf"), "PATH": SBIN})
        self.node = node


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    require_slurm(TOOLS)
    if not os.path.isdir("/sys/fs/cgroup"):
        pytest.skip("slurmd needs /sys/fs/cgroup, which is not mounted here")
    directory = tmp_path_factory.mktemp("slurm")
    node = socket.gethostname().split(".")[0]
    write_conf(
        directory,
        cluster=f"gc{os.getpid()}",
        controller=(node, "127.0.0.1"),
        nodes=[(node, "127.0.0.1")],
        ports=(_free_port(), _free_port()),
        cpus=max(os.cpu_count() or 1, 8),
    )
    cluster = SlurmCluster(directory, node)
    procs = []
    try:
        for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", ["-N", node])):
            argv = [shutil.which(daemon, path=SBIN), "-D", "-f", str(cluster.conf), *extra]
            procs.append(start_daemon(argv, cluster.env, directory / f"{daemon}.out"))
        if not cluster.wait_idle(1, 30):
            dead = [f"{p.args[0]} exited with {p.returncode}" for p in procs if p.poll() is not None]
            state = cluster.run("sinfo", "-h", "-o", "%t %E").stdout.strip() or "no answer"
            pytest.skip(
                f"the test Slurm did not become idle in 30 s (node state: {state}; {'; '.join(dead)})\n"
                f"slurmctld.log:\n{cluster.log('slurmctld.log', 8)}\n"
                f"slurmd.log:\n{cluster.log(f'slurmd-{node}.log', 8)}"
            )
        with pytest.MonkeyPatch.context() as mp:
            # An outer allocation (CI inside Slurm) must not leak into this cluster's commands.
            for key in [k for k in os.environ if k.startswith("SLURM_")]:
                mp.delenv(key)
            mp.setenv("SLURM_CONF", str(cluster.conf))
            mp.setenv("PATH", SBIN)
            yield cluster
    finally:
        stop(procs, cluster, cluster.conf)


@pytest.fixture(scope="module")
def allocation(slurm_cluster):
    """An allocation held like ``salloc`` holds one: the environment a user's pytest runs in."""
    done = slurm_cluster.run(
        "salloc", "--no-shell", "--immediate=20", "--nodes=1", "--ntasks=2", "--job-name=gc-outer", timeout=30
    )
    job_id = next((line.split()[0] for line in slurm_cluster.jobs() if "gc-outer" in line), None)
    if job_id is None:
        pytest.fail(f"salloc --no-shell did not leave an allocation: {done.stdout}{done.stderr}")
    nodelist = slurm_cluster.run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip()
    yield {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodelist, "SLURM_NTASKS_PER_NODE": "2"}
    slurm_cluster.run("scancel", job_id)


def _no_worker_left(job_id: str) -> bool:
    return pids_with_env(f"GPUCLUSTER_JOB_ID={job_id}") == []


def test_agent_mode_allocates_its_own_job_and_gets_the_sum(slurm_cluster, tmp_path):
    spec = ClusterSpec(hosts=((slurm_cluster.node, 2),), nproc_per_node=2, backend="gloo", source="slurm")
    cluster = Cluster(spec, get_launcher("slurm"), tmp_path)
    result = cluster.run(basic.all_reduce_sum, timeout=90)
    assert [v["sum"] for v in result.values] == [3.0, 3.0], result.failure_report()
    (command,) = result.commands
    assert command.argv[0] == "srun" and f"--job-name={result.job_id}" in command.argv
    assert "torch.distributed.run" in command.argv
    assert slurm_cluster.wait_until(lambda: not any(result.job_id in j for j in slurm_cluster.jobs()))


def test_tasks_mode_inside_an_allocation_takes_ranks_from_slurm_procid(
    slurm_cluster, allocation, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_JOB_ID", allocation["SLURM_JOB_ID"])
    spec = ClusterSpec.from_slurm_env(allocation)
    assert spec.host_names == (slurm_cluster.node,) and spec.nproc_per_node == 2
    cluster = Cluster(spec, get_launcher("slurm", mode="tasks"), tmp_path)
    result = cluster.run(basic.all_reduce_sum, timeout=90)
    assert [v["sum"] for v in result.values] == [3.0, 3.0], result.failure_report()
    assert [(r.rank, r.local_rank) for r in result.ranks] == [(0, 0), (1, 1)]
    agent_log = result.agent_logs[0].read_text()
    assert "torch.distributed.run" not in " ".join(result.commands[0].argv)
    # It ran as a step of the allocation, which is still there afterwards.
    assert "queued and waiting" not in agent_log
    jobs = slurm_cluster.jobs()
    assert [line.split()[0] for line in jobs] == [allocation["SLURM_JOB_ID"]], jobs


def test_a_hung_rank_is_cancelled_through_slurm_within_the_timeout(
    slurm_cluster, allocation, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_JOB_ID", allocation["SLURM_JOB_ID"])
    cluster = Cluster(ClusterSpec.from_slurm_env(allocation), get_launcher("slurm"), tmp_path)
    timeout = 20.0  # ranks start in ~3 s; the margin is for a loaded CI machine
    start = time.monotonic()
    result = cluster.run(basic.hang_on_rank, options={"rank": 1}, timeout=timeout, check=False)
    elapsed = time.monotonic() - start
    assert result.timed_out and not result.ok
    assert elapsed < timeout + 20, f"the hung job took {elapsed:.1f} s to be stopped"
    assert result.ranks[1].status == "hung", result.failure_report()
    assert "in hang_on_rank" in result.ranks[1].log_path.read_text()  # its stack dump
    # Slurm ended the step: srun's log says so, no step is left, the allocation itself lives on.
    log = result.agent_logs[0].read_text()
    assert "CANCELLED" in log or "Terminating StepId" in log, log
    assert slurm_cluster.wait_until(lambda: slurm_cluster.steps() == []), slurm_cluster.steps()
    assert [line.split()[0] for line in slurm_cluster.jobs()] == [allocation["SLURM_JOB_ID"]]
    assert _no_worker_left(result.job_id)
    assert result.survivors == ()


def test_cancel_by_name_cancels_a_running_job_through_scancel(slurm_cluster, tmp_path):
    name = f"gc-cancel-{os.getpid()}"
    log = tmp_path / "srun.log"
    with open(log, "wb") as out:
        srun = subprocess.Popen(
            ["srun", "--immediate=20", "--ntasks=1", f"--job-name={name}", "sleep", "300"],
            env=slurm_cluster.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        assert slurm_cluster.wait_until(lambda: any(f" {name} RUNNING" in j for j in slurm_cluster.jobs()))
        [job_id] = find_ids(name)
        assert cancel_by_name(name) == [job_id]
        # scancel ended it, not us: srun returns by itself, and slurmctld records the cancellation.
        # (srun's own log is no proof: slurmstepd's "*** STEP ... CANCELLED" line reaches it only
        # sometimes; CI once saw just "Job step aborted" and "task 0: Terminated".)
        assert srun.wait(timeout=20) != 0, log.read_text()
        state = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
        assert "JobState=CANCELLED" in state, f"{state}\nsrun said:\n{log.read_text()}"
        assert not any(name in j for j in slurm_cluster.jobs())
        assert cancel_by_name(name) == []
    finally:
        if srun.poll() is None:
            os.killpg(srun.pid, signal.SIGKILL)
            srun.wait()


HANGING_SLURM_JOB = """
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import GpuClusterWarning
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster


def test_rank_1_hangs_under_slurm(gpucluster_session):
    import os

    spec = ClusterSpec(hosts=((os.environ["TEST_SLURM_NODE"], 2),), nproc_per_node=2, source="slurm")
    cluster = Cluster(spec, get_launcher("slurm"), gpucluster_session.results_dir / "jobs")
    cluster.run("pytest_gpucluster.workloads.basic:hang_on_rank", options={"rank": 1}, timeout=300)
"""


def _slurm_id(slurm_cluster, name: str) -> str:
    [line] = [line for line in slurm_cluster.jobs() if name in line]
    return line.split()[0]


def _cancelled_through_slurm(slurm_cluster, slurm_id: str) -> bool:
    """slurmctld logged a kill request for the job: scancel ran, not just a local kill."""
    log = (slurm_cluster.dir / "slurmctld.log").read_text(errors="replace")
    return f"REQUEST_KILL_JOB JobId={slurm_id} " in log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill-9"])
def test_killing_pytest_cancels_the_step_and_leaves_no_process(slurm_cluster, spawn_pytest, sig):
    """SIGTERM: the plugin's Ctrl-C path runs the cancel; kill -9: the guard around srun does."""
    run = spawn_pytest(HANGING_SLURM_JOB, "--hw=cpu-local", env={"TEST_SLURM_NODE": slurm_cluster.node})
    job = run.wait_for_hung_rank()
    slurm_id = _slurm_id(slurm_cluster, job.name)
    os.kill(run.pid, sig)
    gone = slurm_cluster.wait_until(lambda: not any(job.name in line for line in slurm_cluster.jobs()), 15)
    assert gone, slurm_cluster.jobs()
    assert slurm_cluster.steps() == [], slurm_cluster.steps()
    assert slurm_cluster.wait_until(lambda: _no_worker_left(job.name), 15)
    assert _cancelled_through_slurm(slurm_cluster, slurm_id)
    expected = pytest.ExitCode.INTERRUPTED if sig == signal.SIGTERM else -signal.SIGKILL
    assert run.wait(30) == expected, run.output()


ENV_SEEN = ["SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES", "FI_PROVIDER",
            "LD_LIBRARY_PATH", "SLURM_CPUS_PER_TASK"]  # fmt: skip


def _cuda_cluster(slurm_cluster, tmp_path, **launcher) -> Cluster:
    """A CUDA profile's launcher (the GPU request, no --overcommit) on the test node. The ranks use
    gloo and take no GPU: there is none here, only Slurm's count of them."""
    spec = ClusterSpec(hosts=((slurm_cluster.node, 1),), nproc_per_node=1, backend="gloo", source="slurm")
    return Cluster(spec, get_launcher("slurm", mode="tasks", device="cuda", **launcher), tmp_path)


def test_a_cuda_profile_gets_its_gpus_from_slurm_and_the_controllers_environment(
    slurm_cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x")
    monkeypatch.setenv("FI_PROVIDER", "efa")
    cluster = _cuda_cluster(slurm_cluster, tmp_path, gpus_per_node=8, cpus_per_node=2)
    result = cluster.run(
        "pytest_gpucluster.workloads.node_probe:probe", options={"env_patterns": ENV_SEEN}, timeout=90,
        init_process_group=False, pick_device=False,
    )  # fmt: skip
    (command,) = result.commands
    assert "--gpus-per-node=8" in command.argv and "--cpus-per-task=2" in command.argv
    assert "--overcommit" not in command.argv
    [seen] = [v["env"] for v in result.values]
    # The job was accepted with its GPUs: the task sees Slurm's count of them.
    assert seen["SLURM_GPUS_ON_NODE"] == "8", seen
    assert seen["SLURM_CPUS_PER_TASK"] == "2", seen
    # Set only on the controller, carried into the task (srun --export=ALL).
    assert (seen["LD_LIBRARY_PATH"], seen["FI_PROVIDER"]) == ("/opt/x", "efa"), seen


def test_more_gpus_than_the_node_has_is_refused_by_slurm_naming_why(slurm_cluster, tmp_path):
    cluster = _cuda_cluster(slurm_cluster, tmp_path, gpus_per_node=9, gpu_request="gres")
    result = cluster.run(basic.noop, timeout=60, init_process_group=False, check=False)
    assert not result.ok and "--gres=gpu:9" in result.commands[0].argv
    said = result.agent_logs[0].read_text()
    assert "Requested node configuration is not available" in said, said
    assert "never started" in result.failure_report()


def test_one_gpu_per_task_gives_each_rank_its_own_device(slurm_cluster, tmp_path):
    """Sites that bind one GPU per task: each rank sees one device (its CUDA_VISIBLE_DEVICES), and
    the worker's ``local_rank % visible`` then picks device 0 of it."""
    spec = ClusterSpec(hosts=((slurm_cluster.node, 2),), nproc_per_node=2, backend="gloo", source="slurm")
    with pytest.warns(GpuClusterWarning, match="each rank sees only its own GPU, so CUDA IPC"):
        launcher = get_launcher(
            "slurm", mode="tasks", device="cuda", gpus_per_node=2, gpu_request="gpus-per-task"
        )
    result = Cluster(spec, launcher, tmp_path).run(
        "pytest_gpucluster.workloads.node_probe:probe", options={"env_patterns": ENV_SEEN}, timeout=90,
        init_process_group=False, pick_device=False,
    )  # fmt: skip
    assert "--gpus-per-task=1" in result.commands[0].argv
    visible = [v["env"].get("CUDA_VISIBLE_DEVICES") for v in result.values]
    assert all(v is not None and len(v.split(",")) == 1 for v in visible), visible


def test_tasks_mode_gives_every_rank_the_nodes_gpus_and_the_device_of_its_slurm_localid(
    slurm_cluster, tmp_path
):
    """NVLink needs the ranks of a node to see each other's GPUs (CUDA IPC): tasks mode asks for the
    node's GPUs per node with no per-task binding, so every task sees all of them, and each rank
    takes device SLURM_LOCALID (`_worker.device_index`): distinct devices, none shared. (Slurm
    22.05's --gpu-bind=none would leave CUDA_VISIBLE_DEVICES unset: the whole node's GPUs.)"""
    spec = ClusterSpec(hosts=((slurm_cluster.node, 2),), nproc_per_node=2, backend="gloo", source="slurm")
    launcher = get_launcher("slurm", mode="tasks", device="cuda", gpus_per_node=2)
    result = Cluster(spec, launcher, tmp_path).run(
        "pytest_gpucluster.workloads.node_probe:probe", options={"env_patterns": [*ENV_SEEN, "SLURM_LOCALID"]},
        timeout=90, init_process_group=False, pick_device=False,
    )  # fmt: skip
    argv = result.commands[0].argv
    assert "--gpus-per-node=2" in argv, argv
    assert not any(a.startswith(("--gpus-per-task", "--gpu-bind")) for a in argv)
    seen = [(r.local_rank, r.value["env"]) for r in result.ranks]
    visible = [len(env["CUDA_VISIBLE_DEVICES"].split(",")) for _, env in seen]
    assert visible == [2, 2], seen  # every task sees both of the node's GPUs
    assert [int(env["SLURM_LOCALID"]) for _, env in seen] == [local for local, _ in seen] == [0, 1]
    devices = [_worker.device_index(local, count) for (local, _), count in zip(seen, visible, strict=True)]
    assert devices == [0, 1]  # one GPU each, as NVLink P2P needs


SBATCH_TEST = """
def test_one_step(cluster):
    result = cluster.run("pytest_gpucluster.workloads.basic:all_reduce_sum", timeout=90)
    assert [v["sum"] for v in result.values] == [3.0, 3.0], result.failure_report()
    assert result.commands[0].argv[0] == "srun", result.commands[0].argv
"""


def test_an_sbatch_script_is_the_controller_and_launches_steps_of_its_job(slurm_cluster, tmp_path):
    """README's batch recipe: a script that runs plain ``pytest`` (no --launcher, no hostfile)
    inside ``sbatch`` tests the job's nodes through srun steps of that job, and says so."""
    (tmp_path / "test_in_batch.py").write_text(SBATCH_TEST)
    out = tmp_path / "batch.out"
    env = {
        k: v
        for k, v in slurm_cluster.env.items()
        if not k.startswith(("GPUCLUSTER_", "PYTEST_", "_GPUCLUSTER"))
    }
    script = (
        f"cd {tmp_path} && PYTHONPATH={REPO} {sys.executable} -m pytest test_in_batch.py --hw=cpu-local "
        f"-p no:cacheprovider -p no:xdist --results-dir={tmp_path / 'r'}"
    )
    done = subprocess.run(
        ["sbatch", "--wait", "--nodes=1", "--ntasks=2", "--job-name=gc-batch", f"--output={out}", "--wrap", script],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    said = out.read_text() if out.exists() else done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "launcher slurm (inside Slurm allocation" in said and "1 passed" in said, said
