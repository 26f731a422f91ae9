"""The health job's GPU state read under load: the sampler thread (workloads/_load_sampler.py),
the NVML reader it calls (workloads/_node_facts.py) and the checks made of its summary
(checks/burnin/gpu.py). There is no GPU here: the reader is replaced by one replaying recorded
``nvidia-smi`` rows, or by a stand-in ``pynvml`` module answering as NVML does."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gpucluster.checks.burnin.gpu import gpu_checks
from pytest_gpucluster.parsers.nvidia_smi import parse_query_csv
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.workloads._load_sampler import LoadSampler, counter_deltas, summarize_samples
from pytest_gpucluster.workloads._node_facts import FieldReader, nvml_cumulative, nvml_sample_reader

SMI = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"


class Replay:
    """A reader that hands out recorded samples one per call, and says when all were taken."""

    def __init__(self, samples: list[dict]) -> None:
        self.samples, self.calls = list(samples), 0
        self.done = threading.Event()

    def __call__(self) -> dict:
        sample = self.samples[min(self.calls, len(self.samples) - 1)]
        self.calls += 1
        if self.calls >= len(self.samples):
            self.done.set()
        return sample


def recorded_rows() -> list[dict]:
    rows = parse_query_csv((SMI / "query_csv_loop_sm_clock_power_ksysguard27.txt").read_text())
    return [
        {
            "temperature_c": float(r["temperature.gpu"]),
            "power_w": float(r["power.draw"].split()[0]),
            "sm_clock_mhz": float(r["clocks.current.sm"].split()[0]),
        }
        for r in rows
    ]


def test_the_sampler_summarises_recorded_rows_taken_on_its_thread():
    """13 real nvidia-smi rows of a GPU under load replayed as NVML samples on the sampler's thread."""
    reader = Replay(recorded_rows())
    sampler = LoadSampler(reader, interval_s=0.005).start()
    assert reader.done.wait(10)
    summary = sampler.stop()
    fields = summary["fields"]
    assert summary["samples"] >= 13 and summary["error"] is None
    assert (fields["temperature_c"]["min"], fields["temperature_c"]["max"]) == (55.0, 56.0)
    assert (fields["power_w"]["min"], fields["power_w"]["max"]) == (76.64, 84.77)
    assert (fields["sm_clock_mhz"]["min"], fields["sm_clock_mhz"]["max"]) == (1185.0, 1470.0)


def test_a_load_shorter_than_one_interval_still_gets_a_sample_and_a_failing_reader_is_said():
    summary = LoadSampler(lambda: {"pcie_gen": 5}, interval_s=60).start().stop()
    assert summary["samples"] == 1 and summary["fields"]["pcie_gen"]["max"] == 5

    def broken() -> dict:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    summary = LoadSampler(broken, interval_s=0.001).start().stop()
    assert summary["samples"] == 0 and "NVML_ERROR_GPU_IS_LOST" in summary["error"]


def test_reasons_are_counted_per_sample_and_counters_are_differenced():
    samples = [{"throttle_reasons": ["gpu_idle"]}, {"throttle_reasons": ["sw_power_cap", "hw_slowdown"]}]
    assert summarize_samples(samples, 1.0, 0.1)["reasons"] == {
        "gpu_idle": 1,
        "sw_power_cap": 1,
        "hw_slowdown": 1,
    }
    before = {"violation_ns": {"power": 10, "thermal": 0}, "energy_mj": 1000}
    after = {"violation_ns": {"power": 10, "thermal": 4_000_000}, "energy_mj": 4500, "new": 1}
    assert counter_deltas(before, after) == {
        "violation_ns": {"power": 0, "thermal": 4_000_000},
        "energy_mj": 3500,
    }


class FakeNvml:
    """Answers as pynvml does for one GPU: values from ``answers``; a name mapped to an exception raises."""

    def __init__(self, **answers: object) -> None:
        self.answers = answers

    def _get(self, name: str) -> object:
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._get("temperature")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._get("power_mw")

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._get("sm_clock" if clock == 1 else "mem_clock")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._get("pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._get("pcie_width")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._get("reasons")

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        return SimpleNamespace(referenceTime=0, violationTime=self._get("violations")[policy])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._get("energy")


class NVMLError_NotSupported(Exception):
    pass


def test_the_nvml_reader_drops_a_field_the_part_does_not_support():
    """Stands for an H100 answering every field but the memory clock (NotSupported)."""
    nvml = FakeNvml(
        temperature=71, power_mw=612_500, sm_clock=1980, mem_clock=NVMLError_NotSupported("Not Supported"),
        pcie_gen=5, pcie_width=16, reasons=0x4 | 0x40,
    )  # fmt: skip
    reader = nvml_sample_reader(nvml, handle=object())
    first, second = reader(), reader()
    assert first == second == {
        "temperature_c": 71.0, "power_w": 612.5, "sm_clock_mhz": 1980.0, "pcie_gen": 5, "pcie_width": 16,
        "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"],
    }  # fmt: skip
    assert list(reader.errors) == ["mem_clock_mhz"] and "NotSupported" in reader.errors["mem_clock_mhz"]
    assert isinstance(reader, FieldReader)


