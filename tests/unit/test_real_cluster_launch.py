"""What a real cluster's launch needs, as argv and environment (no cluster): the GPU request of a
CUDA profile under srun, the environment every backend forwards, secrets kept out of what people
see and of job.json, the rank start-up deadline that grows with the node count, and the device a
rank takes. The real Slurm (tests/integration/test_slurm.py) and network-namespace runs
(tests/integration/test_login_node_netns.py, test_env_forwarding_netns.py) do the same for real."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import GpuClusterWarning, SettingsError
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.base import JobSpec, LaunchCommand
from pytest_gpucluster.launch.deepspeed import DeepSpeedLauncher
from pytest_gpucluster.launch.forward_env import DEFAULT_PATTERNS, check_pattern, forwarded_env
from pytest_gpucluster.launch.job import Cluster, rendezvous_deadline
from pytest_gpucluster.launch.mpi import MpirunLauncher
from pytest_gpucluster.launch.slurm import SlurmLauncher
from pytest_gpucluster.workloads import _worker
from pytest_gpucluster.workloads._runtime import RankIdentity


def job(**kw) -> JobSpec:
    base = dict(
        job_id="j1", job_dir=Path("/r/j1"), workload="m:f", hosts=("gpu01", "gpu02"), nproc_per_node=8,
        env={"GPUCLUSTER_JOB_ID": "j1"}, python="/py", timeout_s=600.0, rendezvous_timeout_s=122.0,
        rendezvous_port=20100,
    )  # fmt: skip
    base.update(kw)
    return JobSpec(**base)


def srun_options(launcher: SlurmLauncher, **kw) -> list[str]:
    return launcher.srun_options(job(**kw))


# --------------------------------------------------------------------------- srun for CUDA profiles


def test_a_cuda_profile_requests_its_gpus_and_never_overcommits():
    options = srun_options(SlurmLauncher(device="cuda", gpus_per_node=8, cpus_per_node=96))
    assert "--gpus-per-node=8" in options and "--overcommit" not in options
    assert "--cpus-per-task=96" in options  # agent mode: one task (a torchrun agent) per node
    assert "--overcommit" in srun_options(SlurmLauncher(device="cpu"))


def test_the_gpu_request_takes_the_form_the_profile_chooses():
    gres = srun_options(SlurmLauncher(device="cuda", gpus_per_node=8, gpu_request="gres"))
    with pytest.warns(GpuClusterWarning, match="the profile's launch.slurm_gpu_request is gpus-per-task"):
        launcher = SlurmLauncher(
            mode="tasks", device="cuda", gpus_per_node=8, gpu_request="gpus-per-task", cpus_per_node=96
        )
    per_task = srun_options(launcher)
    assert "--gres=gpu:8" in gres and not any(o.startswith("--gpus-per-node") for o in gres)
    assert "--gpus-per-task=1" in per_task and "--cpus-per-task=12" in per_task  # 8 tasks share the node


def test_tasks_mode_keeps_nvlink_gpus_per_node_unbound_and_warns_on_per_task_binding(recwarn, monkeypatch):
    for key in ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK", "SLURM_GPU_BIND"):
        monkeypatch.delenv(key, raising=False)
    options = srun_options(SlurmLauncher(mode="tasks", device="cuda", gpus_per_node=8))
    assert "--gpus-per-node=8" in options and not any(
        o.startswith(("--gpus-per-task", "--gpu-bind")) for o in options
    )
    assert not recwarn.list
    for site in ("--gpus-per-task=1", "--gpu-bind=closest", "--tres-per-task=gres:gpu:1"):
        with pytest.warns(
            GpuClusterWarning,
            match=rf"--launcher-args holds {re.escape(site)}\): each rank sees only its own GPU",
        ):
            launcher = SlurmLauncher(mode="tasks", device="cuda", gpus_per_node=8, extra_args=site)
        assert srun_options(launcher)[-1] == site  # the site's choice runs, warned about
    # an sbatch --gpus-per-task reaches every srun step through the environment
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "1")
    with pytest.warns(
        GpuClusterWarning, match="the environment, from sbatch/salloc, holds SLURM_GPUS_PER_TASK=1"
    ):
        SlurmLauncher(mode="tasks", device="cuda", gpus_per_node=8)


def test_a_rank_takes_its_local_rank_among_the_gpus_it_sees():
    assert [_worker.device_index(local, 8) for local in range(8)] == list(range(8))
    assert [_worker.device_index(local, 1) for local in range(4)] == [0, 0, 0, 0]  # one bound GPU each


def test_the_sites_own_gpu_request_wins_and_cpu_bind_is_passed():
    launcher = SlurmLauncher(
        device="cuda", gpus_per_node=8, cpu_bind="cores", extra_args="--partition=gpu --gres=gpu:h100:8"
    )
    options = srun_options(launcher)
    assert options[-2:] == ["--partition=gpu", "--gres=gpu:h100:8"]
    assert not any(o.startswith("--gpus-per-node") for o in options) and "--cpu-bind=cores" in options


def test_a_cuda_job_without_any_gpu_request_is_refused_before_it_runs():
    with pytest.raises(SettingsError, match="a CUDA job under Slurm needs its GPUs requested"):
        SlurmLauncher(device="cuda", gpus_per_node=None)
    with pytest.raises(SettingsError, match="is not one of gpus-per-node, gres, gpus-per-task"):
        SlurmLauncher(device="cuda", gpus_per_node=8, gpu_request="gpus")


# --------------------------------------------------------------------------- the forwarded environment

CONTROLLER = {
    "PATH": "/opt/site/bin:/usr/bin",
    "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib",
    "FI_PROVIDER": "efa",
    "NCCL_DEBUG": "INFO",
    "HF_TOKEN": "hf_secret",
    "CUDA_VISIBLE_DEVICES": "0",
    "HOME": "/home/me",
    "MY_SITE_LICENSE": "server:1",
}


def test_the_default_list_and_extra_patterns_pick_the_variables():
    got = forwarded_env(DEFAULT_PATTERNS, CONTROLLER)
    assert set(got) == {"PATH", "LD_LIBRARY_PATH", "FI_PROVIDER", "NCCL_DEBUG", "HF_TOKEN"}
    # The login node's device visibility is the node's business, unless named outright.
    assert "CUDA_VISIBLE_DEVICES" in forwarded_env((*DEFAULT_PATTERNS, "CUDA_VISIBLE_DEVICES"), CONTROLLER)
    assert "MY_SITE_LICENSE" in forwarded_env((*DEFAULT_PATTERNS, "MY_SITE_*"), CONTROLLER)
    with pytest.raises(SettingsError, match=r"--forward-env: 'A B' is not a variable name or pattern"):
        check_pattern("A B", "--forward-env")


@pytest.fixture
def controller_env(monkeypatch):
    for name, value in CONTROLLER.items():
        monkeypatch.setenv(name, value)


def test_every_backend_carries_the_forwarded_variables(controller_env, tmp_path):
    spec = ClusterSpec(hosts=(("gpu01", 8), ("gpu02", 8)), nproc_per_node=8, backend="gloo")
    launchers = {
        "torchrun": (get_launcher("torchrun"), "ssh {host}"),
        "mpirun": (MpirunLauncher(allow_run_as_root=False), None),
        "slurm": (SlurmLauncher(), None),
        "deepspeed": (DeepSpeedLauncher(), None),
    }
    for name, (launcher, remote) in launchers.items():
        cluster = Cluster(spec, launcher, tmp_path / name, remote_exec=remote)
        commands = cluster.commands_for("m:f", timeout=60)
        argv = " ".join(" ".join(c.argv) for c in commands)
        env = {k: v for c in commands for k, v in c.env.items()}
        if name == "torchrun":  # ssh forwards nothing: `env K=V` travels in the command
            assert " env " in argv and "LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib" in argv
            assert "FI_PROVIDER=efa" in argv
        elif name == "mpirun":
            assert "-x LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib" in argv and "-x FI_PROVIDER=efa" in argv
        else:  # srun --export=ALL, DeepSpeed's env file: the variables are in the launcher's environment
            assert env["LD_LIBRARY_PATH"] == "/opt/amazon/ofi-nccl/lib" and env["FI_PROVIDER"] == "efa"
        assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES=" not in argv
    job_spec = Cluster(spec, DeepSpeedLauncher(), tmp_path / "ds").job_spec("m:f")
    assert "FI_PROVIDER=efa\n" in DeepSpeedLauncher().env_file_text(job_spec)


def test_secrets_are_forwarded_but_never_shown_nor_written_to_job_json(controller_env, tmp_path):
    spec = ClusterSpec(hosts=(("gpu01", 1), ("gpu02", 1)), nproc_per_node=1, backend="gloo")
    cluster = Cluster(spec, get_launcher("torchrun"), tmp_path, remote_exec="ssh {host}")
    [first, _] = cluster.commands_for("m:f", timeout=60)
    assert "HF_TOKEN=hf_secret" in first.argv[-1] or any("hf_secret" in a for a in first.argv)
    shown = first.shell_line()
    assert "hf_secret" not in shown and "HF_TOKEN=<redacted>" in shown
    assert (
        "hf_secret"
        not in LaunchCommand("h", ("env", "HF_TOKEN=hf_secret", "x"), {"HF_TOKEN": "y"}).shell_line()
    )
    local = Cluster(
        ClusterSpec.from_local(1, "gloo"), get_launcher("torchrun"), tmp_path / "local",
        default_env={"NCCL_IB_HCA": "=mlx5_0"},
    )  # fmt: skip
    result = local.run("pytest_gpucluster.workloads.basic:noop", timeout=60, init_process_group=False)
    written = json.loads((result.job_dir / "job.json").read_text())["env"]
    # What the job sets is there; what was only forwarded reached the rank through the launcher.
    assert written == {"NCCL_IB_HCA": "=mlx5_0"}


# --------------------------------------------------------------------------- deadlines and devices


def test_the_start_up_deadline_grows_with_the_node_count_and_is_configurable(tmp_path):
    assert rendezvous_deadline(1) == 120.0 and rendezvous_deadline(64) == 246.0
    assert rendezvous_deadline(512, base_s=300.0) == 300.0 + 2.0 * 511
    spec = ClusterSpec(hosts=tuple((f"n{i}", 1) for i in range(16)), nproc_per_node=1, backend="gloo")
    cluster = Cluster(
        spec, get_launcher("torchrun"), tmp_path, remote_exec="ssh {host}", rendezvous_timeout=200
    )
    assert cluster.job_spec("m:f", timeout=3600).rendezvous_timeout_s == 230.0
    torchrun = cluster.commands_for("m:f", timeout=3600)[0].node_argv
    assert "--rdzv-conf=join_timeout=230" in torchrun
    assert cluster.job_spec("m:f", timeout=100).rendezvous_timeout_s == 100.0  # never past the job's own


class _FakeCuda:
    """torch.cuda as a node that shows ``visible`` devices to this rank (what Slurm's per-task
    binding or CUDA_VISIBLE_DEVICES leave it)."""

    def __init__(self, visible: int) -> None:
        self.visible, self.chosen = visible, None

    def is_available(self) -> bool:
        return self.visible > 0

    def device_count(self) -> int:
        return self.visible

    def set_device(self, index: int) -> None:
        self.chosen = index

    def get_device_properties(self, index: int):
        return types.SimpleNamespace(uuid=f"2b6e0d5c-0000-0000-0000-00000000000{index}")


@pytest.mark.parametrize(
    ("visible", "local_rank", "device"), [(8, 5, "cuda:5"), (1, 5, "cuda:0"), (4, 6, "cuda:2")]
)
def test_a_rank_takes_local_rank_modulo_the_visible_devices_and_records_the_gpu(
    monkeypatch, visible, local_rank, device
):
    """Stands for a rank on an 8-GPU node (all visible), under one-GPU-per-task binding, and with 4 visible."""
    import torch

    fake = _FakeCuda(visible)
    monkeypatch.setattr(
        torch,
        "cuda",
        types.SimpleNamespace(**{n: getattr(fake, n) for n in dir(fake) if not n.startswith("_")}),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(visible))))
    identity = RankIdentity(
        rank=local_rank, world_size=8, local_rank=local_rank, local_world_size=8, node_rank=0, host="gpu01"
    )
    gpu: dict = {}
    assert _worker._pick_device(identity, "nccl", gpu) == device
    index = int(device.split(":")[1])
    assert gpu == {"index": index, "visible": visible, "cuda_visible_devices": ",".join(map(str, range(visible))),
                   "uuid": f"GPU-2b6e0d5c-0000-0000-0000-00000000000{index}"}  # fmt: skip


def test_a_cuda_rank_without_a_gpu_fails_naming_host_visible_devices_and_count(monkeypatch):
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    identity = RankIdentity(rank=3, world_size=8, local_rank=3, local_world_size=8, node_rank=0, host="gpu07")
    with pytest.raises(_worker.NoGpuOnRank) as failed:
        _worker._pick_device(identity, "nccl", {})
    text = str(failed.value)
    assert "rank 3 (local rank 3) on gpu07 found no CUDA device under a CUDA profile" in text
    assert "CUDA_VISIBLE_DEVICES=, torch.cuda.device_count()=0" in text
    assert f"torch {torch.__version__}" in text
