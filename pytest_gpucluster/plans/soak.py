"""What the soak launches (``--gpucluster-soak``, acceptance/test_fabric.py::test_soak): one job on
every node, ``workloads/soak.py``, repeating the profile's gated busbw points for the duration.

The points and which of them this session can run are ``checks/burnin/soak.py``'s; this module
builds the job's options and its deadline. The job runs alone (never bundled): it times itself and
would slow everything beside it. Pure: no pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_gpucluster.checks.burnin.soak import SoakPoint
from pytest_gpucluster.harness import Part
from pytest_gpucluster.plans.deadlines import Deadline, rendezvous_allowance
from pytest_gpucluster.plans.startup import LONG_STARTUP_ALLOWANCE_S, expected_startup_s
from pytest_gpucluster.profiles.findings import seconds
from pytest_gpucluster.profiles.schema import SoakSettings

__all__ = ["WORKLOAD", "soak_deadline", "soak_estimate", "soak_options", "soak_timeout"]

WORKLOAD = "pytest_gpucluster.workloads.soak:soak"


def progress_interval(duration_s: float) -> float:
    """About 12 progress lines per soak, one every 2 to 30 s."""
    return min(max(duration_s / 12.0, 2.0), 30.0)


def soak_options(points: Sequence[SoakPoint], settings: SoakSettings, duration_s: float) -> dict[str, Any]:
    return {
        "points": [p.options() for p in points],
        "duration_s": duration_s,
        "sample_s": settings.sample_time,
        "progress_s": progress_interval(duration_s),
    }


def soak_timeout(duration_s: float, points: Sequence[SoakPoint], settings: SoakSettings) -> float:
    """A deadline no healthy soak comes near: the duration, start-up, and room for the last round to
    run 20x slower than the first (a link that degrades late makes its samples longer, and the soak
    stops only after the round it is in)."""
    round_s = settings.sample_time * max(len(points), 1) * 2  # inter-node with an odd node count: 2 phases
    return LONG_STARTUP_ALLOWANCE_S + duration_s * 1.25 + 20.0 * round_s


def soak_deadline(
    duration_s: float, points: Sequence[SoakPoint], settings: SoakSettings, nodes: int, session_settings: Any
) -> Deadline:
    """`soak_timeout` plus the rendezvous allowance beyond its 180 s start-up allowance
    (`plans.deadlines.rendezvous_allowance` for ``nodes`` nodes). ``--job-timeout`` does not
    override it: the soak's length is the user's own ``--gpucluster-soak``, and a shorter deadline
    would only kill it."""
    work = soak_timeout(duration_s, points, settings)
    allowance, allowance_why = rendezvous_allowance(
        nodes, session_settings, covered_s=LONG_STARTUP_ALLOWANCE_S, covered_by="the soak's"
    )
    why = (
        f"derived: {seconds(duration_s)} of soak x 1.25 + {LONG_STARTUP_ALLOWANCE_S:g} s start-up + room for a last "
        f"round 20x slower = {seconds(work)}, + {allowance_why}"
    )
    return Deadline(work + allowance, why, duration_s, "--gpucluster-soak")


def soak_estimate(duration_s: float, nodes: int, backend: str) -> float:
    """What the plan counts for the soak: its duration plus the job's expected start-up."""
    return duration_s + expected_startup_s(nodes, backend)


def soak_part(
    duration_s: float,
    points: Sequence[SoakPoint],
    settings: SoakSettings,
    nodes: int,
    deadline: Deadline,
    *,
    backend: str = "nccl",
) -> Part:
    """The soak as the plan counts it (acceptance/test_fabric.py launches it itself): its duration
    plus the expected start-up (`soak_estimate`)."""
    return Part(
        "burnin-soak", WORKLOAD, soak_options(points, settings, duration_s), nodes=nodes,
        timeout_s=deadline.seconds, deadline=deadline.text, estimate_s=soak_estimate(duration_s, nodes, backend),
        startup_s=expected_startup_s(nodes, backend), shareable=False,
    )  # fmt: skip
