"""What the SFT and scaling acceptance tests launch: a profile's SFT case becomes a training part.

``workloads/sft.py`` trains the case (``SFTOptions`` field names below); the scaling test trains
the same case at every node (or rank) count its steps name. Also which case a ``--train-log`` is
checked against (``case=NAME:`` before the path). Pure: no pytest, no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.errors import ParseError, ProfileError
from pytest_gpucluster.harness import Part
from pytest_gpucluster.maths.shapes import SHAPES
from pytest_gpucluster.plans.startup import sft_startup_s
from pytest_gpucluster.profiles.schema import ClusterSection, ProfileModel, ScalingSection, SftCase

__all__ = [
    "SFT_WORKLOAD",
    "LogArgument",
    "case_ranks_per_node",
    "find_case",
    "parse_log_argument",
    "scaling_counts",
    "scaling_nodes",
    "scaling_part",
    "sft_part",
    "workload_options",
]

SFT_WORKLOAD = "pytest_gpucluster.workloads.sft:train"
CASE_PREFIX = "case="
_OFFLOAD = {"none": [], "optimizer": ["optimizer"], "optimizer+params": ["optimizer", "param"]}


def _model_option(case: SftCase) -> dict[str, str]:
    key = case.model.strip().lower().replace("_", "-")
    if key in SHAPES:
        return {"model": key}
    if os.sep in case.model or "/" in case.model or case.model.startswith(("~", ".")):
        return {"model_path": os.path.expanduser(case.model)}
    raise ProfileError(
        f"sft case {case.name!r}: model {case.model!r} is neither a named shape ({', '.join(SHAPES)}) "
        "nor a path to a local checkpoint directory (write it with a '/')"
    )


def workload_options(case: SftCase, cluster: ClusterSection) -> dict[str, Any]:
    """The ``workloads/sft.py`` options for ``case`` (``SFTOptions`` field names).

    MFU's denominator is ``cluster.peak_flops`` (the dense BF16/FP16 peak): with ``precision: fp32``
    on a GPU the MFU reads low against it, which is the point of a BF16 peak.
    """
    options: dict[str, Any] = {
        **_model_option(case),
        "zero_stage": case.zero_stage,
        "offload": _OFFLOAD[case.offload],
        "precision": case.precision,
        "micro_batch": case.micro_batch,
        "grad_accum": case.grad_accum,
        "gradient_checkpointing": case.gradient_checkpointing,
        "seq_len": case.seq_len,
        "steps": case.steps,
        "warmup_steps": case.warmup_steps,
        "extra": {"case": case.name},
    }
    if case.attn_implementation is not None:
        options["attn_implementation"] = case.attn_implementation
    if cluster.peak_flops is not None:
        options["peak_flops"] = cluster.peak_flops
    return options


def case_ranks_per_node(case: SftCase, session_ranks_per_node: int) -> int:
    """The case's own ``ranks_per_node``, else the session's (``--nproc-per-node`` or the profile's)."""
    return case.ranks_per_node or session_ranks_per_node


def sft_part(
    case: SftCase,
    profile: ProfileModel,
    *,
    nodes: int,
    nproc_per_node: int,
    timeout_s: float,
    deadline: str = "",
    estimate_s: float | None = None,
) -> Part:
    """Train ``case`` on ``nodes`` x ``nproc_per_node`` ranks under ``timeout_s`` (``deadline``: how it
    was chosen, `plans.deadlines`; ``estimate_s``: `plans.deadlines.sft_estimate`). The same case at the same size is the same part: test_scaling
    reuses test_sft's run (one launch fewer, the same numbers in both)."""
    return Part(
        name=f"sft-{case.name}-{nodes}x{nproc_per_node}",
        workload=SFT_WORKLOAD,
        options=workload_options(case, profile.cluster),
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        timeout_s=timeout_s,
        deadline=deadline,
        measures_memory=True,
        estimate_s=estimate_s,
        startup_s=sft_startup_s(nodes, profile.cluster.backend),
    )


# --------------------------------------------------------------------------------------------
# Scaling
# --------------------------------------------------------------------------------------------


def scaling_counts(scaling: ScalingSection) -> tuple[int, ...]:
    """Every node (or rank) count the steps name, ascending: each is measured once."""
    return tuple(sorted({n for s in scaling.steps for n in (s.from_nodes, s.to_nodes)}))


def scaling_nodes(profile: ProfileModel, count: int) -> int:
    """How many nodes the scaling case runs on at ``count`` (``count`` itself, or 1 for unit ranks)."""
    scaling = profile.scaling
    return 1 if scaling is not None and scaling.unit == "ranks" else count


def scaling_part(
    profile: ProfileModel,
    count: int,
    ranks_per_node: int,
    timeout_s: float,
    deadline: str = "",
    estimate_s: float | None = None,
) -> Part:
    """The scaling case trained at ``count``: that many nodes of the case's ranks per node (unit
    nodes), or that many ranks on one node (unit ranks)."""
    scaling = profile.scaling
    if scaling is None:
        raise ProfileError(f"profile {profile.name} has no scaling: section")
    _, case = find_case(profile, scaling.case)
    if scaling.unit == "ranks":
        nodes, nproc = 1, count
    else:
        nodes, nproc = count, case_ranks_per_node(case, ranks_per_node)
    return sft_part(
        case, profile, nodes=nodes, nproc_per_node=nproc, timeout_s=timeout_s, deadline=deadline,
        estimate_s=estimate_s,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Training logs: which case
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogArgument:
    """One ``--train-log`` value: an optional ``case=NAME:`` prefix, then a path or glob."""

    case: str | None
    pattern: str


def parse_log_argument(argument: str) -> LogArgument:
    """``case=llama-13b-zero2-8gpu:logs/*.log`` -> case and pattern; without the prefix, no case."""
    if argument.startswith(CASE_PREFIX):
        name, sep, pattern = argument[len(CASE_PREFIX) :].partition(":")
        if not sep or not name.strip() or not pattern.strip():
            raise ParseError(
                f"--train-log {argument}: expected case=NAME:PATH (the case name, a colon, then the log path)"
            )
        return LogArgument(name.strip(), pattern.strip())
    return LogArgument(None, argument)


def find_case(profile: ProfileModel, name: str | None) -> tuple[int, SftCase]:
    """The case named ``name`` (the first case when None); ProfileError lists the names."""
    cases = profile.sft.cases
    if not cases:
        raise ProfileError(f"profile {profile.name} has no sft: cases to gate a training log against")
    if name is None:
        return 0, cases[0]
    for index, case in enumerate(cases):
        if case.name == name:
            return index, case
    raise ProfileError(
        f"--train-log case={name}: profile {profile.name} has no sft case of that name "
        f"(its cases: {', '.join(c.name for c in cases)})"
    )
