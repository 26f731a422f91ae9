"""An XID the suite's own kill causes is not the GPU's fault: a real job killed on its deadline.

The harness stops a hung job (its ranks are killed) and records it as results.json does
(``jobs[]`` with ``status`` failed and its wall-clock window); Xid 45 heard by NVML inside that
window is a warning attributed to the kill, while Xid 79 in the same window is a suspect.
"""

from __future__ import annotations

import pytest

from pytest_gpucluster.checks.burnin.health import application_xids, counter_increases
from pytest_gpucluster.checks.burnin.xid_classes import kill_windows
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import JobFailed
from pytest_gpucluster.harness import Part, SharedJobs
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)


def test_an_application_xid_inside_a_killed_jobs_window_is_the_kills_and_xid_79_a_suspect(tmp_path):
    cluster = Cluster(ClusterSpec.from_local(2, backend="gloo"), get_launcher("torchrun"), tmp_path / "r")
    jobs: list[dict] = []
    shared = SharedJobs(cluster, on_job=jobs.append)
    hang = Part(
        "hang", "pytest_gpucluster.workloads.basic:hang_on_rank", {"rank": 1}, timeout_s=5.0, shareable=False
    )
    with pytest.raises(JobFailed):
        shared.run(hang, "test_xid_after_kill")
    [window] = kill_windows(jobs)
    host = "node7"
    gpus = [
        {"host": host, "rank": r, "nvml": {"pci_bus_id": bus, "gpu": f"GPU {r} ({bus})"}}
        for r, bus in enumerate(("00000000:3B:00.0", "00000000:C6:00.0"))
    ]
    after = [dict(g) for g in gpus]
    after[0]["xid_watch_events"] = [
        {"xid": 45, "pci": "00000000:3b:00.0", "time": window.end, "source": "nvml"},
        {"xid": 79, "pci": "00000000:c6:00.0", "time": window.end, "source": "nvml"},
    ]
    [warning] = [c.hint for c in application_xids(gpus, after, [window])]
    assert "which the suite stopped" in warning and "not blamed" in warning, warning
    [suspect] = counter_increases(gpus, after)
    assert (suspect.gpu, suspect.evidence["action"]) == ("GPU 1 (00000000:C6:00.0)", "drain node")
