"""Xid 154 judged by the recovery action its line names (checks/burnin/xid_recovery.py), on real lines
(tests/data/kernel_logs, SOURCES.md): a GPU reset is "reset GPU", a node reboot "drain node", a
return to None a warning; an unknown code or a line naming none stays fail-closed ("drain node").
An NVML event has no line: the code NVML read with it (workloads/_xid.recovery_action) is judged by
the same table, and a failed read stays "drain node" saying why."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gpucluster.checks.burnin.health import application_xids, counter_increases
from pytest_gpucluster.checks.burnin.xid_classes import UNKNOWN_ACTION, classify, classify_event
from pytest_gpucluster.checks.burnin.xid_recovery import RECOVERY_ACTIONS, decode_154
from pytest_gpucluster.workloads._xid import NvmlXidListener, nvml_event, parse_xid_lines, recovery_action

LOGS = Path(__file__).parents[1] / "data" / "kernel_logs"
RESET_THEN_NONE = LOGS / "xid_154_gpu_reset_nvsentinel.log"
GB200_PAIR = LOGS / "xid_149_154_drain_and_reset_gb200_dcgm_exporter.log"
CATALOG_REBOOT = LOGS / "xid_154_node_reboot_catalog.txt"


def _events(path: Path) -> list[dict]:
    return parse_xid_lines(path.read_text())


def test_the_real_lines_name_their_codes_old_and_new():
    reset, back = (decode_154(e["line"]) for e in _events(RESET_THEN_NONE))
    assert (reset.old, reset.old_name, reset.new, reset.new_name) == (0, "None", 1, "GPU Reset Required")
    assert (back.old, back.new, back.new_name) == (1, 0, "None")
    [drain] = [decode_154(e["line"]) for e in _events(GB200_PAIR) if e["xid"] == 154]
    assert (drain.new, drain.new_name) == (4, "Drain and Reset")
    reboot = decode_154(CATALOG_REBOOT.read_text())
    assert (reboot.new, reboot.new_name, reboot.action.nvml) == (
        2,
        "Node Reboot Required",
        "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT",
    )


@pytest.mark.parametrize(
    ("path", "index", "bucket", "action", "warning"),
    [
        (RESET_THEN_NONE, 0, "RESET_GPU", "reset GPU", False),
        (RESET_THEN_NONE, 1, "IGNORE", "rerun", True),
        (GB200_PAIR, 1, "RESET_GPU", "reset GPU", False),
        (CATALOG_REBOOT, 0, "RESTART_BM", "drain node", False),
    ],
)
def test_each_real_154_line_takes_the_rung_of_the_action_it_names(path, index, bucket, action, warning):
    line = path.read_text().splitlines()[index]
    found = classify_event(154, line)
    assert (found.bucket, found.action, found.warning) == (bucket, action, warning)
    assert found.decoded.startswith("recovery action now 0x")
    assert RECOVERY_ACTIONS[decode_154(line).new].nvml in found.decoded


def test_the_codes_not_the_words_decide_and_unknown_or_missing_codes_stay_fail_closed():
    """R610 words 0x2 "OS Reboot" and 0x1 "PF FLR"; a code NVML's table lacks, or a 154 line that
    names no code (a truncated log), keeps the catalog's XID_154: drain node."""
    real = CATALOG_REBOOT.read_text().strip()
    assert classify_event(154, real.replace("Node Reboot Required", "OS Reboot")).action == "drain node"
    assert (
        classify_event(154, real.replace("0x2 (Node Reboot Required)", "0x1 (PF FLR)")).action == "reset GPU"
    )
    unknown = classify_event(154, real.replace("0x2 (Node Reboot Required)", "0x9 (Something New)"))
    assert (unknown.bucket, unknown.action) == ("XID_154", UNKNOWN_ACTION)
    assert "a code NVML's table does not hold" in unknown.decoded
    cut = classify_event(154, "NVRM: Xid (PCI:0000:01:00): 154 (")
    assert (cut.bucket, cut.action, cut.decoded) == ("XID_154", "drain node", "")
    bare = classify_event(154, None)  # NVML's event, with no recovery action read beside it
    assert (bare.bucket, bare.action) == ("XID_154", "drain node") and classify(154).action == "drain node"
    assert bare.decoded == "NVML's event has no line and no recovery action was read with it"


def _gpu(bus: str) -> dict:
    return {"host": "gb200-1", "rank": 0, "nvml": {"pci_bus_id": bus, "gpu": f"GPU 0 ({bus})"}}


def test_a_gpu_reset_154_in_the_run_is_a_reset_gpu_suspect_and_its_return_to_none_a_warning():
    """Through the burn-in's judge (health.counter_increases / application_xids): the kernel log read
    after the run holds NVIDIA's two lines; the first makes the GPU a suspect to reset, the second is
    recorded, the GPU not blamed for it."""
    before = [_gpu("00000008:01:00.0")]
    after = copy.deepcopy(before)
    after[0]["xid_events"] = _events(RESET_THEN_NONE)
    before[0]["xid_events"] = []
    [suspect] = counter_increases(before, after)
    assert (suspect.evidence["xid"], suspect.evidence["bucket"], suspect.evidence["action"]) == (
        154,
        "RESET_GPU",
        "reset GPU",
    )
    assert "NVML_GPU_RECOVERY_ACTION_GPU_RESET" in suspect.reason
    [recorded] = application_xids(before, after)
    assert not recorded.failed and "0x0 (None)" in recorded.hint and "IGNORE" in recorded.hint


