"""Profile section of the numerics check (``numerics:``, acceptance/test_numerics.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pytest_gpucluster.profiles.fields import Duration, FlopRate, Section

__all__ = ["NUMERICS_DTYPES", "NumericsDtype", "NumericsSection"]

NumericsDtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
NUMERICS_DTYPES: tuple[str, ...] = NumericsDtype.__args__  # type: ignore[attr-defined]
_WIDEST_ACCUMULATION_ROUNDOFF = 2.0**-8
"""bf16's and fp8's worst-case accumulation roundoff: the known-answer bound needs K u < 1."""


class NumericsSection(Section):
    """Silent data corruption and per-dtype GEMM throughput: every rank runs the same chain of GEMMs
    and reductions on the same inputs (made on its device from fixed seeds) per dtype, and the
    digests are compared across the ranks of one part and across repeats; a small problem is
    checked against float64. Unset floors: throughput recorded, not gated."""

    duration: Duration = Field(
        5.0,
        gt=0,
        description="How long the chains repeat, all dtypes together (each gets an equal share): seconds "
        "for an acceptance run, minutes in a burn-in profile (the GPU stays hot, and an intermittent "
        "fault has time to show). Every seed runs at least min_repeats times whatever the duration.",
    )
    seeds: tuple[int, ...] = Field((1, 2, 3), min_length=1, description="Input seeds, each its own chain.")
    min_repeats: int = Field(2, ge=2, description="Runs of every seed at least (stability needs two).")
    matmul_n: int = Field(
        8192,
        ge=16,
        le=16384,
        multiple_of=16,
        description="GEMM size n (n x n x n): large enough to time the tensor cores at their rate; a "
        "multiple of 16, as fp8 GEMMs need.",
    )
    depth: int = Field(4, ge=1, description="GEMMs chained per run (x = x @ b), then fp32 row sums.")
    known_answer_k: int = Field(
        64,
        ge=16,
        le=128,
        multiple_of=16,
        description="Size of the small GEMM checked against float64 (K of the bound); a multiple of 16, "
        "as fp8 GEMMs need.",
    )
    dtypes: tuple[NumericsDtype, ...] | None = Field(
        None,
        description="Dtypes to run; default: what the device supports (CPU: fp32, bf16; GPU: fp32 with TF32 "
        "off, tf32, bf16, fp16, and fp8 where the part (compute capability 8.9+) and torch have it).",
    )
    min_flops: dict[NumericsDtype, FlopRate] = Field(
        default_factory=dict,
        description="Per-dtype GEMM throughput floor per rank (median of the timed chains); unset: recorded, "
        "not gated. Part profiles derive theirs from the part's dense peak per dtype (devices.yaml "
        "dense_flops, profiles/part_rules.py).",
    )
    source: str | None = Field(None, description="Where the floors come from.")

    @model_validator(mode="after")
    def _bound_is_meaningful(self) -> NumericsSection:
        if self.known_answer_k * _WIDEST_ACCUMULATION_ROUNDOFF >= 1:
            raise ValueError(f"known_answer_k {self.known_answer_k}: K x 2^-8 must stay below 1")
        return self
