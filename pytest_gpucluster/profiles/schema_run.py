"""Profile sections about how a run is made and judged against an earlier one: ``regression:``
(tolerances of the --baseline gate) and ``launch:`` (what reaches the ranks, how Slurm is asked)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from pytest_gpucluster.profiles.fields import (
    Section,
    check_pattern,
)
from pytest_gpucluster.profiles.quantities import (
    parse_fraction,
)


def _tolerance(value: Any) -> Any:
    # YAML 1.1 reads a bare `off` as false: both spellings mean off
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    if value is None or value is True:
        raise ValueError("write a percentage such as 5%, or off (shown, never failed on)")
    return parse_fraction(value)


class RegressionTolerance(Section):
    """How far the metrics matching ``metric`` may regress against ``--baseline`` before the run fails."""

    metric: str = Field(
        description="An fnmatch glob over metric names: 'collectives.*.busbw*', 'sft.step_time'.",
        min_length=1,
    )
    tolerance: Annotated[float | None, BeforeValidator(_tolerance)] = Field(
        description="How far past the baseline's noise a value may move the wrong way: '5%', or 'off' "
        "(compared and shown, never failed on)."
    )
    healthy_spread: Annotated[float | None, BeforeValidator(_tolerance)] = Field(
        None,
        description="How far healthy reruns on this cluster went past the baseline's noise, measured "
        "(benchmarks/gate_noise.py): '40%'. Where it exceeds the tolerance the metric is not gateable "
        "here at that tolerance: a value inside it is shown as 'not gateable', with the spread, and "
        "regresses only beyond it.",
    )
    source: str | None = Field(
        None, description="Where the number comes from (measured noise, a public figure)."
    )

    @field_validator("tolerance")
    @classmethod
    def _a_fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value < 10:
            raise ValueError(f"a tolerance is a percentage from 0% to 1000%, got {value * 100:g}%")
        return value


class RegressionSection(Section):
    """The regression gate (``--baseline``): tolerances per metric glob, the first match wins;
    a metric no glob matches regresses beyond ``--max-regression`` (default 5%)."""

    tolerances: tuple[RegressionTolerance, ...] = ()


class LaunchSection(Section):
    """How jobs are started on this cluster, where the site's defaults are not enough."""

    forward_env: tuple[str, ...] = Field(
        (),
        description="Variable names or shell patterns (MY_SITE_*) forwarded to every rank, besides the "
        "default list (PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, CUDA_*, NCCL_*, FI_*, OFI_*, UCX_*, "
        "TORCH_*, HF_*, OMP_NUM_THREADS) and --forward-env.",
    )
    slurm_gpu_request: Literal["gpus-per-node", "gres", "gpus-per-task"] = Field(
        "gpus-per-node",
        description="How srun asks for a CUDA job's GPUs: --gpus-per-node=N, --gres=gpu:N, or "
        "--gpus-per-task (one GPU per task in --slurm-mode tasks). A GPU request in --launcher-args wins.",
    )

    @field_validator("forward_env")
    @classmethod
    def _patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_pattern(p, "launch.forward_env") for p in patterns)
