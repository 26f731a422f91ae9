"""The plan's estimates (plans/startup.py and the modules that use it): the expected start-up and
work, kept apart from the allowances the deadlines grant, which stay as they were."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_gpucluster.checks.collectives import cases
from pytest_gpucluster.plans.burnin import health_part
from pytest_gpucluster.plans.collectives import sweep_part
from pytest_gpucluster.plans.startup import (
    GPU_STARTUP_S,
    LOCAL_STARTUP_S,
    STARTUP_ALLOWANCE_S,
    expected_startup_s,
    launch_estimate,
)
from pytest_gpucluster.profiles.loader import load_profile

SETTINGS = SimpleNamespace(job_timeout=900.0, rendezvous_timeout=120.0, source={"job_timeout": "default"}.get)


def test_the_expected_start_up_is_seconds_locally_and_grows_with_the_gpu_nodes():
    assert expected_startup_s(1, "gloo") == expected_startup_s(8, "gloo") == LOCAL_STARTUP_S < 10
    assert expected_startup_s(1, "nccl") == GPU_STARTUP_S
    assert expected_startup_s(2, "nccl") == GPU_STARTUP_S + 5.0
    assert expected_startup_s(64, "nccl") == GPU_STARTUP_S + 6 * 5.0 < STARTUP_ALLOWANCE_S


def test_a_launch_counts_its_parts_work_and_one_start_up_leaving_unestimated_parts_out():
    assert launch_estimate([(8.0, 5.0), (13.0, 5.0), (None, 0.0)]) == 3.0 + 8.0 + 5.0
    assert launch_estimate([(None, 0.0)]) is None


def test_the_health_job_expects_seconds_on_the_cpu_where_its_deadline_allows_ten_minutes():
    cpu, gpu = health_part(1, SETTINGS, backend="gloo"), health_part(1, SETTINGS, load_s=60.0)
    assert cpu.estimate_s == 3.0 + LOCAL_STARTUP_S and cpu.startup_s == LOCAL_STARTUP_S
    assert gpu.estimate_s == 15.0 + 60.0 + GPU_STARTUP_S  # the GPU load counts on a GPU node only
    assert cpu.timeout_s == 600.0 and "+ 120 s start-up" in cpu.deadline  # the deadline as before


def test_a_collective_without_a_floor_is_counted_at_its_scopes_floor_and_its_deadline_stays():
    """cpu-local gates all_reduce only: the other intra-node collectives are counted at its floor
    (bus bandwidth is alike across collectives on one link); their deadline, from the bytes at the
    floor rate, does not use that figure."""
    model = load_profile("cpu-local").model
    by_id = {c.id: c for c in cases(model.collectives)}
    gather = by_id["all_gather-intra-node"]
    assert not gather.checks
    part = sweep_part(gather, model.collectives, 1, "gloo", cluster=model.cluster, ranks_per_node=2)
    assert part.estimate_s is not None and LOCAL_STARTUP_S < part.estimate_s < 60.0
    assert "run time not estimated: no expected bandwidth for all_gather-intra-node" in part.deadline
    bare = sweep_part(gather, model.collectives, 1, "gloo", ranks_per_node=2)
    assert part.timeout_s == bare.timeout_s and bare.estimate_s is None
