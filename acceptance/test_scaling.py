"""Training throughput grows with the cluster as the profile says: scaling efficiency per step.

The profile's ``scaling:`` section names one SFT case and steps ``{from_nodes, to_nodes,
min_efficiency}``. The case is trained at every count the steps name, each count once
(``unit: nodes``: that many nodes of the case's ranks per node; ``unit: ranks``: that many ranks
on one node, as on the CPU profile), and each step is one test::

    efficiency = throughput(N) / (N / N0 x throughput(N0))

with throughput the whole job's samples/s (``metrics.scaling_efficiency``). Seed 002's team asks
96% from 2 to 4 nodes and 93% from 4 to 8. Each count's throughput is recorded
(``scaling.samples_per_s``), then the efficiency against ``min_efficiency``. A count that
``test_sft.py`` already trained (the case at its own size) is reused, not launched again.
A step needing more nodes than the cluster has skips saying so. ``--train-log`` does not change
this test: a log of one job cannot tell how throughput scales.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gpucluster.checks.sft import (
    Check,
    SftRun,
    find_case,
    gate,
    run_case,
    scaling_job,
    scaling_throughput,
)
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.maths.metrics import scaling_efficiency
from pytest_gpucluster.plugin import get_session

RUNS_KEY = "sft.runs"
"""Shared with test_sft.py: launched runs by (case, nodes, ranks per node)."""
RECORDED_KEY = "scaling.recorded"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "scaling_step" not in metafunc.fixturenames:
        return
    profile = get_session(metafunc.config).profile.model
    scaling = profile.scaling
    if scaling is None:
        reason = f"profile {profile.name} has no scaling: section, so there is no scaling to measure"
        metafunc.parametrize(
            "scaling_step", [pytest.param(None, id="no-scaling", marks=pytest.mark.skip(reason=reason))]
        )
        return
    _, case = find_case(profile, scaling.case)
    params = []
    for index, step in enumerate(scaling.steps):
        marks: dict[str, Any] = {}
        if scaling.unit == "nodes":
            marks["min_nodes"] = step.to_nodes
        elif profile.cluster.device == "cuda":
            marks["min_gpus_per_node"] = step.to_nodes
        if profile.cluster.device == "cuda":
            marks["needs"] = ["cuda"]
        params.append(
            pytest.param(
                index,
                id=f"{case.name}-{step.from_nodes}-to-{step.to_nodes}-{scaling.unit}",
                marks=pytest.mark.gpucluster(**marks),
            )
        )
    metafunc.parametrize("scaling_step", params)


def _run_at(count: int, hw, session, request: pytest.FixtureRequest) -> SftRun:
    scaling = hw.scaling
    _, case = find_case(hw, scaling.case)
    nodes, nproc = scaling_job(scaling, case, count, session.ranks_per_node)
    try:
        return run_case(
            request.getfixturevalue("cluster"),
            session.extra.setdefault(RUNS_KEY, {}),
            case,
            hw,
            nodes=nodes,
            nproc_per_node=nproc,
            timeout=session.settings["gpucluster_job_timeout"],
            test_id=request.node.nodeid,
        )
    except JobSkipped as exc:
        pytest.skip(str(exc))


def test_scaling(scaling_step: int, hw, gpucluster_session, request, results) -> None:
    """Throughput at ``to_nodes`` against linear scaling from ``from_nodes``."""
    scaling = hw.scaling
    step = scaling.steps[scaling_step]
    unit = scaling.unit
    runs = {n: _run_at(n, hw, gpucluster_session, request) for n in (step.from_nodes, step.to_nodes)}
    throughput = {n: scaling_throughput(run.values) for n, run in runs.items()}
    checks = []
    recorded = gpucluster_session.extra.setdefault(RECORDED_KEY, set())
    for n, run in runs.items():
        if (scaling.case, n) in recorded:  # a count shared by two steps (2->4, 4->8) is recorded once
            continue
        recorded.add((scaling.case, n))
        reused = run.test_id != request.node.nodeid
        checks.append(
            Check(
                "scaling.samples_per_s",
                throughput[n],
                None,
                "samples/s",
                labels={"case": scaling.case, unit: n},
                context=f"{len(run.values)} ranks, job dir {run.job_dir}"
                + (f" (the run of {run.test_id})" if reused else ""),
            )
        )
    base, top = step.from_nodes, step.to_nodes
    efficiency = scaling_efficiency(throughput[top], top, throughput[base], base)
    checks.append(
        Check(
            "scaling.efficiency",
            efficiency,
            step.min_efficiency,
            "fraction",
            ">=",
            {"case": scaling.case, "unit": unit, "from": base, "to": top},
            None,
            f"profile {hw.name}: scaling.steps[{scaling_step}].min_efficiency"
            + (f" ({scaling.source})" if scaling.source else ""),
            f"throughput({top} {unit}) = {throughput[top]:.4g} samples/s against {top / base:g} x "
            f"throughput({base} {unit}) = {throughput[base]:.4g} samples/s. Next: test_sft's step time at "
            f"each size, and the collectives tests across the {unit} added (gradients cross them every step).",
        )
    )
    gate(results, checks)
