"""What the collective acceptance tests launch: one ``collectives:sweep_many`` part per test.

The profile's ``-b -e -f`` grid for the case's collective (nccl-tests' semantics), plus a one-size
sweep for every checked size off that grid (a 32 GB check beyond a 16 GiB grid, a 3 MiB one between
points). Every case is its own `Part`; the harness runs the parts of one node count in one job, so
the sweeps of all collectives share a start-up. Pure: no torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpucluster.checks.collectives import Case, scope_nodes
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.harness import Part
from pytest_gpucluster.maths.sweep import sweep_sizes
from pytest_gpucluster.profiles.schema import CollectivesSection, SweepSettings
from pytest_gpucluster.results.model import Check

__all__ = [
    "WORKLOAD",
    "SweepRequest",
    "confirmation_part",
    "job_options",
    "job_timeout",
    "sweep_part",
    "sweep_requests",
]

WORKLOAD = "pytest_gpucluster.workloads.collectives:sweep_many"


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """One sweep of one collective over ``sweep_sizes(min_bytes, max_bytes, factor)``."""

    collective: str
    min_bytes: int
    max_bytes: int
    factor: int


def _factor(settings: SweepSettings) -> int:
    if settings.factor != int(settings.factor):
        raise ProfileError(
            f"collectives.sweep.factor is {settings.factor:g}; the sweep multiplies sizes by an integer, "
            "like nccl-tests -f (use 2, 4...)"
        )
    return int(settings.factor)


def sweep_requests(case: Case, settings: SweepSettings) -> list[SweepRequest]:
    """The profile's grid for the case's collective, plus one one-size sweep per checked size
    that the grid does not visit (a 32 GB check beyond a 16 GiB grid, a 3 MiB one between points)."""
    factor = _factor(settings)
    lo, hi = int(settings.min_bytes), int(settings.max_bytes)
    grid = set(sweep_sizes(lo, hi, factor))
    requests = [SweepRequest(case.collective, lo, hi, factor)]
    for size in sorted({int(check.size) for _, check in case.checks} - grid):
        requests.append(SweepRequest(case.collective, size, size, factor))
    return requests


def job_options(requests: Sequence[SweepRequest], settings: SweepSettings, repeat: int) -> dict[str, Any]:
    """The ``options`` of one ``sweep_many`` job."""
    common = {
        "warmup": settings.warmup,
        "iters": settings.iters,
        "dtype": settings.dtype,
        "op": settings.op,
        "check": settings.check,
        "repeat": repeat,
    }
    sweeps = [
        {
            **common,
            "collective": r.collective,
            "min_bytes": r.min_bytes,
            "max_bytes": r.max_bytes,
            "factor": r.factor,
        }
        for r in requests
    ]
    return {"sweeps": sweeps}


def job_timeout(
    requests: Sequence[SweepRequest], settings: SweepSettings, repeat: int, backend: str
) -> float:
    """A deadline for one sweep job that no healthy run comes near: every collective call of the
    plan (warm-up, sync, ``repeat`` x ``iters`` timed, the check; both placements) moving its
    bytes at a floor rate far below any working fabric — 0.05 GB/s for gloo (a 2-core VM does
    1.2 GB/s), 2 GB/s for NCCL — plus 5 s per sweep and 120 s for start-up."""
    floor = 0.05e9 if backend == "gloo" else 2e9
    calls = 2 * (repeat * settings.iters + 2) + 2 * settings.warmup
    moved = sum(sum(sweep_sizes(r.min_bytes, r.max_bytes, r.factor)) * calls for r in requests)
    return 120.0 + 5.0 * len(requests) + moved / floor


def sweep_part(case: Case, section: CollectivesSection, available_nodes: int, backend: str) -> Part | None:
    """The sweeps of one case on the nodes its scope means; None when the scope cannot run here
    (the test skips with ``scope_nodes``' reason)."""
    nodes, reason = scope_nodes(case.scope, available_nodes)
    if reason is not None:
        return None
    requests = sweep_requests(case, section.sweep)
    return Part(
        name=f"collectives-{case.id}",
        workload=WORKLOAD,
        options=job_options(requests, section.sweep, section.repeat),
        nodes=nodes,
        timeout_s=job_timeout(requests, section.sweep, section.repeat, backend),
    )


def confirmation_part(
    first: Part, case: Case, section: CollectivesSection, suspects: Sequence[Check], backend: str
) -> tuple[Part, bool]:
    """What the regression gate re-measures for ``suspects`` of ``case`` (a new part, run alone):
    only their sizes, one one-size sweep each, unless a suspect summarizes the curve (peak busbw,
    busbw at the largest size), which needs the whole grid again (about twice the largest size's
    time, sizes growing by a factor). Returns the part, and whether it is the whole grid.
    The part is ``first`` (the case's sweep part, with its environment) with other sweeps."""
    sizes = {int(s.labels["size_bytes"]) for s in suspects if "size_bytes" in s.labels}
    whole = any(s.baseline_gate for s in suspects) or not sizes
    if whole:
        requests = sweep_requests(case, section.sweep)
    else:
        factor = _factor(section.sweep)
        requests = [SweepRequest(case.collective, size, size, factor) for size in sorted(sizes)]
    part = replace(
        first,
        name=f"{first.name}-confirm",
        options=job_options(requests, section.sweep, section.repeat),
        timeout_s=job_timeout(requests, section.sweep, section.repeat, backend),
    )
    return part, whole
