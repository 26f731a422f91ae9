"""What the numerics test launches (``acceptance/test_numerics.py``), its deadline, and the per-dtype
throughput floors it is judged against.

- :func:`numerics_part`: ``workloads.numerics:run`` on every rank of the session, with the profile's
  ``numerics:`` options; on a CUDA profile with ``CUBLAS_WORKSPACE_CONFIG`` in the launch
  environment, so that cuBLAS reads it before its first handle exists (a part with its own
  environment never shares a job whose earlier parts could have created one).
- the self-test's part: the same with one rank flipping one bit (:data:`INJECT_BIT`) of one dtype's
  output, shorter (:data:`SELF_TEST_DURATION_S`; every seed still runs twice).
- :func:`dtype_floors`: ``numerics.min_flops[dtype]`` with its profile key; a part profile derives
  them from the part's dense peak per dtype (devices.yaml ``dense_flops``, `profiles.part_rules`).

Pure: no pytest, no torch.
"""

from __future__ import annotations

from typing import Any

from pytest_gpucluster.checks.numerics import Floor
from pytest_gpucluster.harness import Part
from pytest_gpucluster.plans.deadlines import Deadline, explicit_timeout, rendezvous_allowance
from pytest_gpucluster.plans.startup import STARTUP_ALLOWANCE_S, expected_startup_s
from pytest_gpucluster.profiles.findings import seconds
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "INJECT_BIT",
    "NUMERICS",
    "SELF_TEST_DURATION_S",
    "dtype_ceilings",
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
SETUP_S_PER_DTYPE = 60.0
"""Deliberately generous per dtype beyond its share of the duration: inputs made on the device,
the known answer in float64 on the host, the warm-up chain and the minimum repeats of every seed
(on a CPU, an fp16 GEMM of the default size is the slow one)."""
EXPECTED_SETUP_S_PER_DTYPE = 3.0
"""What the set-up of a dtype is expected to take beyond its share of the duration (the dry run's
estimate): under a second per dtype on the 2-core CI VM (the whole cpu-local job, both parts, ran
in 10-15 s wall under load, most of it imports and rendezvous); not yet measured on a GPU."""
DEFAULT_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16", "fp8")}
"""What ``workloads/_numerics_chain.select_dtypes`` runs without ``numerics.dtypes`` (at most)."""


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
    """``--job-timeout`` when set, else the duration + a set-up allowance per dtype + the start-up
    allowance (`plans.startup.STARTUP_ALLOWANCE_S`, as the burn-in jobs have), plus the rendezvous
    allowance."""
    override = explicit_timeout(settings)
    if override is not None:
        return override
    duration = model.numerics.duration if duration_s is None else duration_s
    dtypes = len(model.numerics.dtypes or DEFAULT_DTYPES[model.cluster.device])
    work = duration + SETUP_S_PER_DTYPE * dtypes
    allowance, allowance_why = rendezvous_allowance(
        nodes, settings, covered_s=STARTUP_ALLOWANCE_S, covered_by="the job's"
    )
    why = (
        f"derived: numerics.duration {seconds(duration)} + {SETUP_S_PER_DTYPE:g} s set-up x {dtypes} dtypes "
        f"+ {STARTUP_ALLOWANCE_S:g} s start-up + {allowance_why}"
    )
    estimate = duration + EXPECTED_SETUP_S_PER_DTYPE * dtypes
    how = f"the duration + {EXPECTED_SETUP_S_PER_DTYPE:g} s per dtype"
    return Deadline(work + STARTUP_ALLOWANCE_S + allowance, why, estimate, how)


def numerics_part(model: ProfileModel, nodes: int, settings: Any, *, inject_rank: int | None = None) -> Part:
    """The numerics job on ``nodes`` nodes (the self-test's with ``inject_rank``); its estimate the
    deadline's expected work plus the job's expected start-up (`plans.startup.expected_startup_s`)."""
    options = numerics_options(model, inject_rank=inject_rank)
    deadline = numerics_deadline(model, nodes, settings, options["duration_s"])
    env = {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE} if model.cluster.device == "cuda" else {}
    name = "numerics-injected-corruption" if inject_rank is not None else "numerics"
    startup = expected_startup_s(nodes, model.cluster.backend)
    estimate = deadline.estimate_s + startup if deadline.estimate_s is not None else None
    return Part(
        name, NUMERICS, options, nodes=nodes, env=env, timeout_s=deadline.seconds, deadline=deadline.text,
        estimate_s=estimate, startup_s=startup,
    )  # fmt: skip


def dtype_floors(model: ProfileModel) -> dict[str, Floor]:
    """Each dtype's throughput floor per rank (``numerics.min_flops``), with its profile key."""
    floors: dict[str, Floor] = {}
    for dtype, value in model.numerics.min_flops.items():
        ref = ThresholdRef(model.name, ("numerics", "min_flops", dtype))
        floors[dtype] = Floor(value, ref, f"{format_value(value, 'FLOP/s')} ({ref})")
    return floors


def dtype_ceilings(model: ProfileModel) -> dict[str, tuple[float, str]]:
    """The physical ceiling of each dtype's throughput: the part's dense peak (devices.yaml
    ``dense_flops``); empty for a CPU profile or a part the table does not know."""
    if model.cluster.device != "cuda":
        return {}
    from pytest_gpucluster.profiles.devices import find_device

    device = find_device(model.cluster.gpu_model)
    if device is None:
        return {}
    return {
        dtype: (peak, f"devices.yaml {device.key} dense_flops.{dtype}") for dtype, peak in device.dense_flops
    }
