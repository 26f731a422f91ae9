"""XIDs judged by cause (checks/burnin/xid_classes.py): the catalog's buckets, event times, kill windows."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pytest_gpucluster.checks.burnin.health import application_xids, counter_increases
from pytest_gpucluster.checks.burnin.xid_classes import (
    KILL_GRACE_S,
    classify,
    event_time,
    kill_windows,
)
from pytest_gpucluster.harness import Part, job_timing
from pytest_gpucluster.workloads._node_facts import parse_xid_lines

LOGS = Path(__file__).parents[1] / "data" / "kernel_logs"


@pytest.mark.parametrize(
    ("xid", "bucket"),
    [(13, "RESTART_APP"), (31, "RESTART_APP"), (43, "IGNORE"), (45, "WORKFLOW_XID_45"), (63, "IGNORE"),
     (92, "IGNORE"), (94, "RESTART_APP")],
)  # fmt: skip
def test_buckets_that_ask_nothing_of_the_gpu_are_warning_classes(xid, bucket):
    """NVIDIA's catalog (tests/data/xid_catalog): 43, 63, 92 are IGNORE, 94 RESTART_APP, 45 its own
    workflow (follow the other XID; logged for Ctrl-C and SIGKILL)."""
    found = classify(xid)
    assert found is not None and found.bucket == bucket and found.warning and found.action == "rerun"


@pytest.mark.parametrize(
    ("xid", "action"),
    [(48, "reset GPU"), (64, "reset GPU"), (74, "reset GPU"), (79, "drain node"), (54, "drain node"),
     (95, "reset GPU"), (119, "reset GPU"), (120, "reset GPU"), (149, "reset GPU"), (154, "drain node")],
)  # fmt: skip
def test_reset_reboot_and_drain_buckets_carry_their_action(xid, action):
    found = classify(xid)
    assert found is not None and not found.warning and found.action == action


def test_event_times_from_nvml_and_from_journal_iso_lines():
    assert event_time({"time": 1700000000.5}) == 1700000000.5
    line = "2026-11-28T14:02:11+0000 node7 kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=1"
    assert event_time({"line": line}) == pytest.approx(1795874531.0)
    # dmesg --ctime and plain journal lines carry no zone-aware time: not attributable to a window
    assert (
        event_time({"line": (LOGS / "xid_13_109_dmesg_ctime_gpud46.log").read_text().splitlines()[1]}) is None
    )


def _gpu(rank: int, bus: str) -> dict:
    return {"host": "node7", "rank": rank, "nvml": {"pci_bus_id": bus, "gpu": f"GPU {rank} ({bus})"}}


def test_an_application_xid_after_a_suite_kill_is_a_warning_while_xid_79_is_a_suspect():
    """A failed job's record (harness.job_timing, what results.json's jobs hold) is a kill window;
    Xid 45 heard by NVML inside it is the kill's, while Xid 79 on the other GPU in the same window
    is a suspect to reboot (RESTART_BM)."""
    record = job_timing([Part("burnin-health", "pkg.mod:f")], 12.0, "health-1", "failed")
    [window] = kill_windows([record, job_timing([Part("ok", "pkg.mod:g")], 3.0, "ok-1", "ok")])
    assert window.end - window.start == pytest.approx(12.0)
    gpus = [_gpu(0, "00000000:3B:00.0"), _gpu(1, "00000000:C6:00.0")]
    before, after = copy.deepcopy(gpus), copy.deepcopy(gpus)
    xid_79 = parse_xid_lines((LOGS / "xid_79_fallen_off_bus_modal.log").read_text())[0]
    after[0]["xid_watch_events"] = [
        {"xid": 45, "pci": "00000000:3b:00.0", "time": window.end + 1.0, "source": "nvml"},
        {**xid_79, "time": window.end - 2.0, "source": "nvml"},
    ]
    [recorded] = application_xids(before, after, [window])
    assert (recorded.metric, recorded.failed, recorded.labels["killed_job"]) == (
        "burnin.xid_application",
        False,
        "health-1",
    )
    warning = recorded.hint
    assert warning.startswith("XID 45 on GPU 0 (00000000:3B:00.0) of node7")
    assert "job health-1, which the suite stopped" in warning and "attributed to that kill" in warning
    [suspect] = counter_increases(before, after)
    assert (suspect.gpu, suspect.evidence["xid"], suspect.evidence["action"]) == (
        "GPU 1 (00000000:C6:00.0)",
        79,
        "drain node",
    )
    assert "RESTART_BM" in suspect.reason and "fallen off the bus" in suspect.reason
    # the same Xid 45 long after the kill is still the application's, but not the kill's
    late = copy.deepcopy(after)
    late[0]["xid_watch_events"][0]["time"] = window.end + KILL_GRACE_S + 60
    [alone] = [c.hint for c in application_xids(before, late, [window])]
    assert "stopped" not in alone and "aborted application's teardown" in alone
