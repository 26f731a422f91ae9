"""Several workloads in one real 2-rank gloo job (workloads/bundle.py through harness.SharedJobs):
values per part, a part that skips, per-part peak memory, a part that fails or hangs without losing
the parts before it. Three launches, a few seconds each."""

from __future__ import annotations

import json

import pytest

from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.errors import JobFailed, JobSkipped
from pytest_gpucluster.harness import Part, SharedJobs
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import Cluster
from pytest_gpucluster.workloads.bundle import part_path

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)
BASIC = "pytest_gpucluster.workloads.basic"


def part(name: str, func: str, timeout_s: float = 120.0, **options: object) -> Part:
    memory = func == "hold_memory"
    return Part(
        name, f"{BASIC}:{func}", {"tag": name, **options}, timeout_s=timeout_s, measures_memory=memory
    )


def shared(tmp_path, parts: list[Part]) -> SharedJobs:
    cluster = Cluster(
        ClusterSpec.from_local(2, backend="gloo"), get_launcher("torchrun"), tmp_path / "results"
    )
    return SharedJobs(cluster, lambda: parts)


def test_parts_share_one_job_and_each_keeps_its_own_outcome_and_peak(tmp_path):
    parts = [
        part("sum", "all_reduce_sum"),
        part("skip", "skip_everywhere", reason="no NVML on this node"),
        part("big", "hold_memory", mib=400),
        part("small", "hold_memory", mib=0),
    ]
    jobs = shared(tmp_path, parts)
    assert [v["sum"] for v in jobs.run(parts[0], "t1").values] == [3.0, 3.0]
    with pytest.raises(JobSkipped, match=r"skip \(part of job shared-4-parts-.*\): no NVML on this node"):
        jobs.run(parts[1], "t2")
    big, small = jobs.run(parts[2], "t3"), jobs.run(parts[3], "t4")
    # the parts that measure memory run first, then the others in the order asked for
    assert big.job_id == small.job_id and big.companions == ("small", "sum", "skip")
    for rank in (0, 1):
        # each part's peak is its own: the 400 MiB of the part before does not show in it
        assert big.values[rank]["peak_rss_bytes"] - small.values[rank]["peak_rss_bytes"] > 300 << 20
    records = [json.loads(part_path(big.job_dir, i, 0).read_text()) for i in range(4)]
    assert [(r["name"], r["status"]) for r in records] == [
        ("big", "ok"),
        ("small", "ok"),
        ("sum", "ok"),
        ("skip", "skipped"),
    ]
    assert all(r["seconds"] >= 0 for r in records)


def test_a_failing_part_fails_its_tests_and_not_the_parts_before_it(tmp_path):
    parts = [part("first", "noop"), part("boom", "fail_on_rank", rank=1), part("after", "noop")]
    jobs = shared(tmp_path, parts)
    assert [v["rank"] for v in jobs.run(parts[0], "t1").values] == [0, 1]
    with pytest.raises(JobFailed, match=r"(?s)boom failed in a job it shared.*injected failure on rank 1"):
        jobs.run(parts[1], "t2")
    with pytest.raises(JobFailed, match="after did not run: the job it shared failed earlier, in boom"):
        jobs.run(parts[2], "t3")


def test_a_hung_part_is_stopped_at_its_own_deadline(tmp_path):
    parts = [part("first", "noop"), part("stuck", "hang_on_rank", timeout_s=4.0, rank=1)]
    jobs = shared(tmp_path, parts)
    assert jobs.run(parts[0], "t1").values[1]["rank"] == 1
    with pytest.raises(
        JobFailed, match=r"stuck failed in a job it shared with others \(it ran past its 4 s deadline\)"
    ):
        jobs.run(parts[1], "t2")
