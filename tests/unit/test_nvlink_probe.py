"""workloads/nvlink_probe.py without a GPU: NVML through a stand-in pynvml that answers as the
driver does (field values with a per-field return code, NotSupported on links a GPU lacks), and
nvidia-smi through recorded real outputs."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_gpucluster.workloads import nvlink_probe
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip
from pytest_gpucluster.workloads.nvlink_probe import CounterReader, inventory, nvml_links, read_topology_text

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
NOT_SUPPORTED = 3
H100_MBPS = 26562  # what NVML_FI_DEV_NVLINK_GET_SPEED gives on Hopper; nvidia-smi prints 26.562 GB/s


class NVMLError(Exception):
    pass


@dataclass
class Gpu:
    name: str = "NVIDIA H100 80GB HBM3"
    bus: str = "00000000:18:00.0"
    states: list[int] = field(default_factory=lambda: [1] * 18)
    speed_mbps: int | None = H100_MBPS
    common_mbps: int | None = H100_MBPS
    link_count_field: bool = True
    throughput_fields: bool = True
    util_units: int | None = None  # NVML_NVLINK_COUNTER_UNIT_*; None: the call is not supported
    tx_kib: dict[int, int] = field(default_factory=dict)
    rx_kib: dict[int, int] = field(default_factory=dict)


class FakeNvml:
    """The slice of pynvml the probe calls, answering as NVML does."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Gpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: Gpu) -> str:
        return gpu.name

    def nvmlDeviceGetPciInfo(self, gpu: Gpu) -> Any:
        return SimpleNamespace(busId=gpu.bus.encode())

    def nvmlDeviceGetNvLinkState(self, gpu: Gpu, link: int) -> int:
        if link >= len(gpu.states):
            raise NVMLError("Not Supported")
        return gpu.states[link]

    def nvmlDeviceGetNvLinkVersion(self, gpu: Gpu, link: int) -> int:
        return 4

    def _value(self, gpu: Gpu, fid: int, scope: int) -> Any:
        ok = SimpleNamespace(nvmlReturn=0, valueType=3, value=None)
        number: int | None = None
        if fid == nvlink_probe.FI_LINK_COUNT and gpu.link_count_field:
            number, ok.valueType = len(gpu.states), 1
        elif fid == nvlink_probe.FI_GET_SPEED and gpu.speed_mbps is not None and scope < len(gpu.states):
            number, ok.valueType = gpu.speed_mbps if gpu.states[scope] else 0, 1
        elif fid == nvlink_probe.FI_SPEED_COMMON and gpu.common_mbps is not None:
            number, ok.valueType = gpu.common_mbps, 1
        elif fid in (nvlink_probe.FI_DATA_TX, nvlink_probe.FI_DATA_RX) and gpu.throughput_fields:
            number = (gpu.tx_kib if fid == nvlink_probe.FI_DATA_TX else gpu.rx_kib).get(scope, 0)
        if number is None:
            return SimpleNamespace(nvmlReturn=NOT_SUPPORTED, valueType=0, value=SimpleNamespace(dVal=0.0))
        ok.value = SimpleNamespace(uiVal=number, ullVal=number)
        return ok

    def nvmlDeviceGetFieldValues(self, gpu: Gpu, ids: list[tuple[int, int]]) -> list[Any]:
        return [self._value(gpu, fid, scope) for fid, scope in ids]

    def nvmlDeviceGetNvLinkUtilizationControl(self, gpu: Gpu, link: int, counter: int) -> Any:
        if gpu.util_units is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(units=gpu.util_units, pktfilter=0xFF)

    def nvmlDeviceGetNvLinkUtilizationCounter(self, gpu: Gpu, link: int, counter: int) -> tuple[int, int]:
        return gpu.rx_kib.get(link, 0) * 1024, gpu.tx_kib.get(link, 0) * 1024  # NVML returns (rx, tx)


def ctx(tmp_path: Path) -> RankContext:
    return RankContext(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, host="node0",
        device="cpu", backend="gloo", job_dir=tmp_path,
    )  # fmt: skip


def recorded(name: str):
    def smi(argv: list[str]) -> str:
        smi.calls.append(argv)
        return (DATA / name).read_text()

    smi.calls = []
    return smi


