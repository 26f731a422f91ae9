"""harness.SharedJobs on a stand-in cluster: equal parts run once, parts that launch alike share one
job, skips and failures reach every test that asked, and a failed shared job still hands finished
parts to their tests. (A real bundle job runs in tests/integration/test_bundle.py.)"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.errors import JobFailed, JobSkipped, LaunchError
from pytest_gpucluster.harness import BUNDLE_WORKLOAD, Part, SharedJobs
from pytest_gpucluster.workloads.bundle import part_path


@dataclass
class Job:
    job_id: str
    job_dir: Path
    values: list[Any]


@dataclass
class Result:
    """What a JobFailed carries: the job directory and one entry per rank."""

    job_id: str
    job_dir: Path
    ranks: tuple[int, ...] = (0, 1)


@dataclass
class FakeCluster:
    """Runs a part as a job whose two ranks return ``{"part": name, "rank": r}``; a bundle as the
    bundle workload would, writing each part's record per rank. ``fail`` names a part that raises."""

    root: Path
    fail: str | None = None
    skip: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def run(self, workload: str, **kwargs: Any) -> Job:
        self.calls.append({"workload": workload, **kwargs})
        job_dir = self.root / f"job{len(self.calls)}"
        job_dir.mkdir()
        if workload != BUNDLE_WORKLOAD:
            if kwargs["name"] == self.skip:
                raise JobSkipped(f"job{len(self.calls)} skipped on rank 0: no CUDA device")
            if kwargs["name"] == self.fail:
                raise JobFailed(
                    "rank 1 raised RuntimeError: boom", result=Result(f"job{len(self.calls)}", job_dir)
                )
            return Job(
                f"job{len(self.calls)}", job_dir, [{"part": kwargs["name"], "rank": r} for r in (0, 1)]
            )
        records: list[list[dict[str, Any]]] = [[], []]
        for index, part in enumerate(kwargs["options"]["parts"]):
            for rank in (0, 1):
                if part["name"] == self.fail:
                    path = part_path(job_dir, index, rank)
                    path.write_text(json.dumps({"name": part["name"], "status": "running"}))
                    raise JobFailed(
                        "rank 1 raised RuntimeError: boom", result=Result(f"job{len(self.calls)}", job_dir)
                    )
                if part["name"] == self.skip:
                    record = {"name": part["name"], "status": "skipped", "reason": "no NVML"}
                else:
                    record = {
                        "name": part["name"],
                        "status": "ok",
                        "value": {"part": part["name"], "rank": rank},
                    }
                part_path(job_dir, index, rank).write_text(json.dumps(record))
                records[rank].append(record)
        return Job(f"job{len(self.calls)}", job_dir, [{"parts": r} for r in records])


def part(name: str, **kwargs: Any) -> Part:
    return Part(name, f"pkg.mod:{name.replace('-', '_')}", {"n": name}, **kwargs)


HEALTH, SWEEP, SFT = part("health"), part("sweep"), part("sft", nproc_per_node=2, measures_memory=True)
ONE_RANK = part("sft-1", nproc_per_node=1)
P2P_OFF = part("p2p-off", env={"NCCL_P2P_DISABLE": "1"})


def test_a_part_alone_runs_as_its_own_job_once(tmp_path):
    cluster = FakeCluster(tmp_path)
    jobs = SharedJobs(cluster)
    first, again = jobs.run(HEALTH, "t1"), jobs.run(part("health"), "t2")
    assert first is again and len(cluster.calls) == 1
    call = cluster.calls[0]
    assert (call["workload"], call["name"], call["options"], call["env"]) == (
        "pkg.mod:health",
        "health",
        {"n": "health"},
        None,
    )
    assert first.values == ({"part": "health", "rank": 0}, {"part": "health", "rank": 1})
    assert first.launched_by == "t1" and first.companions == ()