def test_nvml_cumulative_counters_by_policy_name():
    nvml = FakeNvml(violations={0: 5, 1: 7, 2: 0, 3: 1, 4: 2, 5: 0}, energy=NVMLError_NotSupported("x"))
    counters, skipped = nvml_cumulative(nvml, handle=object())
    assert counters == {"violation_ns": {"power": 5, "thermal": 7, "sync_boost": 0, "board_limit": 1,
                                         "low_utilization": 2, "reliability": 0}}  # fmt: skip
    assert list(skipped) == ["energy_mj"]


# ------------------------------------------------------------------------------- the checks


def gpu_value(samples: list[dict], nvml: dict | None = None, counters: dict | None = None, **extra) -> dict:
    """One GPU rank's health value: ``samples`` taken under the load, ``nvml`` read after it."""
    after = {"pci_bus_id": "00000000:3b:00.0", "gpu": "GPU 1 (00000000:3b:00.0)",
             "ecc_mode": {"current": True, "pending": True}} | (nvml or {})  # fmt: skip
    under = summarize_samples(samples, 8.0, 0.1) | {"counters": counters or {}} if samples else {}
    return {"rank": 1, "local_rank": 1, "host": "node7", "nvml": after, "under_load": under, **extra}


def by_metric(checks):
    return {c.metric: c for c in checks}


def test_pcie_generation_is_judged_on_what_the_link_reached_under_load():
    """An H100 whose link idles at Gen1: read after the load it reads 1 (the old false failure);
    sampled during the load it reached Gen5 after the first sample, which passes min_pcie_gen 5."""
    samples = [{"pcie_gen": 1, "pcie_width": 16}] + [{"pcie_gen": 5, "pcie_width": 16}] * 40
    checks = by_metric(
        gpu_checks([gpu_value(samples, {"pcie_gen": 1})], BurninSection(min_pcie_gen=5), "h100")
    )
    gen = checks["burnin.pcie_gen"]
    assert gen.value == 5 and not gen.failed
    assert "max of 41 samples over the 8.0 s load; min 1, max 5" in gen.hint


def test_a_link_that_never_reaches_its_generation_under_load_fails_naming_the_gpu():
    samples = [{"pcie_gen": 3, "pcie_width": 16}] * 20
    gen = by_metric(gpu_checks([gpu_value(samples)], BurninSection(min_pcie_gen=5), "h100"))[
        "burnin.pcie_gen"
    ]
    assert (
        gen.failed and gen.value == 3 and gen.hint.startswith("GPU 1 (00000000:3b:00.0) of node7: PCIe link")
    )


def test_a_gated_reading_never_sampled_under_load_is_not_measured_not_passed():
    """No NVML during the load: the idle reading after it is quoted, not judged."""
    value = gpu_value([], {"temperature_c": 38.0}, skipped={"under_load": "NVML is not usable on node7: ..."})
    checks = by_metric(gpu_checks([value], BurninSection(max_temperature=85), "h100"))
    temp = checks["burnin.gpu_temperature"]
    assert math.isnan(temp.value) and temp.failed and not temp.measured
    assert "not sampled under load: NVML is not usable on node7" in temp.hint and "38 C" in temp.hint
    ungated = by_metric(gpu_checks([value], BurninSection(), "h100"))["burnin.gpu_temperature"]
    assert ungated.value == 38.0 and ungated.threshold is None and "read after the load" in ungated.hint


def test_hottest_sample_power_and_clock_are_recorded():
    rows = recorded_rows()
    counters = {"energy_mj": 640_000, "violation_ns": {"power": 0, "thermal": 0}}
    checks = gpu_checks(
        [gpu_value(rows, counters=counters)], BurninSection(max_temperature=55, max_power=90), "p"
    )
    got = by_metric(checks)
    assert got["burnin.gpu_temperature"].value == 56.0 and got["burnin.gpu_temperature"].failed
    assert got["burnin.gpu_power"].value == 84.77 and not got["burnin.gpu_power"].failed
    assert got["burnin.gpu_sm_clock_min"].value == 1185.0 and got["burnin.gpu_sm_clock_min"].threshold is None
    assert got["burnin.gpu_power_avg"].value == pytest.approx(80.0)  # 640 J over the 8 s load
    policies = {c.labels["policy"]: c.value for c in checks if c.metric == "burnin.gpu_clock_violation"}
    assert policies == {"power": 0.0, "thermal": 0.0}


