"""The per-node probe's facts and the inventory's verdicts, on real recorded `nvidia-smi` outputs.

Each node's GPU seam runs a program: here a stand-in `nvidia-smi` that prints a recorded file
(tests/data/nvidia_smi, see SOURCES.md), exactly as the probe runs the real one where NVML is
missing, and the parent parses what it printed. Stands for: an 8-GPU node's probe on a real
cluster, judged from the login node.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pytest_gpucluster.checks import inventory
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts, node_facts
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.text import failure_message
from pytest_gpucluster.workloads.node_probe import gpu_facts, matching_env, read_node

SMI = Path(__file__).parents[1] / "data" / "nvidia_smi"
H100 = SMI / "smi_h100x8_565.57.01_nvsim.txt"
H100_OLD_DRIVER = SMI / "smi_h100x8_550.54.15_first2_cut_nccl1264.txt"
H800_BUSY = SMI / "smi_h800_8gpu_525.txt"
GH200 = SMI / "smi_gh200_555.42.06_autoinstall.txt"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def stand_in(tmp_path: Path, text: str, code: int = 0, name: str = "nvidia-smi") -> str:
    """An executable that prints ``text`` and exits ``code``, as the node's nvidia-smi."""
    out = tmp_path / f"{name}.out"
    out.write_text(text)
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\ncat '{out}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def without_gpu(text: str, index: int) -> str:
    """The table with one GPU's block (its three lines and the separator after them) removed."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"|   {index}  NVIDIA"))
    return "".join(lines[:start] + lines[start + 4 :])


def facts_from(tmp_path: Path, host: str, text: str, code: int = 0) -> NodeFacts:
    record = {"host": host, "gpu": gpu_facts(smi=stand_in(tmp_path, text, code)), "infiniband": {}}
    return node_facts(record)


@pytest.fixture(scope="module")
def dgx():
    return load_profile("dgx-h100-ib").model


def test_the_seam_runs_nvidia_smi_where_nvml_is_missing_and_the_parent_reads_the_table(tmp_path):
    raw = gpu_facts(smi=stand_in(tmp_path, H100.read_text()))
    # without nvidia-ml-py: "No module named 'pynvml'"; with it (a dependency) and no driver here:
    # "NVML did not initialise (NVMLError_LibraryNotFound ...)"; either way the table is read
    assert raw["source"] == "nvidia-smi" and (
        "No module named" in raw["nvml_why"] or "NVML" in raw["nvml_why"]
    )
    node = node_facts({"host": "gpu-01", "gpu": raw, "infiniband": {}})
    assert node.gpu_count == 8 and set(node.gpu_names) == {"NVIDIA H100 80GB HBM3"}
    assert (node.driver, node.cuda_driver, node.gpu_source) == ("565.57.01", "12.7", "nvidia-smi")
    assert node.gpus[7].bus_id == "00000000:DB:00.0" and node.gpus[0].memory_bytes == 81559 * 2**20
    assert node.processes == ()


def test_a_node_whose_nvidia_smi_cannot_reach_the_driver_lists_no_gpu_and_says_why(tmp_path, dgx):
    node = facts_from(tmp_path, "gpu-04", NO_DRIVER, code=9)
    assert node.gpus == () and "exited with code 9: NVIDIA-SMI has failed" in node.gpu_problem
    [check] = inventory.gpu_count_checks(ClusterFacts((node,), "test"), dgx)
    assert check.failed and "node gpu-04: 0 GPUs, profile wants 8 (" in check.hint
    assert "couldn't communicate with the NVIDIA driver" in node.capabilities()["cuda"]


def test_a_node_with_a_gpu_missing_is_named_and_the_healthy_ones_pass(tmp_path, dgx):
    healthy = facts_from(tmp_path, "gpu-06", H100.read_text())
    short = facts_from(tmp_path, "gpu-07", without_gpu(H100.read_text(), 7))
    checks = inventory.gpu_count_checks(ClusterFacts((healthy, short), "test"), dgx)
    assert [(c.labels["host"], c.value, c.failed) for c in checks] == [
        ("gpu-06", 8, False),
        ("gpu-07", 7, True),
    ]
    message = failure_message(checks[1])
    assert "node gpu-07: 7 GPUs, profile wants 8" in message and "00000000:BA:00.0" in message


def test_a_gh200_is_not_the_h200_a_profile_names(tmp_path):
    node = facts_from(tmp_path, "gh-01", GH200.read_text())
    h200 = load_profile("h200-spectrumx").model
    [check] = inventory.gpu_model_checks(ClusterFacts((node,), "test"), h200)
    assert check.failed and check.value == 0
    assert "'NVIDIA GH200 480GB', not the 'H200' profile h200-spectrumx names" in check.hint


def test_a_node_on_another_driver_is_named_against_the_majority(tmp_path):
    nodes = tuple(facts_from(tmp_path, f"gpu-0{i}", H100.read_text()) for i in (1, 2))
    odd = facts_from(tmp_path, "gpu-05", H100_OLD_DRIVER.read_text())
    assert odd.gpu_count == 2 and odd.gpus[1].memory_bytes is None  # the paste is cut inside GPU 1
    failed = [c for c in inventory.version_checks(ClusterFacts((*nodes, odd), "test")) if c.failed]
    assert sorted(c.metric for c in failed) == ["inventory.same_cuda_driver", "inventory.same_driver"]
    driver = next(c for c in failed if c.metric == "inventory.same_driver")
    assert driver.hint.startswith("node gpu-05: driver 550.54.15 while the others run 565.57.01")


def test_foreign_gpu_processes_are_named_before_anything_is_measured(tmp_path):
    busy = facts_from(tmp_path, "h800-01", H800_BUSY.read_text())
    idle = facts_from(tmp_path, "h100-01", H100.read_text())
    checks = inventory.foreign_process_checks(ClusterFacts((busy, idle), "test"))
    failed = [c for c in checks if c.failed]
    assert len(failed) == 8 and {c.labels["host"] for c in failed} == {"h800-01"}
    assert (
        "GPU 0 (GPU 0) on h800-01 is in use by 1 process(es) that are not part of this run: pid 112523"
        in (failed[0].hint)
    )
    assert [c.labels for c in checks if not c.failed] == [{"host": "h100-01"}]


def test_capabilities_name_the_node_and_why(tmp_path):
    gpus = facts_from(tmp_path, "gpu-01", H100.read_text())
    cpu_torch = NodeFacts(**{**{k: getattr(gpus, k) for k in gpus.__dataclass_fields__}, "cuda_available": False,
                             "torch": "2.13.0+cpu", "nccl_available": False})  # fmt: skip
    facts = ClusterFacts((cpu_torch, NodeFacts(host="gpu-02", error="its probe rank did not answer")), "t")
    unmet = facts.unmet(min_gpus=8, needs=["cuda", "ib", "slurm"])
    assert unmet[0] == "needs 8 GPUs per node: node gpu-02 has 0"
    assert unmet[1].startswith(
        "needs cuda: node gpu-01: lists GPUs (nvidia-smi), but its torch 2.13.0+cpu cannot use them "
        "(torch.cuda.is_available() is False: a CPU-only torch build"
    )
    assert "; node gpu-02: could not be probed (its probe rank did not answer)" in unmet[1]
    assert unmet[2].startswith("needs ib: node gpu-01: no IB device under /sys/class/infiniband")
    assert len(unmet) == 3  # slurm is the launching machine's business


def test_facts_survive_json_and_secrets_never_reach_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("NCCL_IB_HCA", "=mlx5_0")
    monkeypatch.setenv("FI_PROVIDER", "efa")
    env = matching_env(["NCCL_*", "HF_*", "FI_*"])
    assert env["HF_TOKEN"] == "<redacted>" and env["NCCL_IB_HCA"] == "=mlx5_0"
    record = read_node(
        "gpu-01", env_patterns=["NCCL_*", "HF_*", "FI_*"], smi=stand_in(tmp_path, H100.read_text())
    )
    facts = ClusterFacts((node_facts(record),), "probe job j1")
    again = ClusterFacts.from_json(json.loads(json.dumps(facts.to_json())))
    assert again == facts
    assert again.nodes[0].env["FI_PROVIDER"] == "efa" and "hf_abc" not in json.dumps(facts.to_json())


def test_nodes_lacking_a_capability_alike_are_named_in_one_sentence(tmp_path):
    nodes = tuple(facts_from(tmp_path, f"gpu-0{i}", NO_DRIVER, code=9) for i in range(1, 7))
    [sentence] = ClusterFacts(nodes, "t").missing("cuda")
    assert sentence.startswith("nodes gpu-01, gpu-02, gpu-03, gpu-04 and 2 more: lists no GPU (")


class _NoPermission(Exception):
    """What pynvml raises for ``NVML_ERROR_NO_PERMISSION`` (``NVMLError_NoPermission``, value 4)."""

    value = 4


class _StepNvml:
    """An NVML inside a cgroup-constrained Slurm step: GPUs 0 and 1 are this job's, GPU 2's handle
    answers NO_PERMISSION; GPU 1 has MIG enabled."""

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == 2:
            raise _NoPermission("Insufficient Permissions")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:
        return type("Memory", (), {"total": 150_000_000_000})()

    def nvmlDeviceGetPciInfo(self, handle: int) -> object:
        return type("Pci", (), {"busId": f"00000000:0{handle}:00.0"})()

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        return (1, 1) if handle == 1 else (0, 0)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.163.01"

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
        return []


def test_a_gpu_nvml_may_not_read_is_skipped_and_named_and_mig_is_read():
    from pytest_gpucluster.workloads.node_probe import gpu_facts

    raw = gpu_facts(nvml=_StepNvml())
    assert [g["index"] for g in raw["gpus"]] == [0, 1]
    assert raw["skipped"] == ["GPU 2: NVML answered NO_PERMISSION (not this job's GPU)"]
    node = node_facts({"host": "n1", "gpu": raw, "cuda_available": True, "device_count": 1})
    assert (node.gpu_count, node.usable_gpu_count, node.mig_enabled) == (2, 1, (1,))
    assert node.gpus_skipped == ("GPU 2: NVML answered NO_PERMISSION (not this job's GPU)",)
    assert node.cuda_view() == "CUDA can use 1 of 2 (MIG enabled on GPU 1)"
