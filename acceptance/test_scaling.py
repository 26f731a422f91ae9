"""Training throughput grows with the cluster as the profile says: scaling efficiency per step.

The profile's ``scaling:`` section names one SFT case and steps ``{from_nodes, to_nodes,
min_efficiency}``. The case is trained at every count the steps name, each count once
(``unit: nodes``: that many nodes of the case's ranks per node; ``unit: ranks``: that many ranks
on one node, as on the CPU profile), and each step is one test::

    efficiency = throughput(N) / (N / N0 x throughput(N0))

with throughput the whole job's samples/s (``maths.metrics.scaling_efficiency``). Seed 002's team
asks 96% from 2 to 4 nodes and 93% from 4 to 8. Each count's throughput is recorded
(``scaling.samples_per_s``), then the efficiency against ``min_efficiency``. A count that
``test_sft.py`` trains too (the case at its own size) is the same job part, run once.
A step needing more nodes than the cluster has skips saying so. ``--train-log`` does not change
this test: a log of one job cannot tell how throughput scales.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pytest_gpucluster.checks.sft import scaling_checks
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.plans.deadlines import sft_deadline, sft_estimate
from pytest_gpucluster.plans.sft import find_case, scaling_nodes, scaling_part
from pytest_gpucluster.session import GpuClusterSession, get_session


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "scaling_step" not in metafunc.fixturenames:
        return
    profile = get_session(metafunc.config).profile.model
    scaling = profile.scaling
    if scaling is None:
        reason = f"profile {profile.name} has no scaling: section, so there is no scaling to measure"
        skip = pytest.param(None, id="no-scaling", marks=pytest.mark.skip(reason=reason))
        metafunc.parametrize("scaling_step", [skip])
        return
    _, case = find_case(profile, scaling.case)
    params = []
    for index, step in enumerate(scaling.steps):
        needs: dict[str, Any] = {}
        if scaling.unit == "nodes":
            needs["min_nodes"] = step.to_nodes
        elif profile.cluster.device == "cuda":
            needs["min_gpus_per_node"] = step.to_nodes
        if profile.cluster.device == "cuda":
            needs["needs"] = ["cuda"]
        test_id = f"{case.name}-{step.from_nodes}-to-{step.to_nodes}-{scaling.unit}"
        params.append(pytest.param(index, id=test_id, marks=pytest.mark.gpucluster(**needs)))
    metafunc.parametrize("scaling_step", params)


def _count_part(session: GpuClusterSession, params: Mapping[str, Any], end: str) -> Part | None:
    profile, index = session.profile.model, params.get("scaling_step")
    if profile.scaling is None or index is None:
        return None
    count = getattr(profile.scaling.steps[index], end)
    _, case = find_case(profile, profile.scaling.case)
    nodes = scaling_nodes(profile, count)
    deadline = sft_deadline(case, profile, nodes=nodes, settings=session.settings)
    return scaling_part(
        profile, count, session.ranks_per_node, deadline.seconds, deadline.text,
        sft_estimate(case, profile, nodes=nodes),
    )  # fmt: skip


@job_part
def scaling_base(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """The case trained at the step's ``from_nodes``."""
    return _count_part(session, params, "from_nodes")


@job_part
def scaling_top(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """The case trained at the step's ``to_nodes``."""
    return _count_part(session, params, "to_nodes")


def test_scaling(
    scaling_step: int, scaling_base: PartRun, scaling_top: PartRun, hw: Any, results: Any, rerun_part: Any
) -> None:
    """Throughput at ``to_nodes`` against linear scaling from ``from_nodes`` (with ``--baseline``,
    a suspected regression trains both counts once more before it fails)."""
    step = hw.scaling.steps[scaling_step]

    def checks_of(base: PartRun, top: PartRun) -> Any:
        runs = {step.from_nodes: base, step.to_nodes: top}
        return scaling_checks(hw, scaling_step, {n: (run.values, run.origin) for n, run in runs.items()})

    def again(_: Any) -> Any:
        return checks_of(rerun_part(scaling_base.part), rerun_part(scaling_top.part))

    results.check_all(checks_of(scaling_base, scaling_top), remeasure=again)
