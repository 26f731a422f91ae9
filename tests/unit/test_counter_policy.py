"""Counter classes and the ECC policy on recorded real readings (issue 27's "Must show").

Fabric: the recorded H100 node's sysfs tree (tests/data/infiniband/sysfs_h100_gpud, read by the
probe that runs on a node) and this VM's interface statistics before and after 250 frames of an
unknown EtherType reached a veth (tests/data/netdev/sysfs_net_veth_unknown_ethertype_*: rx_dropped
0 -> 250, read by the same probe). "After" readings of the H100 tree are the recording with one
counter changed in the test, as SOURCES.md describes. ECC: real ``nvidia-smi -q`` outputs
(tests/data/nvidia_smi) parsed by ``parsers/nvidia_smi_ecc``, turned into the readings NVML gives
the counters job.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.burnin.health import corrected_checks, counter_increases
from pytest_gpucluster.checks.fabric import counter_checks
from pytest_gpucluster.parsers.fabric_diff import COUNTER_CLASSES, counter_class
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, parse_snapshot
from pytest_gpucluster.parsers.nvidia_smi_ecc import parse_ecc_query
from pytest_gpucluster.profiles.schema import FabricSection
from pytest_gpucluster.profiles.schema_burnin import BurninSection
from pytest_gpucluster.workloads.fabric_probe import snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "infiniband" / "sysfs_h100_gpud"
NETDEV = DATA / "netdev"
SMI = DATA / "nvidia_smi"
# The recording's 4-bit excessive_buffer_overrun_errors sits at its maximum (15) on every device,
# which fails by default (it cannot show growth); these tests are about growth, so they warn on it.
SECTION = FabricSection(saturated="warn")


def h100(root: Path = H100) -> FabricSnapshot:
    return parse_snapshot(snapshot(root, node="gpu-a17"), "gpu-a17 sysfs")


def grown(tmp_path: Path, *changes: tuple[str, str, str, int]) -> FabricSnapshot:
    """The recorded tree with counters grown: (device, group, counter, increase)."""
    root = tmp_path / "sys"
    shutil.copytree(H100, root)
    for device, group, counter, increase in changes:
        path = root / "class" / "infiniband" / device / "ports" / "1" / group / counter
        path.write_text(f"{int(path.read_text()) + increase}\n")
    return h100(root)


def moved(device: str, gb: float) -> tuple[str, str, str, int]:
    """port_xmit_data counts 4-byte words: ``gb`` GB sent."""
    return (device, "counters", "port_xmit_data", int(gb * 1e9 / 4))


def by_counter(checks, metric):
    return {(c.labels["device"], c.labels["counter"]): c for c in checks if c.metric == metric}


def test_every_classified_counter_is_in_the_docs_table():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "explanation" / "faults-by-cause.md").read_text(
        encoding="utf-8"
    )
    for name, cls in COUNTER_CLASSES.items():
        assert f"| `{name}` | {cls} |" in readme, name
    assert counter_class("hw_out_of_sequence") == "retransmit" and counter_class("rx_dropped") == "drop"
    assert counter_class("link_downed") == "link" and counter_class("port_xmit_data") == "traffic"


def test_drops_on_a_healthy_interface_are_recorded_and_pass():
    before, after = (
        parse_snapshot(
            json.loads((NETDEV / f"sysfs_net_veth_unknown_ethertype_{when}_this_vm.json").read_text()), when
        )
        for when in ("before", "after")
    )
    verdict = counter_checks([before], [after], FabricSection(), "cpu-local", {})
    assert not [c for c in verdict.checks if c.failed] and not verdict.suspects
    drops = by_counter(verdict.checks, "fabric.drops")
    row = drops[("pold1", "rx_dropped")]
    assert (row.value, row.verdict, row.labels["node"]) == (250.0, "info", "ns-rx")
    assert "recorded, not gated" in row.hint
    # a profile that sets an allowance gates them
    strict = counter_checks([before], [after], FabricSection(max_drop_increase=100), "site", {})
    (failed,) = [c for c in strict.checks if c.failed]
    assert (failed.labels["counter"], str(failed.ref)) == (
        "rx_dropped",
        "profile site: fabric.max_drop_increase",
    )


def test_out_of_sequence_at_a_normal_rate_passes_and_a_retransmit_rate_above_the_ceiling_fails(tmp_path):
    before = h100()
    healthy = grown(tmp_path / "a", ("mlx5_0", "hw_counters", "out_of_sequence", 50), moved("mlx5_0", 2.0))
    verdict = counter_checks([before], [healthy], SECTION, "site", {})
    assert not [c for c in verdict.checks if c.failed]
    rate = by_counter(verdict.checks, "fabric.retransmit_rate")[("mlx5_0", "hw_out_of_sequence")]
    assert rate.value == pytest.approx(25.0, rel=1e-6) and rate.threshold == 100.0
    assert str(rate.ref) == "profile site: fabric.max_retransmits_per_gb"

    lossy = grown(
        tmp_path / "b", ("mlx5_1", "hw_counters", "local_ack_timeout_err", 500), moved("mlx5_1", 1.0)
    )
    verdict = counter_checks([before], [lossy], SECTION, "site", {})
    (failed,) = [c for c in verdict.checks if c.failed]
    assert failed.labels == {
        "node": "gpu-a17",
        "device": "mlx5_1",
        "port": 1,
        "counter": "hw_local_ack_timeout_err",
    }
    assert failed.value == pytest.approx(500.0, rel=1e-6)
    assert (
        "node gpu-a17, device mlx5_1 port 1: retransmit counter hw_local_ack_timeout_err grew by 500"
        in failed.hint
    )
    (suspect,) = verdict.suspects
    assert suspect.node == "gpu-a17" and suspect.reason.startswith(
        "mlx5_1/1: hw_local_ack_timeout_err 500 per GB"
    )
    # a site where adaptive routing reorders by design raises that counter's own ceiling
    ar = FabricSection(saturated="warn", retransmits_per_gb={"hw_local_ack_timeout_err": 1000})
    assert not [c for c in counter_checks([before], [lossy], ar, "site", {}).checks if c.failed]


@pytest.mark.parametrize(
    ("device", "counter"), [("mlx5_0", "link_downed"), ("mlx5_bond_0", "link_error_recovery")]
)  # symbol errors are a rate: test_fabric_by_cause.py
def test_one_link_error_fails_naming_node_device_port_and_counter(tmp_path, device, counter):
    verdict = counter_checks(
        [h100()], [grown(tmp_path, (device, "counters", counter, 1))], SECTION, "site", {}
    )
    (failed,) = [c for c in verdict.checks if c.failed]
    assert (failed.metric, failed.value, failed.threshold) == ("fabric.error_increase", 1.0, 0.0)
    assert failed.labels == {"node": "gpu-a17", "device": device, "port": 1, "counter": counter}
    assert f"node gpu-a17, device {device} port 1: error counter {counter} grew by 1" in failed.hint


def reading(path: str, index: int, host: str, rank: int, taken_at: float, **changes: Any) -> dict[str, Any]:
    """One GPU of a recorded ``nvidia-smi -q`` as the counters job's NVML reading; ``changes``
    override counters (``ecc_corrected_volatile=12``, ``remapped_rows__uncorrectable=3``)."""
    gpu = parse_ecc_query((SMI / path).read_text())[index]
    rows = gpu.remapped_rows
    nvml = {
        "pci_bus_id": gpu.bus_id,
        "gpu": f"GPU {index} ({gpu.bus_id})",
        "ecc_corrected_volatile": gpu.corrected("volatile"),
        "ecc_uncorrected_volatile": gpu.uncorrected("volatile"),
        "ecc_uncorrected_aggregate": gpu.uncorrected("aggregate"),
        "retired_pages": 0,
        "remapped_rows": {
            "correctable": rows["correctable_error"],
            "uncorrectable": rows["uncorrectable_error"],
            "pending": int(bool(rows["pending"])),
            "failure": int(bool(rows["remapping_failure_occurred"])),
        },
    }
    for key, value in changes.items():
        if key.startswith("remapped_rows__"):
            nvml["remapped_rows"][key.removeprefix("remapped_rows__")] = value
        else:
            nvml[key] = value
    return {"rank": rank, "host": host, "taken_at": taken_at, "nvml": nvml}


H100_SMI = "ecc_q_h100x8_first2_535.161.08_gpud.txt"
A10_SMI = "ecc_q_a10_remapped_pending_535.129.03_gpud.txt"
A100_SMI = "ecc_q_a100_xid63_dram_correctable_elided_510.73.08_mlengineering.txt"


def test_corrected_ecc_is_recorded_and_passes_and_a_rate_ceiling_gates_it():
    before = [reading(H100_SMI, 0, "gpu-a17", 0, 0.0), reading(H100_SMI, 1, "gpu-a17", 1, 0.0)]
    after = [
        reading(H100_SMI, 0, "gpu-a17", 0, 1800.0, ecc_corrected_volatile=12),
        reading(H100_SMI, 1, "gpu-a17", 1, 1800.0),
    ]
    assert counter_increases(before, after) == []  # corrected by design: no suspect
    checks = corrected_checks(before, after, BurninSection(), "site")
    grew = [c for c in checks if c.value]
    assert [(c.labels["gpu"], c.labels["counter"], c.value, c.verdict) for c in grew] == [
        ("GPU 0 (00000000:19:00.0)", "ecc_corrected_volatile", 12.0, "info")
    ]
    gated = corrected_checks(before, after, BurninSection(max_corrected_ecc_per_hour=10), "site")
    (failed,) = [c for c in gated if c.failed]
    assert (failed.value, failed.unit, str(failed.ref)) == (
        24.0,
        "1/h",
        "profile site: burnin.max_corrected_ecc_per_hour",
    )
    assert failed.labels["host"] == "gpu-a17" and failed.labels["gpu"] == "GPU 0 (00000000:19:00.0)"


def test_one_uncorrectable_error_fails_naming_node_gpu_and_counter():
    before = [
        reading(A10_SMI, 0, "a10-node", 0, 0.0, remapped_rows__uncorrectable=3, remapped_rows__pending=0)
    ]
    after = [reading(A10_SMI, 0, "a10-node", 0, 600.0)]  # the recording: 4 uncorrectable rows, remap pending
    suspects = counter_increases(before, after)
    assert [(s.node, s.gpu, s.evidence["counter"], s.reason) for s in suspects] == [
        ("a10-node", "GPU 0 (00000000:07:00.0)", "remapped_rows.pending",
         "a row remap is pending after the run: reset the GPU (nvidia-smi -r) so the remap takes effect"),
        ("a10-node", "GPU 0 (00000000:07:00.0)", "remapped_rows.uncorrectable",
         "uncorrectable remapped rows rose from 3 to 4 during the run"),
    ]  # fmt: skip
    volatile = copy.deepcopy(after)
    volatile[0]["nvml"]["ecc_uncorrected_volatile"] = 1
    (dbe,) = [
        s for s in counter_increases(before, volatile) if s.evidence["counter"] == "ecc_uncorrected_volatile"
    ]
    assert dbe.reason == "uncorrected ECC errors (volatile) rose from 0 to 1 during the run"


def test_a_pending_remap_fails_whatever_it_was_before_and_corrected_history_does_not():
    """The A100 of the recording: 177 corrected errors and a pending remap, unchanged over the run."""
    same = [reading(A100_SMI, 0, "a100-node", 0, 0.0)]
    (suspect,) = counter_increases(same, same)
    assert suspect.evidence == {"counter": "remapped_rows.pending", "after": 1.0}
    assert all(c.value == 0 and not c.failed for c in corrected_checks(same, same, BurninSection(), "p"))
