"""What the numerics test launches (``acceptance/test_numerics.py``), its deadline, and the per-dtype
throughput floors it is judged against.

- :func:`numerics_part`: ``workloads.numerics:run`` on every rank of the session, with the profile's
  ``numerics:`` options; on a CUDA profile with ``CUBLAS_WORKSPACE_CONFIG`` in the launch
  environment, so that cuBLAS reads it before its first handle exists (a part with its own
  environment never shares a job whose earlier parts could have created one).
- the self-test's part: the same with one rank flipping one bit (:data:`INJECT_BIT`) of one dtype's
  output, shorter (:data:`SELF_TEST_DURATION_S`; every seed still runs twice).
- :func:`dtype_floors`: ``numerics.min_flops[dtype]`` where the profile sets one, else
  ``numerics.min_peak_fraction[dtype]`` x the part's dense peak for the dtype (devices.yaml
  ``dense_flops``; a profile's ``cluster.peak_flops`` stands for bf16 and fp16), else no floor.

Pure: no pytest, no torch.
"""

from __future__ import annotations

from typing import Any

from pytest_gpucluster.checks.numerics import Floor
from pytest_gpucluster.harness import Part
from pytest_gpucluster.plans.deadlines import Deadline, explicit_timeout, rendezvous_allowance
from pytest_gpucluster.profiles.findings import seconds
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "INJECT_BIT",
    "NUMERICS",
    "SELF_TEST_DURATION_S",
    "dtype_floors",
    "numerics_deadline",
    "numerics_options",
    "numerics_part",
]

NUMERICS = "pytest_gpucluster.workloads.numerics:run"
CUBLAS_WORKSPACE = ":4096:8"
"""As ``workloads.numerics.CUBLAS_WORKSPACE`` (the rank side imports nothing from here)."""
INJECT_BIT = 0
"""The self-test flips the lowest mantissa bit of one element: the smallest corruption there is."""
SELF_TEST_DURATION_S = 0.0
"""The self-test runs every seed its minimum number of times and no longer."""
STARTUP_S = 120.0
"""Start-up covered before the rendezvous allowance, as the burn-in jobs have."""
SETUP_S_PER_DTYPE = 60.0
"""Deliberately generous per dtype beyond its share of the duration: inputs made on the device,
the known answer in float64 on the host, the warm-up chain and the minimum repeats of every seed
(on a CPU, an fp16 GEMM of the default size is the slow one)."""


def numerics_options(model: ProfileModel, *, inject_rank: int | None = None) -> dict[str, Any]:
    """The workload's options from ``numerics:``; with ``inject_rank``, the self-test's."""
    section = model.numerics
    options: dict[str, Any] = {
        "dtypes": list(section.dtypes) if section.dtypes else None,
        "seeds": list(section.seeds),
        "duration_s": section.duration,
        "min_repeats": section.min_repeats,
        "matmul_n": section.matmul_n,
        "depth": section.depth,
        "known_answer_k": section.known_answer_k,
    }
    if inject_rank is not None:
        options.update(
            duration_s=SELF_TEST_DURATION_S, inject={"rank": inject_rank, "dtype": None, "bit": INJECT_BIT}
        )
    return options


def numerics_deadline(
    model: ProfileModel, nodes: int, settings: Any, duration_s: float | None = None
) -> Deadline:
    """``--job-timeout`` when set, else the duration + a set-up allowance per dtype + start-up, plus
    the rendezvous allowance."""
    override = explicit_timeout(settings)
    if override is not None:
        return override
    duration = model.numerics.duration if duration_s is None else duration_s
    dtypes = len(model.numerics.dtypes or ("fp32", "tf32", "bf16", "fp16", "fp8"))
    work = duration + SETUP_S_PER_DTYPE * dtypes
    allowance, allowance_why = rendezvous_allowance(
        nodes, settings, covered_s=STARTUP_S, covered_by="the job's"
    )
    why = (
        f"derived: numerics.duration {seconds(duration)} + {SETUP_S_PER_DTYPE:g} s set-up x {dtypes} dtypes "
        f"+ {STARTUP_S:g} s start-up + {allowance_why}"
    )
    return Deadline(work + STARTUP_S + allowance, why, work, "")


def numerics_part(model: ProfileModel, nodes: int, settings: Any, *, inject_rank: int | None = None) -> Part:
    """The numerics job on ``nodes`` nodes (the self-test's with ``inject_rank``)."""
    options = numerics_options(model, inject_rank=inject_rank)
    deadline = numerics_deadline(model, nodes, settings, options["duration_s"])
    env = {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE} if model.cluster.device == "cuda" else {}
    name = "numerics-injected-corruption" if inject_rank is not None else "numerics"
    return Part(
        name, NUMERICS, options, nodes=nodes, env=env, timeout_s=deadline.seconds, deadline=deadline.text
    )


def dtype_floors(model: ProfileModel, device: Any | None) -> dict[str, Floor]:
    """Each dtype's throughput floor per rank (module doc), with its profile key and derivation.
    ``device``: the part's `profiles.devices.Device` (None: CPU, or a part the table lacks)."""
    section, profile = model.numerics, model.name
    floors: dict[str, Floor] = {}
    for dtype, value in section.min_flops.items():
        ref = ThresholdRef(profile, ("numerics", "min_flops", dtype))
        floors[dtype] = Floor(value, ref, f"{format_value(value, 'FLOP/s')} ({ref})")
    for dtype, fraction in section.min_peak_fraction.items():
        if dtype in floors:
            continue
        peak, source = _peak(model, device, dtype)
        if peak is None:
            continue  # no peak to take a fraction of: recorded, not gated (profiles check says so)
        ref = ThresholdRef(profile, ("numerics", "min_peak_fraction", dtype))
        floors[dtype] = Floor(
            fraction * peak,
            ref,
            f"{fraction:.0%} of the dense {dtype} peak {format_value(peak, 'FLOP/s')} ({source}; {ref})",
        )
    return floors


def _peak(model: ProfileModel, device: Any | None, dtype: str) -> tuple[float | None, str]:
    if dtype in ("bf16", "fp16") and model.cluster.peak_flops:
        return model.cluster.peak_flops, "cluster.peak_flops"
    if device is None:
        return None, ""
    return device.dense_peak(dtype), f"devices.yaml {device.key} dense_flops.{dtype}"