# --------------------------------------------------------------------------------------------
# links
# --------------------------------------------------------------------------------------------


def test_links_of_an_h100_with_one_link_down():
    states = [1] * 18
    states[5] = 0
    links = nvml_links(FakeNvml([]), Gpu(states=states))
    assert list(links) == [str(n) for n in range(18)]
    assert links["0"] == {"active": True, "speed_gbs": 26.562, "version": 4}
    assert links["5"] == {"active": False, "speed_gbs": None, "version": 4}


def test_a_gpu_without_nvlink_has_no_links():
    gpu = Gpu(states=[], link_count_field=False)
    assert nvml_links(FakeNvml([gpu]), gpu) == {}


def test_an_older_driver_without_per_link_speed_gives_the_common_speed_and_counts_links_itself():
    gpu = Gpu(states=[1] * 6, speed_mbps=None, common_mbps=25781, link_count_field=False)
    links = nvml_links(FakeNvml([gpu]), gpu)
    assert len(links) == 6
    assert {link["speed_gbs"] for link in links.values()} == {25.781}


# --------------------------------------------------------------------------------------------
# inventory
# --------------------------------------------------------------------------------------------


def test_inventory_reads_every_gpu_from_nvml_and_the_topology_text(tmp_path):
    nvml = FakeNvml([Gpu(bus=f"00000000:{b:02X}:00.0") for b in (0x18, 0x2A)])
    smi = recorded("topo_dgx_h100_13nic.txt")
    value = inventory(ctx(tmp_path), nvml=nvml, smi=smi)
    assert smi.calls == [["nvidia-smi", "topo", "-m"]]
    assert value["host"] == "node0" and value["links_source"] == "NVML"
    assert sorted(value["gpus"]) == ["0", "1"]
    assert value["gpus"]["1"]["pci_bus_id"] == "00000000:2A:00.0"
    assert len(value["gpus"]["0"]["links"]) == 18
    assert "GPU0     X      NV18" in value["topo_text"] and value["topo_error"] is None


def test_without_nvml_the_links_come_from_nvidia_smi_nvlink_s(tmp_path, monkeypatch):
    monkeypatch.setattr(nvlink_probe, "load_nvml", lambda: (None, "pynvml is not importable"))
    answers = {"-s": "nvlink_s_v100_inactive_elided.txt", "-m": "topo_dgx1_v100_old_mlx5_columns.txt"}

    def smi(argv: list[str]) -> str:
        return (DATA / answers[argv[-1]]).read_text()

    value = inventory(ctx(tmp_path), smi=smi)
    assert value["links_source"] == "nvidia-smi nvlink -s (pynvml is not importable)"
    links = value["gpus"]["3"]["links"]
    assert links["0"] == {"active": True, "speed_gbs": 25.781, "version": None}
    assert links["3"]["active"] is False and links["5"]["active"] is False


def test_without_nvml_or_nvidia_smi_the_inventory_skips_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(nvlink_probe, "load_nvml", lambda: (None, "pynvml is not importable (No module)"))
    monkeypatch.setattr(nvlink_probe.shutil, "which", lambda name: None)
    with pytest.raises(
        WorkloadSkip, match=r"on node0: pynvml is not importable \(No module\), and there is no nvidia-smi"
    ):
        inventory(ctx(tmp_path))


def test_topology_text_failures_become_reasons():
    def fails(argv):
        raise subprocess.CalledProcessError(
            9, argv, output="", stderr="NVIDIA-SMI has failed because it couldn't communicate"
        )

    assert read_topology_text(fails) == (
        None,
        "nvidia-smi topo -m exited with code 9: NVIDIA-SMI has failed because it couldn't communicate",
    )

    def missing(argv):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    text, why = read_topology_text(missing)
    assert text is None and why.startswith("nvidia-smi topo -m could not run: ")


# --------------------------------------------------------------------------------------------
# counters
# --------------------------------------------------------------------------------------------


