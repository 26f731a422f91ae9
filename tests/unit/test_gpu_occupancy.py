"""Foreign processes on a run's GPUs: the rank-side NVML listing (through a stand-in NVML module and
for real, where there is none) and the parent's judgement, on process lists recorded from real
machines (tests/data/nvml_processes, see its SOURCES.md)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gpucluster.cluster.gpu_occupancy import PID_MAX_LIMIT, foreign_gpu_use, gpu_processes
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.workloads.gpu_processes import gpu_compute_processes

DATA = Path(__file__).parents[1] / "data" / "nvml_processes"
GiB = 2**30


def go_nvml_records(text: str) -> list[dict]:
    """go-nvml's printout as the records `gpu_compute_processes` returns (no uuid was printed)."""
    records, device = [], None
    for line in text.splitlines():
        if found := re.match(r"Found \d+ processes on device (\d+)", line):
            device = int(found.group(1))
        elif found := re.search(r"ProcessInfo: \{Pid:(\d+) UsedGpuMemory:(\d+)\}", line):
            records.append(
                {"gpu": device, "uuid": f"GPU-{device}", "pid": int(found.group(1)),
                 "used_bytes": int(found.group(2)), "name": None}
            )  # fmt: skip
    return records


def smi_table_records(text: str) -> list[dict]:
    """nvidia-smi's process rows that NVML's compute list holds (type C or C+G)."""
    row = re.compile(r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(C|G|C\+G)\s+(.*?)\s+(\d+)MiB \|$")
    records = []
    for line in text.splitlines():
        if (found := row.match(line)) and "C" in found.group(3):
            records.append(
                {"gpu": int(found.group(1)), "uuid": f"GPU-{found.group(1)}", "pid": int(found.group(2)),
                 "used_bytes": int(found.group(5)) * 2**20, "name": found.group(4)}
            )  # fmt: skip
    return records


def torch_records(text: str) -> list[dict]:
    records, device = [], None
    for line in text.splitlines():
        if found := re.match(r"GPU:(\d+)$", line):
            device = int(found.group(1))
        elif found := re.match(r"process\s+(\d+) uses\s+([\d.]+) MB GPU memory", line):
            records.append(
                {"gpu": device, "uuid": f"GPU-{device}", "pid": int(found.group(1)),
                 "used_bytes": int(float(found.group(2)) * 2**20), "name": None}
            )  # fmt: skip
    return records


V100 = go_nvml_records((DATA / "go_nvml_21_v100_440.txt").read_text())
SMI = smi_table_records((DATA / "nvitop_152_smi_processes.txt").read_text())
TORCH = torch_records((DATA / "torch_44616_list_gpu_processes.txt").read_text())


def test_the_recordings_read_as_expected():
    assert [(r["gpu"], r["pid"], r["used_bytes"]) for r in V100] == [
        (0, 9980, 6498025472),
        (0, 10121, 6521094144),
    ]
    # The nvidia-smi header of that box: 12427 MiB in use, about the two processes' sum.
    assert sum(r["used_bytes"] for r in V100) / 2**20 == pytest.approx(12427, rel=0.01)
    assert [(r["gpu"], r["pid"]) for r in SMI] == [(0, 10734), (1, 10734)]  # graphics-only clients left out
    assert [(r["gpu"], r["pid"]) for r in TORCH] == [(0, 79749)]


def test_a_process_that_is_not_ours_is_named_with_its_gpu_host_and_memory():
    foreign, scrambled = foreign_gpu_use({"v100-node": V100}, {"v100-node": {9980}})
    assert scrambled == []
    [use] = foreign
    assert (use.host, use.gpu, [p.pid for p in use.processes]) == ("v100-node", 0, [10121])
    assert use.sentence().startswith(
        "GPU 0 (GPU-0) on v100-node is in use by 1 process(es) that are not part of this run: pid 10121, 6.07 GiB."
    )
    assert foreign_gpu_use({"v100-node": V100}, {"v100-node": {9980, 10121}}) == ([], [])


def test_one_process_on_two_gpus_is_named_on_each_and_nodes_are_judged_apart():
    foreign, _ = foreign_gpu_use({"desk": SMI, "node9": TORCH}, {"desk": set(), "node9": {79749}})
    assert [(u.host, u.gpu, [p.pid for p in u.processes]) for u in foreign] == [
        ("desk", 0, [10734]),
        ("desk", 1, [10734]),
    ]
    assert "pid 10734 (...-x86_64-Release/abcdefgh/foo_bar), 0.16 GiB" in foreign[0].sentence()
    # A pid is only ours on the node where it runs.
    foreign, _ = foreign_gpu_use({"node9": TORCH}, {"desk": {79749}})
    assert [u.gpu for u in foreign] == [0]


def test_unknown_memory_is_said_so():
    record = {**TORCH[0], "used_bytes": None}
    [use], _ = foreign_gpu_use({"mig-node": [record]}, {})
    assert "pid 79749, memory unknown" in use.sentence()


def test_a_scrambled_answer_is_named_not_taken_for_a_process():
    # gpuopenanalytics/pynvml#50: bindings of another nvmlProcessInfo_t layout swap pid and memory.
    swapped = [{**r, "pid": r["used_bytes"], "used_bytes": r["pid"]} for r in V100]
    foreign, scrambled = foreign_gpu_use({"v100-node": swapped}, {})
    assert foreign == []
    assert [(s.gpu, s.pid) for s in scrambled] == [(0, 6498025472), (0, 6521094144)]
    assert scrambled[0].pid > PID_MAX_LIMIT
    assert "holds pid 6498025472, which no Linux process can have" in scrambled[0].sentence()
    assert "upgrade nvidia-ml-py" in scrambled[0].sentence()


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"gpu": "0", "uuid": "GPU-0", "pid": 1}, "'gpu' is '0', expected int"),
        ({"gpu": 0, "pid": 1}, "'uuid' is None, expected str"),
        ({"gpu": 0, "uuid": "GPU-0", "pid": 1, "used_bytes": -5}, "'used_bytes' is -5"),
        ("pid 1", "is a str, expected a mapping"),
    ],
)
def test_a_malformed_record_names_the_host_and_key(record, says):
    with pytest.raises(ParseError, match=re.escape("GPU process record 0 from node3")) as info:
        gpu_processes("node3", [record])
    assert says in str(info.value)


