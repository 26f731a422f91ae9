"""Judging the health job: checks against the profile's burnin: section, the suspects they name,
ECC/XID counter increases, and the XID reader on recorded kernel logs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pytest_gpucluster.checks.burnin.health import (
    application_xids,
    counter_increases,
    cpu_checks,
    gpu_checks,
    intra_node_samples,
    matmul_samples,
    skip_reasons,
    skip_sentence,
    suspect_of,
)
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.results.model import ThresholdRef
from pytest_gpucluster.results.text import failure_message
from pytest_gpucluster.workloads._load_sampler import summarize_samples
from pytest_gpucluster.workloads._node_facts import parse_xid_lines, throttle_names

DATA = Path(__file__).parents[1] / "data"


def _vm() -> list[dict]:
    return json.loads((DATA / "burnin" / "cpu_vm_health_2ranks.json").read_text())


def _kernel_log(name: str) -> str:
    return (DATA / "kernel_logs" / name).read_text()


_SAMPLED = ("temperature_c", "power_w", "pcie_gen", "pcie_width", "throttle_reasons")


def _gpu_rank(rank: int, bus: str, **nvml: object) -> dict:
    """A GPU rank's value in the shape workloads.health writes (no GPU recording exists here): the
    NVML readings after the load, and the same values as three samples taken under it."""
    base = {
        "pci_bus_id": bus,
        "gpu": f"GPU {rank} ({bus})",
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
        "temperature_c": 41.0,
        "power_w": 120.5,
        "pcie_gen": 5,
        "pcie_width": 16,
        "throttle_reasons": ["gpu_idle"],
        "ecc_mode": {"current": True, "pending": True},
    }
    readings = {**base, **nvml}
    sample = {k: readings[k] for k in _SAMPLED}
    return {
        "rank": rank,
        "local_rank": rank,
        "host": "gpu-node-1",
        "gpu": {"matmul_flops": 700e12, "memory_bandwidth": 2.9e12, "h2d_bandwidth": 50e9},
        "nvml": readings,
        "under_load": summarize_samples([sample] * 3, 5.0, 0.1),
    }


def test_cpu_checks_of_a_recorded_run_are_recorded_without_floors():
    readings = cpu_checks(_vm(), BurninSection(), "cpu-local")
    assert [(r.metric, r.labels["rank"], r.labels["host"]) for r in readings] == [
        ("burnin.cpu_matmul", 0, "vm"),
        ("burnin.cpu_memory_bandwidth", 0, "vm"),
        ("burnin.cpu_matmul", 1, "vm"),
        ("burnin.cpu_memory_bandwidth", 1, "vm"),
    ]
    assert all(r.threshold is None and r.ref is None and r.verdict == "info" for r in readings)
    assert readings[0].value == pytest.approx(28570620768.7, rel=1e-6)  # 2 * 512**3 / 9.3955 ms


def test_a_cpu_floor_fails_the_rank_below_it_and_names_it():
    section = BurninSection(min_cpu_matmul="30GFLOP/s", min_cpu_memory_bandwidth="1GB/s")
    failed = [r for r in cpu_checks(_vm(), section, "cpu-local") if r.failed]
    assert [(r.metric, r.labels["rank"]) for r in failed] == [("burnin.cpu_matmul", 0)]
    assert failed[0].ref == ThresholdRef("cpu-local", ("burnin", "min_cpu_matmul"))
    suspect = suspect_of(failed[0])
    assert (suspect.node, suspect.rank, suspect.kind, suspect.check) == ("vm", 0, "node", "health")
    assert suspect.reason == (
        "rank 0 on vm: CPU float32 matmul 0.02857 TFLOP/s, expected at least 0.03 TFLOP/s (burnin.min_cpu_matmul)"
    )
    assert suspect.line() == f"node vm (rank 0): {suspect.reason}"
    assert failed[0].labels == {"host": "vm", "rank": 0}
    assert failure_message(failed[0]) == (
        "burnin.cpu_matmul (host=vm, rank=0): measured 0.02857 TFLOP/s, expected at least 0.03 TFLOP/s "
        "(threshold from profile cpu-local: burnin.min_cpu_matmul). rank 0 on vm: CPU float32 matmul"
    )


def test_gpu_readings_gate_each_gpu_and_name_it():
    section = BurninSection(
        min_matmul="600TFLOP/s", max_temperature=85, min_pcie_gen=5, min_pcie_width=16, max_retired_pages=0
    )
    hot = _gpu_rank(1, "00000000:3b:00.0", temperature_c=91.0, pcie_width=8)
    readings = gpu_checks([_gpu_rank(0, "00000000:1b:00.0"), hot], section, "h100")
    failed = [r for r in readings if r.failed]
    assert [(r.metric, r.labels["gpu"]) for r in failed] == [
        ("burnin.gpu_temperature", "GPU 1 (00000000:3b:00.0)"),
        ("burnin.pcie_width", "GPU 1 (00000000:3b:00.0)"),
    ]
    under = "max of 3 samples over the 5.0 s load; min 91, max 91"
    assert failed[0].hint == f"GPU 1 (00000000:3b:00.0) of gpu-node-1: temperature ({under})"
    suspect = suspect_of(failed[0])
    assert (suspect.kind, suspect.node, suspect.gpu) == ("gpu", "gpu-node-1", "GPU 1 (00000000:3b:00.0)")
    assert suspect.reason == (
        f"GPU 1 (00000000:3b:00.0) of gpu-node-1: temperature ({under}) 91 C, expected at most 85 C "
        "(burnin.max_temperature)"
    )
    # An unset threshold is recorded, not gated; the row-remap failure flag is always gated.
    by_metric = {r.metric: r for r in readings if r.labels["rank"] == 0}
    assert by_metric["burnin.gpu_power"].threshold is None
    assert by_metric["burnin.row_remap_failure"].threshold == 0.0
    assert by_metric["burnin.row_remap_failure"].ref is None  # a rule, not a profile key


def test_forbidden_throttle_reasons_fail_with_their_names():
    throttled = _gpu_rank(0, "00000000:1b:00.0", throttle_reasons=["sw_power_cap", "hw_thermal_slowdown"])
    [reading] = [r for r in gpu_checks([throttled], BurninSection(), "p") if r.metric == "burnin.throttle"]
    assert reading.failed and reading.value == 1.0
    assert reading.hint.endswith(
        "(hw_thermal_slowdown; during the load: hw_thermal_slowdown in 3 of 3 samples, sw_power_cap in 3 of 3 samples)"
    )
    idle = [r for r in gpu_checks([_gpu_rank(0, "x")], BurninSection(), "p") if r.metric == "burnin.throttle"]
    assert not idle[0].failed and idle[0].hint.endswith("(during the load: gpu_idle in 3 of 3 samples)")


def test_throttle_bits_are_named():
    assert throttle_names(0x1 | 0x40 | 0x80) == ["gpu_idle", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert throttle_names(0) == []


def test_a_cpu_run_has_no_gpu_checks_and_says_why():
    assert gpu_checks(_vm(), BurninSection(), "cpu-local") == []
    assert skip_reasons(_vm(), "nvml") == ["vm has no CUDA device (torch 2.13.0+cpu, device cpu)"]
    assert skip_sentence(_vm(), "gpu", "nvml") == "vm has no CUDA device (torch 2.13.0+cpu, device cpu)"
    assert skip_reasons(_vm(), "intra_node") == []


def test_matmul_samples_take_each_ranks_best_span_on_its_gpu_else_its_cpu():
    cpu_only = [{**v, "cpu": {**v["cpu"], "matmul_best_s": (9 + v["rank"]) / 1000}} for v in _vm()]
    part, samples = matmul_samples(cpu_only)
    assert (part, [(s.rank, s.value) for s in samples]) == ("cpu", [(0, 0.009), (1, 0.01)])
    with_gpus = [{**v, "gpu": {"matmul_best_s": 0.002}} for v in cpu_only]
    assert matmul_samples(with_gpus)[0] == "gpu"
    assert matmul_samples(_vm()) == ("cpu", [])  # recorded before the best span was kept


def test_intra_node_busbw_per_host():
    assert intra_node_samples(_vm()) == {"vm": pytest.approx(791918679.89)}


@pytest.mark.parametrize(
    ("name", "events"),
    [
        ("xid_13_109_dmesg_ctime_gpud46.log", [("0000:cb:00", 13)] * 3 + [("0000:cb:00", 109)]),
        (
            "xid_45_four_gpus_journal_ogkm1150.log",
            [(f"0000:{b}:00", 45) for b in ("dc", "ed", "ba", "97", "dc", "ba", "ed", "97")],
        ),
        ("xid_old_no_pci_prefix_bumblebee329.log", [("0000:01:00", 16)] * 8 + [("0000:01:00", 8)]),
    ],
)
def test_xid_events_are_read_from_recorded_kernel_logs(name, events):
    parsed = parse_xid_lines(_kernel_log(name))
    assert [(e["pci"], e["xid"]) for e in parsed] == events
    # "caused by previous Xid 149" is text, not an event; no line outside the NVRM Xid ones is read.
    assert all("NVRM: Xid" in e["line"] for e in parsed)


def test_an_ecc_counter_that_rises_names_the_gpu():
    before = [_gpu_rank(0, "00000000:1b:00.0"), _gpu_rank(1, "00000000:3b:00.0")]
    after = copy.deepcopy(before)
    after[1]["nvml"]["ecc_uncorrected_volatile"] = 2
    after[1]["nvml"]["remapped_rows"]["uncorrectable"] = 1
    suspects = counter_increases(before, after)
    assert [(s.node, s.gpu, s.reason) for s in suspects] == [
        (
            "gpu-node-1",
            "GPU 1 (00000000:3b:00.0)",
            "uncorrected ECC errors (volatile) rose from 0 to 2 during the run",
        ),
        (
            "gpu-node-1",
            "GPU 1 (00000000:3b:00.0)",
            "uncorrectable remapped rows rose from 0 to 1 during the run",
        ),
    ]
    assert counter_increases(before, before) == []


def test_application_xids_of_a_real_log_are_warnings_matched_to_their_gpu_by_pci_address():
    """Xid 45 (the driver cleaning up a killed process's work) on four GPUs, from a real journal:
    NVIDIA's catalog gives it its own workflow, WORKFLOW_XID_45 (with another XID: follow that one),
    so it is recorded as a warning naming each GPU, never a suspect."""
    lines = _kernel_log("xid_45_four_gpus_journal_ogkm1150.log").splitlines()
    gpus = [_gpu_rank(i, f"00000000:{b.upper()}:00.0") for i, b in enumerate(("97", "ba", "dc", "ed"))]
    before = copy.deepcopy(gpus)
    before[0]["xid_events"] = parse_xid_lines("\n".join(lines[:4]))
    after = copy.deepcopy(gpus)
    after[0]["xid_events"] = parse_xid_lines("\n".join(lines))
    assert counter_increases(before, after) == []
    warned = [c.hint for c in application_xids(before, after)]
    assert [w.split(" (")[0] for w in warned] == [
        "XID 45 on GPU 2",
        "XID 45 on GPU 1",
        "XID 45 on GPU 3",
        "XID 45 on GPU 0",
    ]
    assert "(00000000:DC:00.0) of gpu-node-1" in warned[0] and "WORKFLOW_XID_45" in warned[0]
    assert "not blamed" in warned[0] and "kernel: NVRM: Xid (PCI:0000:dc:00): 45" in warned[0]


def test_reset_class_xids_of_a_real_log_are_suspects_with_the_catalogs_action():
    """A real dmesg excerpt: Xid 13 three times (RESTART_APP: warnings) then Xid 109 (context switch
    timeout, RESET_GPU: a suspect whose action is to reset the GPU)."""
    gpu = [_gpu_rank(0, "00000000:CB:00.0")]
    before, after = copy.deepcopy(gpu), copy.deepcopy(gpu)
    before[0]["xid_events"] = []
    after[0]["xid_events"] = parse_xid_lines(_kernel_log("xid_13_109_dmesg_ctime_gpud46.log"))
    [suspect] = counter_increases(before, after)
    assert (suspect.gpu, suspect.evidence["xid"], suspect.evidence["action"]) == (
        "GPU 0 (00000000:CB:00.0)",
        109,
        "reset GPU",
    )
    assert "RESET_GPU" in suspect.reason and "nvidia-smi -r" in suspect.reason
    assert len(application_xids(before, after)) == 3


def test_an_xid_not_in_the_catalog_table_is_a_suspect_never_taken_for_harmless():
    gpu = [_gpu_rank(0, "00000000:1B:00.0")]
    before, after = copy.deepcopy(gpu), copy.deepcopy(gpu)
    before[0]["xid_events"] = []
    after[0]["xid_events"] = [{"pci": "0000:1b:00", "xid": 250, "line": "NVRM: Xid (PCI:0000:1b:00): 250, x"}]
    [suspect] = counter_increases(before, after)
    assert suspect.evidence["action"] == "drain node" and "not in the XID table" in suspect.reason
    assert application_xids(before, after) == []


def test_cpu_checks_carry_each_timed_spans_figures_as_the_gates_spread():
    value = {**_vm()[0]}
    value["cpu"] = {
        **value["cpu"],
        "memory_bandwidth": 4.0e9,
        "memory_bandwidth_spans": [3.0e9, 4.0e9, 4.4e9],
    }
    checks = cpu_checks([value], BurninSection(), "cpu-local")
    [copy_check] = [c for c in checks if c.metric == "burnin.cpu_memory_bandwidth"]
    assert (copy_check.spread.min, copy_check.spread.max, copy_check.spread.n) == (3.0e9, 4.4e9, 3)
    [matmul] = [c for c in checks if c.metric == "burnin.cpu_matmul"]
    assert matmul.spread is None  # recorded before the spans were kept: no spread, as before