def test_a_thermal_slowdown_no_sample_caught_fails_through_nvmls_violation_counter():
    """A short thermal slowdown between samples: only NVML's cumulative thermal counter grew."""
    samples = [{"throttle_reasons": ["sw_power_cap"]}] * 30
    counters = {"violation_ns": {"power": 2_000_000_000, "thermal": 350_000_000}}
    throttle = by_metric(gpu_checks([gpu_value(samples, counters=counters)], BurninSection(), "p"))[
        "burnin.throttle"
    ]
    assert throttle.failed and throttle.value == 1.0
    assert "(sw_thermal_slowdown; during the load: sw_power_cap in 30 of 30 samples" in throttle.hint
    assert "NVML sw_thermal_slowdown counter +0.35 s" in throttle.hint


def test_an_xid_nvml_reported_during_the_load_fails():
    value = gpu_value([{"pcie_gen": 5}])
    value["under_load"]["xids"] = [{"xid": 79, "source": "nvml"}]
    xid = by_metric(gpu_checks([value], BurninSection(), "p"))["burnin.xid_during_load"]
    assert xid.failed and xid.value == 1 and "XID 79" in xid.hint


# ------------------------------------------------------------------------------- the glue


class LinkTraining(FakeNvml):
    """A GPU whose link idles at Gen1 and trains to Gen5 once loaded; its thermal violation counter
    and energy grow with each reading; NVML reports XID 79 during the load."""

    nvmlEventTypeXidCriticalError = 8

    class NVMLError_Timeout(Exception):
        pass

    def __init__(self) -> None:
        super().__init__(
            temperature=64, power_mw=650_000, sm_clock=1755, mem_clock=2619, pcie_width=16, reasons=0
        )
        self.gen_calls, self.reads, self.xids = 0, 0, [79]

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        return bus_id

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        self.gen_calls += 1
        return 1 if self.gen_calls == 1 else 5

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        self.reads += 1
        return SimpleNamespace(referenceTime=0, violationTime=self.reads * 1000 if policy == 1 else 0)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return 1000 * self.reads

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, kinds, event_set):
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.xids:
            raise self.NVMLError_Timeout("Timeout")
        return SimpleNamespace(eventData=self.xids.pop())

    def nvmlEventSetFree(self, event_set):
        pass


def test_the_health_jobs_gpu_load_is_sampled_while_it_runs(monkeypatch, tmp_path):
    """workloads/_gpu_health.gpu_under_load with a stand-in pynvml and a stand-in load (a wait for
    5 samples where an H100 would run its matmuls): samples are taken during the load, NVML's counters
    are read around it and its XID events drained after it."""
    import sys
    import time

    from pytest_gpucluster.workloads import _gpu_health
    from pytest_gpucluster.workloads._runtime import RankContext

    nvml = LinkTraining()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    def load(torch, ctx, delay, until):
        # The stand-in load lasts until the sampler has taken 5 samples (each reads the link's
        # generation once), not a fixed 0.2 s, which a loaded machine may not give its thread.
        end = time.monotonic() + 30
        while nvml.gen_calls < 5 and time.monotonic() < end:
            time.sleep(0.01)
        return {"loaded": True}

    monkeypatch.setattr(_gpu_health, "_gpu", load)
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    torch = SimpleNamespace(
        device=lambda name: name, cuda=SimpleNamespace(get_device_properties=lambda dev: props)
    )
    ctx = RankContext(0, 1, 0, 1, 0, "node7", "cuda:0", "nccl", tmp_path, {"sample_interval_s": 0.01})
    gpu, under, skipped = _gpu_health.gpu_under_load(torch, ctx, 0.0)
    assert gpu == {"loaded": True}
    fields = under["fields"]
    assert under["samples"] >= 5 and (fields["pcie_gen"]["min"], fields["pcie_gen"]["max"]) == (1, 5)
    assert under["counters"]["violation_ns"]["thermal"] > 0 and under["counters"]["energy_mj"] > 0
    assert under["xids"] == [{"xid": 79, "source": "nvml"}] and skipped == {}


def test_ceilings_are_judged_on_the_sustained_last_half_of_a_timed_load():
    """The 13 recorded rows as a 13 s load sampled each second (nvidia-smi -l 1): the 56 C readings
    are in the first half, so a 55 C ceiling passes on the sustained part; power in the last half
    still peaks at 83.43 W, which an 83 W ceiling fails. Without times, every sample counts."""
    rows = recorded_rows()
    summary = summarize_samples(rows, 13.0, 1.0, times=[float(t) for t in range(len(rows))])
    assert summary["sustained"]["samples"] == 6 and summary["sustained"]["from_s"] == 6.5
    value = gpu_value(rows) | {"under_load": summary | {"counters": {}}}
    got = by_metric(gpu_checks([value], BurninSection(max_temperature=55, max_power=83), "p"))
    temp, power = got["burnin.gpu_temperature"], got["burnin.gpu_power"]
    assert temp.value == 55.0 and not temp.failed
    assert power.value == 83.43 and power.failed
    assert (
        "6 samples of the sustained part (from 6.5 s) of the 13.0 s load (burnin.load_duration)" in power.hint
    )
    assert got["burnin.gpu_sm_clock_min"].value == 1185.0  # lowest clock of the sustained part