# --------------------------------------------------------------------------- the rank side


class FakeNvml:
    """The pynvml calls `gpu_compute_processes` makes, answering with the V100 recording."""

    def __init__(self, records: list[dict], fail: str | None = None) -> None:
        self.records = records
        self.fail = fail

    def nvmlDeviceGetCount(self) -> int:
        return 1 + max(r["gpu"] for r in self.records)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}".encode()  # older bindings return bytes

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
        if self.fail:
            raise RuntimeError(self.fail)
        return [
            SimpleNamespace(pid=r["pid"], usedGpuMemory=r["used_bytes"])
            for r in self.records
            if r["gpu"] == handle
        ]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid == 10121:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return "python"


def test_the_rank_side_lists_every_gpus_compute_processes():
    records, skipped = gpu_compute_processes(FakeNvml(V100))
    assert skipped is None
    assert records == [
        {"gpu": 0, "uuid": "GPU-0", "pid": 9980, "used_bytes": 6498025472, "name": "python"},
        {"gpu": 0, "uuid": "GPU-0", "pid": 10121, "used_bytes": 6521094144, "name": None},
    ]
    assert foreign_gpu_use({"n": records}, {"n": {9980}})[0][0].processes[0].pid == 10121


def test_an_nvml_error_half_way_gives_a_reason_not_half_a_list():
    records, skipped = gpu_compute_processes(FakeNvml(V100, fail="NVML_ERROR_GPU_IS_LOST"))
    assert (
        records == []
        and skipped == "NVML could not list the GPUs' processes (RuntimeError: NVML_ERROR_GPU_IS_LOST)"
    )


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here")
def test_without_nvml_the_reason_names_what_is_missing():
    records, skipped = gpu_compute_processes()
    assert records == [] and skipped.startswith("pynvml is not importable") and "nvidia-ml-py" in skipped
