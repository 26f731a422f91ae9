"""A GPU lost during the run, through the real suite: acceptance/test_burnin.py's counter readings
(test_counters_before, test_counters_after) under ``--hw=auto``, in a pytest of their own, on this
machine's two stand-in GPUs (`counter_suite_run` says what is stood in and what is real).

Planted: right after test_counters_before passes, GPU 1 falls off the bus (its NVML answers
``NVMLError_GpuIsLost``). The run must fail ``burnin.gpus_lost``, name this host and that GPU with
"reset GPU" and the RMA wording, and sign NOT FIT. Healthy: the same run with both GPUs read again
passes that check and signs FIT.
"""

from __future__ import annotations

import json
import socket

import pytest
from counter_suite_run import BUSES, counter_run

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

LOST = BUSES[1]


def _lost_measurement(data: dict) -> dict:
    [lost] = [m for m in data["measurements"] if m["metric"] == "burnin.gpus_lost"]
    return lost


@pytest.mark.parametrize("planted", [True, False], ids=["gpu-lost", "healthy"])
def test_a_gpu_lost_after_the_run_fails_with_reset_then_rma_and_a_healthy_run_passes(tmp_path, planted):
    run = counter_run(tmp_path, lose=LOST if planted else None)
    data, out = run.data, run.out
    assert data is not None, out[-4000:]
    host = socket.gethostname()
    assert data["profile"]["name"] == "h200-sxm", out[-4000:]  # chosen from what NVML listed
    before = [json.loads(p.read_text()) for p in (run.results / "jobs").glob("*counters-before*/rank-*.json")]
    read_before = sorted(r["value"]["nvml"]["pci_bus_id"] for r in before if r["value"].get("nvml"))
    assert read_before == [b.lower() for b in BUSES], before  # both GPUs answered the first reading
    lost = _lost_measurement(data)
    findings = [f for f in data.get("findings", []) if f["metric"] == "burnin.gpus_lost"]
    if not planted:
        assert (lost["value"], lost["verdict"]) == (0.0, "pass"), out[-4000:]
        assert findings == [] and data["signoff"]["fit"] is True, out[-4000:]
        return
    assert (lost["value"], lost["verdict"]) == (1.0, "fail"), out[-4000:]
    [finding] = findings
    assert (finding["host"], finding["action"], finding["reason"]) == (host, "reset GPU", "hardware"), finding
    assert finding["where"] == f"{host}, GPU 1 ({LOST.lower()})", finding  # that GPU, not its peer
    assert "NVMLError_GpuIsLost" in finding["message"] and "RMA" in finding["message"], finding
    signoff = data["signoff"]
    assert signoff["fit"] is False and f"{host} (reset GPU)" in signoff["why"], signoff
    suspects = json.loads((run.results / "suspects.json").read_text())["suspects"]
    assert [(s["node"], s["evidence"].get("pci")) for s in suspects] == [(host, LOST.lower())], suspects