@pytest.mark.parametrize(
    ("code", "bucket", "action", "warning"),
    [(1, "RESET_GPU", "reset GPU", False), (0, "IGNORE", "rerun", True), (2, "RESTART_BM", "drain node", False),
     (4, "RESET_GPU", "reset GPU", False), (3, "XID_154", "drain node", False)],
)  # fmt: skip
def test_an_nvml_154_without_a_line_takes_the_rung_of_the_code_nvml_read(code, bucket, action, warning):
    found = classify_event(154, None, code)
    assert (found.bucket, found.action, found.warning) == (bucket, action, warning)
    assert f"recovery action now 0x{code:x}" in found.decoded and "as NVML read it" in found.decoded
    assert RECOVERY_ACTIONS[code].nvml.removeprefix("NVML_GPU_RECOVERY_ACTION_") in found.decoded


def test_an_nvml_154_whose_code_is_missing_unknown_or_malformed_stays_drain_node_saying_why():
    failed = classify_event(
        154, None, None, "nvmlDeviceGetFieldValues(...): NVMLError_NotSupported: Not Supported"
    )
    assert (failed.bucket, failed.action) == ("XID_154", "drain node")
    assert "could not be read" in failed.decoded and "NotSupported" in failed.decoded
    unknown = classify_event(154, None, 9)
    assert (unknown.bucket, unknown.action) == ("XID_154", "drain node")
    assert "a code NVML's table does not hold" in unknown.decoded
    for bad in (True, "1", -1):
        odd = classify_event(154, None, bad)
        assert (odd.bucket, odd.action) == ("XID_154", "drain node") and "is not a code" in odd.decoded
    real = RESET_THEN_NONE.read_text().splitlines()[0]  # the line (0x1) wins over a later read (0x0)
    assert classify_event(154, real, 0).bucket == "RESET_GPU"


def _field_values(code, status=0):
    import pynvml  # the installed nvidia-ml-py: its own nvmlFieldValue_t

    values = (pynvml.c_nvmlFieldValue_t * 1)()
    values[0].fieldId, values[0].nvmlReturn = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, status
    values[0].valueType, values[0].value.uiVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, code
    return values


def test_the_recovery_action_is_read_by_the_binding_function_else_the_field_and_a_failure_says_why():
    pynvml = pytest.importorskip("pynvml")
    has_getter = hasattr(pynvml, "nvmlDeviceGetGpuRecoveryAction")
    field = SimpleNamespace(
        nvmlDeviceGetFieldValues=lambda handle, ids: _field_values(1), NVMLError=pynvml.NVMLError,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION=pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    )  # fmt: skip
    assert recovery_action(field, "h") == (1, "")
    getter = SimpleNamespace(**vars(field), nvmlDeviceGetGpuRecoveryAction=lambda handle: 4)
    assert recovery_action(getter, "h") == (4, "")
    refused = SimpleNamespace(
        nvmlDeviceGetFieldValues=lambda handle, ids: _field_values(0, pynvml.NVML_ERROR_NOT_SUPPORTED),
        NVMLError=pynvml.NVMLError,
    )
    code, why = recovery_action(refused, "h")
    assert code is None and "has no nvmlDeviceGetGpuRecoveryAction" in why
    assert "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION=230): NVMLError_NotSupported" in why
    if not has_getter:  # recorded for the report: the installed binding lacks the function
        assert "nvidia-ml-py 1" in why or "version unknown" in why


def test_the_load_listener_reads_the_recovery_action_of_an_xid_154_only():
    import pynvml

    class Events:
        NVMLError = pynvml.NVMLError
        nvmlEventTypeXidCriticalError = 8

        def __init__(self):
            self.queued, self.asked = [79, 154], []

        def nvmlEventSetCreate(self):
            return "set"

        def nvmlDeviceRegisterEvents(self, handle, kinds, event_set):
            pass

        def nvmlEventSetWait_v2(self, event_set, timeout_ms):
            if not self.queued:
                raise pynvml.NVMLError_Timeout()
            return SimpleNamespace(eventType=8, eventData=self.queued.pop(0), device="gpu0")

        def nvmlDeviceGetFieldValues(self, handle, ids):
            self.asked.append(handle)
            return _field_values(1)

        def nvmlEventSetFree(self, event_set):
            pass

    nvml = Events()
    assert NvmlXidListener(nvml, "gpu0").drain() == [
        {"xid": 79, "source": "nvml"},
        {"xid": 154, "source": "nvml", "recovery_action": 1},
    ]
    assert nvml.asked == ["gpu0"]
    failed = nvml_event(SimpleNamespace(), SimpleNamespace(eventData=154, device="gpu0"))
    assert "recovery_action" not in failed and "AttributeError" in failed["recovery_action_error"]
