"""What ``max_latency`` is gated on (nccl-tests' time, or the CPU sweep's), and the NCCL
algorithm a scope's sweep job runs with (``collectives.scope_env``, issue 18's wiring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.checks.collective_data import points_from_runs
from pytest_gpucluster.checks.collectives import CollectiveData, cases, collect, collective_checks
from pytest_gpucluster.harness import SharedJobs
from pytest_gpucluster.parsers.nccl_tests import parse
from pytest_gpucluster.plans.collectives import job_env, sweep_part
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import CollectivesSection

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
KiB, MiB = 1 << 10, 1 << 20
LATENCY_1K = {"collective": "all_reduce", "scope": "intra-node", "size": "1KiB", "max_latency": "30us"}


def rank_value(rank: int, timer: str) -> dict:
    """One rank's ``collectives:sweep`` value: 1 KiB all_reduce in 60 us per call (3 repeats)."""
    cell = {"times_us": [60.0, 61.0, 59.0], "lag_us": [0.0] * 3, "wrong": 0}
    point = {"size_bytes": KiB, "count": KiB // 4, "out_of_place": cell}
    return {"collective": "all_reduce", "nranks": 2, "rank": rank, "timer": timer, "points": [point]}


def latency_check(timer: str):
    values = [{"sweeps": [rank_value(r, timer)], "rank": r, "host": f"n{r}", "nranks": 2} for r in range(2)]
    data = collect(values)["all_reduce"]
    case = cases(CollectivesSection.model_validate({"checks": [LATENCY_1K]}))[0]
    checks = collective_checks(case, data, profile="p", nodes=1, dtype="float32", origin="job J")
    return data, next(c for c in checks if c.metric == "collectives.all_reduce.latency")


def test_the_cpu_sweeps_time_per_call_is_gated():
    """The CPU path (gloo; perf_counter around a loop of blocking calls) keeps its gate."""
    data, check = latency_check("perf_counter")
    assert data.timer == "perf_counter"
    assert check.failed and check.threshold == pytest.approx(30e-6) and check.ref is not None


def test_the_torch_sweeps_cuda_event_time_is_recorded_not_gated():
    """On a GPU the torch sweep's span includes Python dispatch per call (~2x nccl-tests at small
    sizes): the same 60 us is recorded as information, the hint naming the key nccl-tests gates.
    Stands for an 8-GPU node's sweep value, whose ``timer`` is ``cuda_events``."""
    data, check = latency_check("cuda_events")
    assert data.timer == "cuda_events"
    assert check.threshold is None and check.ref is None and not check.failed
    assert check.value == pytest.approx(60e-6)
    assert check.hint.startswith(
        "Not gated here: collectives.checks[0].max_latency is gated on nccl-tests' output only (test_nccl_tests)."
    )


def test_nccl_tests_time_is_gated_against_max_latency():
    """A real 2-node x 8 H100 nccl-tests run: its own time per call is what max_latency means."""
    text = (DATA / "gcp_a3mega_h100x16_all_reduce_2node.md").read_text()
    data = CollectiveData("all_reduce", tuple(points_from_runs([parse(text)])), hosts=("a", "b"))
    limit = {"collective": "all_reduce", "scope": "inter-node", "size": "1MiB", "max_latency": "100us"}
    case = cases(CollectivesSection.model_validate({"checks": [limit]}))[-1]
    checks = collective_checks(
        case, data, profile="p", nodes=2, dtype="float32", origin="x", tool="nccl-tests"
    )
    [gate] = [c for c in checks if c.metric.endswith(".latency") and c.threshold is not None]
    assert gate.failed and gate.value == pytest.approx(203.2e-6) and gate.labels["size_bytes"] == MiB


# ------------------------------------------------------------------------------- the algorithm


def test_the_inter_node_job_runs_with_the_algorithm_the_floor_assumes():
    """h800-ib-like: an inter-node floor measured with Tree, NCCL_ALGO scoped to that job only."""
    model = load_profile("dgx-h100-ib").model
    inter = {
        "collective": "all_reduce",
        "scope": "inter-node",
        "size": "1GiB",
        "min_busbw": "40GB/s",
        "algo": "Tree",
    }
    collectives = model.collectives.model_copy(
        update={
            "checks": (*model.collectives.checks, type(model.collectives.checks[0]).model_validate(inter)),
            "scope_env": {"inter-node": {"NCCL_ALGO": "allreduce:Tree"}},
        }
    )
    model = model.model_copy(update={"collectives": collectives})
    assert job_env(model, "inter-node") == {"NCCL_ALGO": "allreduce:Tree"}
    assert job_env(model, "intra-node") == {}
    by_id = {c.id: c for c in cases(model.collectives)}
    part = sweep_part(
        by_id["all_reduce-inter-node"], model.collectives, 2, "nccl", job_env(model, "inter-node")
    )
    intra = sweep_part(
        by_id["all_reduce-intra-node"], model.collectives, 2, "nccl", job_env(model, "intra-node")
    )
    assert part.env == {"NCCL_ALGO": "allreduce:Tree"} and intra.env == {}
    # the harness launches the part under the session's NCCL variables with the scope's over them
    jobs = SharedJobs(cluster=None, env={"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "=mlx5_0"})
    assert jobs._env(part) == {"NCCL_ALGO": "allreduce:Tree", "NCCL_IB_HCA": "=mlx5_0"}


def algo_checks(env: dict[str, str] | None):
    floor = {
        "collective": "all_reduce",
        "scope": "inter-node",
        "size": "1KiB",
        "min_busbw": "1MB/s",
        "algo": "Tree",
    }
    case = cases(CollectivesSection.model_validate({"checks": [floor]}))[-1]
    values = [
        {"sweeps": [rank_value(r, "cuda_events")], "rank": r, "host": f"n{r}", "nranks": 2} for r in range(2)
    ]
    data = collect(values)["all_reduce"]
    checks = collective_checks(case, data, profile="p", nodes=2, dtype="float32", origin="job J", env=env)
    return next(c for c in checks if c.metric.endswith(".busbw") and c.threshold is not None)


def test_the_jobs_algorithm_is_a_label_and_the_floor_says_what_it_assumes():
    gate = algo_checks({"NCCL_ALGO": "allreduce:Tree"})
    assert gate.labels["nccl_algo"] == "allreduce:Tree"
    assert "the floor assumes NCCL algorithm Tree" in gate.hint and "does not allow" not in gate.hint
    assert "nccl_algo" not in algo_checks({}).labels  # unset: no label, the baseline key unchanged


def test_a_job_whose_environment_excludes_the_floors_algorithm_says_so():
    gate = algo_checks({"NCCL_ALGO": "Ring"})
    assert "which this job's environment does not allow (NCCL_ALGO=Ring" in gate.hint
    assert "collectives.scope_env.inter-node.NCCL_ALGO" in gate.hint
