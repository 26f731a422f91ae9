"""The session-spanning NVML XID listener (workloads/xid_watch.py): a real process started by the
first counters reading and stopped by the last, its protocol through files on the node. There is
no GPU here: the stand-in ``pynvml`` (tests/integration/standin_nvml) on the listener's path answers
as NVML's event API does (``nvmlEventSetWait`` raises NVMLError_Timeout when nothing is queued) and
delivers the XIDs the test queues. Then the parent's verdict: the node's XIDs were read without the
kernel log (which this account may not read), and the XID names its GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from pytest_gpucluster.checks.burnin.health import application_xids, counter_increases, xid_readability_checks
from pytest_gpucluster.workloads import xid_watch

REPO = Path(__file__).resolve().parents[2]
STANDIN_NVML = REPO / "tests" / "integration" / "standin_nvml"
"""The stand-in pynvml (tests/integration/standin_pynvml.py describes it): two GPUs here."""


def _env(monkeypatch, tmp_path):
    queue = tmp_path / "queue.jsonl"
    node = {"gpus": [{"name": "NVIDIA H200", "uuid": f"GPU-{i}", "bus_id": bus, "memory_bytes": 1 << 30}
                     for i, bus in enumerate(("00000000:1B:00.0", "00000000:3B:00.0"))],
            "xid_queue": str(queue)}  # fmt: skip
    (tmp_path / "nvml.json").write_text(json.dumps(node))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN_NVML), str(REPO)]))
    monkeypatch.setenv("GPUCLUSTER_STANDIN_NVML", str(tmp_path / "nvml.json"))
    return queue


def test_the_listener_spans_two_readings_and_its_xids_name_the_gpu(tmp_path, monkeypatch):
    queue = _env(monkeypatch, tmp_path)
    state = tmp_path / "watch"
    ok, why = xid_watch.start(state, max_s=60)
    assert ok, why
    pid = int((state / "pid").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"GPUCLUSTER_JOB_ID=xid-watch-watch" in environ  # not the starting job's: its cleanup spares it
    assert xid_watch.start(state, max_s=60) == (True, "") and int((state / "pid").read_text()) == pid  # kept
    queue.write_text(json.dumps({"device": 1, "xid": 79}) + "\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (state / "events.jsonl").read_text().strip():
        time.sleep(0.05)
    events, why = xid_watch.collect(state)
    assert why == "" and [(e["xid"], e["pci"]) for e in events] == [(79, "00000000:3B:00.0")]
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive  # the last reading stopped it
    assert xid_watch.collect(state)[0] is None  # nothing listens any more

    gpu = {"pci_bus_id": "00000000:3B:00.0", "gpu": "GPU 1 (00000000:3B:00.0)"}
    denied = "XID events not readable on n1: dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted"
    before = [
        {"host": "n1", "rank": 1, "nvml": gpu, "xid_watch": xid_watch.SOURCE, "skipped": {"xid": denied}}
    ]
    after = [{"host": "n1", "rank": 1, "nvml": gpu, "xid_watch": xid_watch.SOURCE, "xid_watch_events": events,
              "skipped": {"xid": denied}}]  # fmt: skip
    (readable,) = xid_readability_checks(before, after)
    assert readable.value == 1.0 and not readable.failed and xid_watch.SOURCE in readable.hint
    (suspect,) = counter_increases(before, after)
    assert (suspect.node, suspect.gpu, suspect.evidence["xid"]) == ("n1", "GPU 1 (00000000:3B:00.0)", 79)


def test_a_node_without_nvml_says_why_and_the_verdict_falls_back_to_the_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # no pynvml on this machine
    ok, why = xid_watch.start(tmp_path / "watch", max_s=60, python=sys.executable)
    if importlib.util.find_spec("pynvml") is None:
        assert not ok and "pynvml is not importable" in why and "pip install nvidia-ml-py" in why
    else:  # nvidia-ml-py is a dependency: installed, it finds no driver on a machine without a GPU
        assert not ok and "NVML" in why
    events, why = xid_watch.collect(tmp_path / "none")
    assert events is None and "no NVML XID listener was started on this node" in why


def test_an_xid_154_event_carries_the_recovery_action_nvml_read_and_is_judged_by_it(tmp_path, monkeypatch):
    """NVML's event has no line: the listener reads each GPU's recovery action as its Xid 154 arrives
    (the stand-in answers NVML_FI_DEV_GET_GPU_RECOVERY_ACTION per GPU: 0x1 GPU reset, 0x0 None, and a
    GPU whose driver does not answer the field) and the burn-in's judge takes the rung of that code."""
    queue = _env(monkeypatch, tmp_path)
    node = json.loads((tmp_path / "nvml.json").read_text())
    node["gpus"].append({**node["gpus"][1], "uuid": "GPU-2", "bus_id": "00000000:5B:00.0"})
    node["gpus"][0]["recovery_action"], node["gpus"][1]["recovery_action"] = 1, 0
    (tmp_path / "nvml.json").write_text(json.dumps(node))
    state = tmp_path / "watch"
    ok, why = xid_watch.start(state, max_s=60)
    assert ok, why
    queue.write_text("".join(json.dumps({"device": d, "xid": 154}) + "\n" for d in (0, 1, 2)))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len((state / "events.jsonl").read_text().splitlines()) < 3:
        time.sleep(0.05)
    events, why = xid_watch.collect(state)
    assert why == "" and [(e["pci"], e.get("recovery_action")) for e in events] == [
        ("00000000:1B:00.0", 1),
        ("00000000:3B:00.0", 0),
        ("00000000:5B:00.0", None),
    ]
    assert "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION=230" in events[2]["recovery_action_error"]
    assert "NotSupported" in events[2]["recovery_action_error"]

    gpus = [
        {"pci_bus_id": g["bus_id"], "gpu": f"GPU {i} ({g['bus_id']})"} for i, g in enumerate(node["gpus"])
    ]
    before = [{"host": "n1", "rank": i, "nvml": g, "xid_watch": xid_watch.SOURCE} for i, g in enumerate(gpus)]
    after = [{**b, "xid_watch_events": events} for b in before]
    reset, drain = counter_increases(before, after)
    assert (reset.gpu, reset.evidence["bucket"], reset.evidence["action"]) == (
        gpus[0]["gpu"],
        "RESET_GPU",
        "reset GPU",
    )
    assert "0x1 (GPU_RESET) as NVML read it when the event arrived" in reset.reason
    assert (drain.gpu, drain.evidence["bucket"], drain.evidence["action"]) == (
        gpus[2]["gpu"],
        "XID_154",
        "drain node",
    )
    assert "the recovery action could not be read" in drain.reason and "NotSupported" in drain.reason
    [warning] = application_xids(before, after)
    assert not warning.failed and warning.labels["gpu"] == gpus[1]["gpu"] and "IGNORE" in warning.hint