def test_the_first_request_bundles_every_upcoming_part_that_launches_alike(tmp_path):
    cluster = FakeCluster(tmp_path)
    upcoming = [HEALTH, SWEEP, ONE_RANK, P2P_OFF, SFT, part("kept-apart", shareable=False)]
    jobs = SharedJobs(cluster, lambda: upcoming, env={"NCCL_DEBUG": "WARN"})
    health = jobs.run(HEALTH, "t1")
    [bundle] = cluster.calls
    # the SFT part measures memory: it runs first; nproc None is the cluster's 2 ranks (from spec)
    assert [p["name"] for p in bundle["options"]["parts"]] == ["health", "sweep"]
    assert bundle["workload"] == BUNDLE_WORKLOAD and bundle["timeout"] == 1200.0
    assert bundle["env"] == {"NCCL_DEBUG": "WARN"}  # the session's NCCL environment
    assert health.companions == ("sweep",) and "shared with sweep" in health.origin
    assert jobs.run(SWEEP, "t2").values[1] == {"part": "sweep", "rank": 1}
    assert len(cluster.calls) == 1  # the sweep came from the bundle
    jobs.run(ONE_RANK, "t3")
    jobs.run(P2P_OFF, "t4")
    assert [c["name"] for c in cluster.calls[1:]] == ["sft-1", "p2p-off"]
    assert cluster.calls[2]["env"] == {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1"}  # the part's own on top


def test_explicit_rank_count_matching_the_clusters_bundles_and_memory_parts_go_first(tmp_path):
    cluster = FakeCluster(tmp_path)
    cluster.spec = type("Spec", (), {"nproc_per_node": 2})()  # type: ignore[attr-defined]
    jobs = SharedJobs(cluster, lambda: [HEALTH, SFT, SWEEP])
    jobs.run(HEALTH, "t1")
    assert [p["name"] for p in cluster.calls[0]["options"]["parts"]] == ["sft", "health", "sweep"]


def test_a_skipped_part_skips_every_test_that_asks_for_it(tmp_path):
    cluster = FakeCluster(tmp_path, skip="sweep")
    jobs = SharedJobs(cluster, lambda: [HEALTH, SWEEP])
    assert jobs.run(HEALTH, "t1").values[0]["part"] == "health"
    for test in ("t2", "t3"):
        with pytest.raises(JobSkipped, match=r"sweep \(part of job job1\): no NVML"):
            jobs.run(SWEEP, test)
    alone = SharedJobs(FakeCluster(tmp_path / "alone", skip="health"))
    (tmp_path / "alone").mkdir()
    with pytest.raises(JobSkipped, match="no CUDA device"):
        alone.run(HEALTH, "t")


def test_a_failed_shared_job_keeps_what_finished_and_names_the_part_that_failed(tmp_path):
    cluster = FakeCluster(tmp_path, fail="sweep")
    jobs = SharedJobs(cluster, lambda: [HEALTH, SWEEP, part("after")])
    assert jobs.run(HEALTH, "t1").values[0] == {"part": "health", "rank": 0}
    with pytest.raises(
        JobFailed, match="sweep failed in a job it shared with others: rank 1 raised"
    ) as first:
        jobs.run(SWEEP, "t2")
    with pytest.raises(JobFailed) as second:
        jobs.run(SWEEP, "t3")
    assert first.value is not second.value and str(first.value) == str(second.value)  # fresh, same message
    with pytest.raises(JobFailed, match="after did not run: the job it shared failed earlier, in sweep"):
        jobs.run(part("after"), "t4")
    assert len(cluster.calls) == 1


def test_a_job_that_cannot_launch_fails_every_part_of_it(tmp_path):
    class Broken(FakeCluster):
        def run(self, workload: str, **kwargs: Any) -> Job:
            raise LaunchError("torchrun not found")

    jobs = SharedJobs(Broken(tmp_path), lambda: [HEALTH, SWEEP])
    for p in (HEALTH, SWEEP):
        with pytest.raises(LaunchError, match="torchrun not found"):
            jobs.run(p, "t")


def test_rerun_measures_a_part_again_alone_once_per_part_and_names_it_a_confirmation(tmp_path):
    cluster = FakeCluster(tmp_path)
    first, other = part("sft-a"), part("sft-b")
    jobs = SharedJobs(cluster, upcoming=lambda: [first, other])
    original = jobs.run(first, "t::sft")
    assert [c["workload"] for c in cluster.calls] == [BUNDLE_WORKLOAD]
    again = jobs.rerun(first, "t::sft")
    assert again.job_id != original.job_id and cluster.calls[-1]["name"] == "sft-a-confirm"
    assert cluster.calls[-1]["workload"] == "pkg.mod:sft_a"  # alone, never bundled with what is upcoming
    assert jobs.rerun(first, "t::scaling") is again  # a second test confirming the same part shares it
    assert jobs.run(first, "t::later") is original  # the first run's values are untouched
    assert len(cluster.calls) == 2
    cluster.fail = "sft-b-confirm"
    with pytest.raises(JobFailed, match="boom"):
        jobs.rerun(other, "t::sft-b")
