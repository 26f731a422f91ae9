"""Numerics: a GPU that computes wrong answers fast, and per-dtype GEMM throughput.

Bandwidth and health gates pass a GPU that computes wrong numbers: faulty GPUs and HBM caused
almost half of the unexpected interruptions of Meta's Llama 3 run, and fleet operators run
silent-data-corruption checks beside their burn-in. One job (``workloads/numerics.py``, planned by
``plans/numerics.py``) runs on every rank the same chain of GEMMs and reductions on the same
inputs, made on each device from fixed seeds, per dtype the part supports (CPU: fp32, bf16; GPU:
fp32 with TF32 off and on, bf16, fp16, fp8 where the part and torch have it), repeated for
``numerics.duration``. The verdicts (``checks/numerics.py``), each per host, rank, GPU and dtype:

- ``test_numerics_agreement``: every rank agrees bit for bit with the majority of the ranks of its
  part (cuBLAS promises identical bits on one architecture, SM count and version); a rank in the
  minority is named and goes to the drain list.
- ``test_numerics_repeat_stability``: every rank gives the same bits every time it runs a seed.
- ``test_numerics_known_answer``: a small GEMM and its reductions agree with float64 on the host
  within the dtype's a-priori error bound.
- ``test_numerics_throughput``: TFLOP/s per rank and dtype, recorded for the regression gate and
  gated against ``numerics.min_flops`` (a part profile's: a fraction of the part's dense peak).
- ``test_injected_corruption_is_named``: the self-test. The last rank flips the lowest bit of one
  element of its first dtype's (fp32) output in its first run; the verdicts must name that rank, its host,
  GPU and dtype, and nobody else: stability always, agreement where the rank has peers (on one GPU
  alone, only stability can see it). (Reported here, never written to the drain list.)

Under a CUDA profile every test needs CUDA on the nodes (acceptance/conftest.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pytest_gpucluster.checks import numerics as verdicts
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.plans.numerics import dtype_ceilings, dtype_floors, numerics_part
from pytest_gpucluster.session import GpuClusterSession

pytestmark = pytest.mark.quick
NEEDS_CUDA_UNDER_CUDA_PROFILE = True
"""acceptance/conftest.py: on a CUDA profile, these tests need CUDA on every node."""


@job_part
def numerics_job(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """The numerics chain on every rank of every node, for the run's tier's ``numerics`` duration
    where the profile's ``tiers:`` sets one (plans/tiers.py)."""
    model, tier = session.profile.model, session.tier
    if tier is not None and tier.numerics_s is not None:
        model = model.model_copy(
            update={"numerics": model.numerics.model_copy(update={"duration": tier.numerics_s})}
        )
    return numerics_part(model, session.available_nodes, session.settings)


@job_part
def injected_numerics(session: GpuClusterSession, params: Mapping[str, Any]) -> Part:
    """The same with the last rank flipping one bit (on one GPU alone, stability must see it)."""
    world = session.available_nodes * session.ranks_per_node
    model = session.profile.model
    return numerics_part(model, session.available_nodes, session.settings, inject_rank=world - 1)


def _say(session: Any, line: str) -> None:
    (session.progress or print)(line)


def test_numerics_agreement(numerics_job: PartRun, judge: Any, gpucluster_session: Any) -> None:
    """Every rank's digests, per dtype and seed, against the majority of the ranks of its part."""
    checks, alone = verdicts.agreement_checks(numerics_job.values)
    for line in alone:
        _say(gpucluster_session, f"numerics agreement: {line}")
    if not checks:
        pytest.skip(f"bit-for-bit agreement needs 2+ ranks of one part; {'; '.join(alone) or 'none ran'}")
    judge(checks, verdicts.suspects(checks))


def test_numerics_repeat_stability(numerics_job: PartRun, judge: Any) -> None:
    """Every rank's digests of each seed across its repeats."""
    checks = verdicts.stability_checks(numerics_job.values)
    assert checks, "the numerics job returned no digests"
    judge(checks, verdicts.suspects(checks))


def test_numerics_known_answer(numerics_job: PartRun, judge: Any) -> None:
    """The small GEMM and its row sums against float64, within the dtype's error bound."""
    checks = verdicts.known_answer_checks(numerics_job.values)
    assert checks, "the numerics job returned no known answers"
    judge(checks, verdicts.suspects(checks))


def test_numerics_throughput(
    numerics_job: PartRun, hw: Any, results: Any, rerun_part: Any, gpucluster_session: Any
) -> None:
    """TFLOP/s per rank and dtype against its floor (with ``--baseline``, a suspected regression
    runs the numerics job once more before it fails)."""
    floors, ceilings = dtype_floors(hw), dtype_ceilings(hw)
    checks = verdicts.throughput_checks(numerics_job.values, floors, ceilings)
    assert checks, "the numerics job returned no throughput"
    for value in numerics_job.values:
        shown = ", ".join(verdicts.flops_text(c) for c in checks if c.labels["rank"] == value["rank"])
        _say(gpucluster_session, f"numerics rank {value['rank']} on {value['host']}: {shown}")
    again = lambda _: verdicts.throughput_checks(rerun_part(numerics_job.part).values, floors, ceilings)  # noqa: E731
    results.check_all(checks, remeasure=again)


def test_injected_corruption_is_named(
    injected_numerics: PartRun, results: Any, gpucluster_session: Any
) -> None:
    """Self-test: the last rank flips one bit of one dtype's output once; the verdicts must name it
    (host, rank, GPU, dtype) and nobody else."""
    values = injected_numerics.values
    checks = (
        verdicts.agreement_checks(values)[0]
        + verdicts.stability_checks(values)
        + verdicts.known_answer_checks(values)
    )
    named = verdicts.named(checks)
    shown = "; ".join(f"rank {r} on {h}{f' {g}' if g else ''} {d}" for h, r, g, d in named)
    _say(gpucluster_session, f"numerics self-test: named {shown or 'nobody'}")
    problem = verdicts.injected_problem(values, checks)
    results.check_all([verdicts.self_test_check(values, named, problem)])
    assert problem is None, problem