def test_counters_from_nvml_field_values_per_active_link_in_bytes():
    states = [1, 1, 0, 1]
    gpu = Gpu(states=states, tx_kib={0: 10, 1: 20, 3: 30}, rx_kib={0: 1, 1: 2, 3: 3})
    reader = CounterReader.find(FakeNvml([gpu]), gpu, gpu.bus)
    assert reader.source == "NVML field values NVLINK_THROUGHPUT_DATA_TX/RX"
    assert reader.read() == {"0": (10 * 1024, 1024), "1": (20 * 1024, 2048), "3": (30 * 1024, 3072)}
    gpu.tx_kib[1] = 25
    assert reader.read()["1"] == (25 * 1024, 2048)  # read again: the counters are live


def test_counters_from_the_deprecated_utilization_counter_only_when_it_counts_bytes():
    gpu = Gpu(states=[1, 1], throughput_fields=False, util_units=2, tx_kib={0: 5, 1: 6}, rx_kib={0: 7, 1: 8})
    reader = CounterReader.find(FakeNvml([gpu]), gpu, gpu.bus, smi=None)
    assert reader.source.startswith("NVML nvmlDeviceGetNvLinkUtilizationCounter")
    assert reader.read() == {"0": (5 * 1024, 7 * 1024), "1": (6 * 1024, 8 * 1024)}


def test_counters_fall_back_to_nvidia_smi_gt_d_for_this_gpu(monkeypatch):
    gpu = Gpu(states=[1] * 8, throughput_fields=False, util_units=0)  # counting cycles: useless here
    monkeypatch.setattr(nvlink_probe.shutil, "which", lambda name: None)
    with pytest.raises(
        WorkloadSkip, match="utilization counter 0 does not count bytes; no nvidia-smi on PATH"
    ):
        CounterReader.find(FakeNvml([gpu]), gpu, gpu.bus)
    smi = recorded("nvlink_gt_d_h800_gpu0.txt")
    reader = CounterReader.find(FakeNvml([gpu]), gpu, gpu.bus, smi=smi)
    assert reader.source == "nvidia-smi nvlink -gt d -i 00000000:18:00.0"
    counters = reader.read()
    assert counters["0"] == (1390774681 * 1024, 1387831436 * 1024)
    assert counters["7"] == (1391348007 * 1024, 1387855953 * 1024)
    assert smi.calls[-1] == ["nvidia-smi", "nvlink", "-gt", "d", "-i", "00000000:18:00.0"]


def test_no_counter_anywhere_skips_listing_what_was_tried():
    gpu = Gpu(states=[1, 1], throughput_fields=False)
    with pytest.raises(WorkloadSkip) as info:
        CounterReader.find(FakeNvml([gpu]), gpu, None)
    assert str(info.value) == (
        "no NVLink traffic counter can be read on GPU None: NVML throughput fields: not supported by this "
        "driver; nvmlDeviceGetNvLinkUtilizationControl: NVMLError: Not Supported; the GPU's PCI bus id is unknown"
    )


def test_a_gpu_with_every_link_down_reads_as_no_traffic_for_the_parent_to_name():
    gpu = Gpu(states=[0] * 18)
    reader = CounterReader.find(FakeNvml([gpu]), gpu, gpu.bus)
    assert reader.source == "NVML: no active NVLink on this GPU"
    assert reader.read() == {}


def test_delta_refuses_counters_that_went_down():
    before = {"0": (100, 50), "1": (10, 10)}
    assert nvlink_probe._delta(before, {"0": (300, 80), "1": (10, 10)}, "GPU x") == {
        "0": {"tx_bytes": 200, "rx_bytes": 30},
        "1": {"tx_bytes": 0, "rx_bytes": 0},
    }
    with pytest.raises(RuntimeError, match=r"GPU x link 0 went down .*tx 100 -> 5"):
        nvlink_probe._delta(before, {"0": (5, 80)}, "GPU x")


def test_traffic_on_a_cpu_rank_skips_with_the_reason(tmp_path):
    with pytest.raises(WorkloadSkip, match=r"needs a CUDA device; this job runs on cpu \(gloo\)"):
        nvlink_probe.traffic(ctx(tmp_path))


def test_importing_the_probe_and_the_comparison_loads_no_torch_and_no_pytest():
    code = (
        "import sys; import pytest_gpucluster.workloads.nvlink_probe, pytest_gpucluster.checks.comparison;"
        " sys.exit(sorted(m for m in ('torch', 'pytest', 'pynvml') if m in sys.modules) or None)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
