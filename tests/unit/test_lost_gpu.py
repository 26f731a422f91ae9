"""A GPU read before the burn-in and lost after it (NVML GpuIsLost, or no reading) fails, named with
its action; the counter comparison no longer drops it (checks/burnin/lost.py)."""

from __future__ import annotations

from pytest_gpucluster.checks.burnin import health
from pytest_gpucluster.checks.burnin.lost import LOST_ACTION, lost_check, lost_gpus
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import Measurement


def _reading(host: str, rank: int, bus: str) -> dict:
    """One rank's counter reading as workloads/health.py returns it."""
    return {
        "host": host,
        "rank": rank,
        "nvml": {
            "pci_bus_id": bus,
            "gpu": f"GPU {rank} ({bus})",
            "ecc_uncorrected_volatile": 0,
            "ecc_uncorrected_aggregate": 0,
            "retired_pages": 0,
        },
    }


BEFORE = [_reading("node7", 0, "00000000:18:00.0"), _reading("node7", 1, "00000000:2a:00.0")]
LOST = {
    "host": "node7",
    "rank": 1,
    "skipped": {"nvml": "NVML is not usable on node7: NVMLError_GpuIsLost: GPU is lost"},
}


def test_a_gpu_lost_after_the_run_fails_with_reset_then_rma():
    after = [BEFORE[0], LOST]
    assert health.counter_increases(BEFORE, after) == []  # the comparison of counters alone drops it
    [lost] = lost_gpus(BEFORE, after)
    assert (lost.node, lost.gpu, lost.kind, lost.rank) == ("node7", "GPU 1 (00000000:2a:00.0)", "gpu", 1)
    assert "GpuIsLost" in lost.reason and LOST_ACTION in lost.reason and "RMA" in lost.reason
    check = lost_check([lost])
    assert check.failed and check.value == 1 and "GPU 1 (00000000:2a:00.0) of node7" in check.hint
    # the finding the report and the drain list show: the GPU, and resetting it first
    [finding] = [f for f in findings_of([Measurement.of(check, test_id="t", time=0.0)], suspects=[lost])
                 if f.gpu]  # fmt: skip
    assert (finding.host, finding.action) == ("node7", "reset GPU")
    assert "before and after the run" in finding.why and "peers" not in finding.why


def test_a_rank_that_returned_nothing_loses_its_gpu_too_and_a_healthy_pair_passes():
    [lost] = lost_gpus(BEFORE, [BEFORE[0]])
    assert "rank 1 on node7 returned no reading after the run" in lost.reason
    assert lost_gpus(BEFORE, BEFORE) == []
    assert not lost_check([]).failed
