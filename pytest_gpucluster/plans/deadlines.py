"""How long a launched job may run before it is declared hung: derived from its work, not one number.

A 10-step tiny model and a 70B ZeRO-3 run cannot share a deadline: one would hang for an hour
before anyone noticed, the other be killed healthy. So an SFT case's deadline comes, in order, from

1. the case's own ``timeout:`` (the profile author's word, who saw the estimate: ``profiles check``);
2. ``--job-timeout`` set explicitly (command line, ``GPUCLUSTER_JOB_TIMEOUT``, ini): the user's
   override for every job that has no ``timeout:`` of its own;
3. the work: :data:`DEADLINE_MARGIN` times the case's estimated run time
   (`profiles.estimates.estimate_case_runtime`: steps x a deliberately slow step at 15% MFU of the
   device's peak, plus the 180 s start-up allowance, `plans.startup`), plus the rendezvous allowance (`rendezvous_allowance`: what
   the session's ``--rendezvous-timeout``, scaled for the job's node count, grants the ranks to
   start beyond those 180 s; a site that needs minutes of container start-up says so there, and
   its derived deadlines grow with it), at least :data:`MIN_DERIVED_S`;
4. ``--job-timeout``'s default, where the work cannot be estimated (a model given as a path).

Sweeps derive theirs from the bytes they move (``plans.collectives.sweep_deadline``): at a floor
rate a fabric fallen back to sockets still beats, and never below the margin over the run estimated
at the expected bandwidth, plus the rendezvous allowance beyond the sweep's own 120 s start-up; an
explicit ``--job-timeout`` overrides that too. Burn-in and fabric jobs derive theirs from their
work plus the same allowance (``plans.burnin_deadlines``), the soak from its length
(``plans.soak.soak_deadline``). A deadline below its
estimate (a ``timeout:`` or ``--job-timeout`` set too low) is kept, the user's word, but flagged. Every `Deadline` carries the sentence that says where it came
from, which ``--gpucluster-dry-run`` prints beside the job. Pure: no pytest, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.launch.job import rendezvous_deadline
from pytest_gpucluster.plans.startup import LONG_STARTUP_ALLOWANCE_S, sft_startup_s
from pytest_gpucluster.profiles.estimates import (
    DEFAULT_JOB_TIMEOUT_S,
    RuntimeEstimate,
    estimate_case_runtime,
)
from pytest_gpucluster.profiles.findings import seconds
from pytest_gpucluster.profiles.schema import ProfileModel, SftCase

__all__ = [
    "DEADLINE_MARGIN",
    "EXPECTED_MFU",
    "MIN_DERIVED_S",
    "Deadline",
    "explicit_timeout",
    "floor_rate",
    "rendezvous_allowance",
    "sft_deadline",
    "sft_estimate",
]

DEADLINE_MARGIN = 1.5
"""The estimate is already slow (15% MFU, 180 s start-up); half as much again covers a loaded
shared filesystem or a slow first NCCL communicator without letting a hung job sit for hours."""
EXPECTED_MFU = 0.30
"""The MFU the plan's SFT estimate expects (`sft_estimate`), where the deadline's is a deliberately
slow 15% (`profiles.estimates.ESTIMATE_MFU`): healthy DeepSpeed/FSDP training on Hopper reaches
33.6% (seed 001, llama2-70b on 4 x 8 H800) to 40-46% (llm-foundry's H100 table, 7B); short SFT
jobs of small batches sit at the low end. Not yet timed on a GPU node by this suite."""
MIN_DERIVED_S = 300.0
"""No derived deadline below 5 minutes: start-up alone can take that on a real site."""


@dataclass(frozen=True, slots=True)
class Deadline:
    seconds: float
    why: str
    """Where the number comes from, as the dry run prints it."""
    estimate_s: float | None = None
    """The estimated run time it was set against, when there is one."""
    estimate_why: str = ""
    """The estimate's arithmetic, or why there is none."""

    @property
    def text(self) -> str:
        """``job timeout T (why); estimated run E (how)``, flagged when T is below E."""
        estimate = ""
        if self.estimate_s is not None:
            how = f", from {self.estimate_why}" if self.estimate_why else ""
            estimate = f"; estimated run {seconds(self.estimate_s)}{how}"
        elif self.estimate_why:
            estimate = f"; {self.estimate_why}"
        warning = " BELOW THE ESTIMATED RUN: a healthy job may be killed" if self.below_estimate else ""
        return f"job timeout {seconds(self.seconds)}{warning} ({self.why}{estimate})"

    @property
    def below_estimate(self) -> bool:
        return self.estimate_s is not None and self.seconds < self.estimate_s


def floor_rate(backend: str) -> float:
    """Bytes per second far below any working fabric, which one fallen back to sockets still beats:
    0.05 GB/s for gloo (a 2-core VM does 1.2 GB/s), 2 GB/s for NCCL. Work-derived deadlines of
    collective jobs (sweeps, burn-in sweeps and pair tests) move their bytes at this rate."""
    return 0.05e9 if backend == "gloo" else 2e9


def explicit_timeout(settings: Any) -> Deadline | None:
    """``--job-timeout`` when the user set it (not its default), else None."""
    source = settings.source("job_timeout")
    if source == "default":
        return None
    return Deadline(settings.job_timeout, f"--job-timeout from {source}")


def sft_deadline(case: SftCase, profile: ProfileModel, *, nodes: int, settings: Any) -> Deadline:
    """The deadline of one job training ``case`` on ``nodes`` nodes (see the module docstring)."""
    estimate = estimate_case_runtime(case, profile.cluster, nodes=nodes, peak_flops=_peak(profile))
    if isinstance(estimate, RuntimeEstimate):
        estimated, how = estimate.total_s, estimate.arithmetic
    else:
        estimated, how = None, f"run time not estimated: {estimate}"
    if case.timeout is not None:
        return Deadline(case.timeout, f"sft case {case.name}'s own timeout:", estimated, how)
    override = explicit_timeout(settings)
    if override is not None:
        return Deadline(override.seconds, override.why, estimated, how)
    if estimated is not None:
        allowance, allowance_why = rendezvous_allowance(nodes, settings)
        derived = max(math.ceil((estimated * DEADLINE_MARGIN + allowance) / 60) * 60, MIN_DERIVED_S)
        why = f"derived: {DEADLINE_MARGIN:g} x the estimated run + {allowance_why}"
        return Deadline(derived, why, estimated, how)
    return Deadline(DEFAULT_JOB_TIMEOUT_S, "--job-timeout default", None, how)


def sft_estimate(case: SftCase, profile: ProfileModel, *, nodes: int) -> float | None:
    """What the plan counts for one job training ``case`` on ``nodes`` nodes: its steps at
    :data:`EXPECTED_MFU` (not the deadline's slow 15%) plus the expected start-up and set-up of a
    training job (`plans.startup.sft_startup_s`), not the deadline's 180 s allowance; None where the
    steps cannot be estimated."""
    estimate = estimate_case_runtime(
        case, profile.cluster, nodes=nodes, peak_flops=_peak(profile), mfu=EXPECTED_MFU
    )
    if not isinstance(estimate, RuntimeEstimate):
        return None
    return estimate.work_s + sft_startup_s(nodes, profile.cluster.backend)


def rendezvous_allowance(
    nodes: int,
    settings: Any,
    *,
    covered_s: float = LONG_STARTUP_ALLOWANCE_S,
    covered_by: str = "the estimate's",
) -> tuple[float, str]:
    """``max(0, rendezvous deadline - covered_s)`` and the sentence the dry run shows: the start-up
    time the session grants ranks (``--rendezvous-timeout`` for ``nodes`` nodes,
    `launch.job.rendezvous_deadline`) that the work's own start-up allowance (``covered_s``: the SFT
    estimate's 180 s by default, a sweep's 120 s, `plans.startup`) does not already cover."""
    granted = rendezvous_deadline(max(nodes, 1), settings.rendezvous_timeout)
    allowance = max(0.0, granted - covered_s)
    source = settings.source("rendezvous_timeout")
    text = (
        f"rendezvous allowance {seconds(allowance)}: --rendezvous-timeout {settings.rendezvous_timeout:g} s "
        f"(from {source}) grants {nodes} node(s) {seconds(granted)} to start, less {covered_by} "
        f"{covered_s:g} s start-up"
    )
    return allowance, text


def _peak(profile: ProfileModel) -> float | None:
    """The profile's peak, else the device table's for its GPU (as ``profiles check`` uses)."""
    if profile.cluster.peak_flops:
        return profile.cluster.peak_flops
    from pytest_gpucluster.profiles.devices import find_device

    device = find_device(profile.cluster.gpu_model) if profile.cluster.device == "cuda" else None
    return device.peak_flops if device is not None else None
