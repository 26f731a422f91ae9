"""checks/fail_closed.py: every threshold a profile sets is measured, excused by a skip that says
why, not run in this selection, or a NOT MEASURED failure naming the tests that ran for it."""

from __future__ import annotations

import math
import typing

import pydantic
import pytest

from pytest_gpucluster.checks.fail_closed import (
    NOT_THRESHOLDS,
    OWNERS,
    REQUIREMENTS,
    Owner,
    coverage,
    profile_thresholds,
)
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, Measurement, ThresholdRef
from pytest_gpucluster.results.model import TestOutcome as Outcome
from pytest_gpucluster.results.text import failure_message

CPU = load_profile("cpu-local").model
SFT0 = "acceptance/test_sft.py::test_sft[tiny-zero2]"


def _schema_keys(model: type[pydantic.BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, f in model.model_fields.items():
        here = f"{prefix}.{name}" if prefix else name
        subs = [
            b
            for a in (typing.get_args(f.annotation) or (f.annotation,))
            for b in (typing.get_args(a) or (a,))
            if isinstance(b, type) and issubclass(b, pydantic.BaseModel)
        ]
        listed = typing.get_origin(f.annotation) in (list, tuple) or any(
            typing.get_origin(a) in (list, tuple) for a in typing.get_args(f.annotation)
        )
        for sub in subs:
            keys += _schema_keys(sub, here + ("[]" if listed else ""))
        if not subs:
            keys.append(here)
    return keys


def test_every_min_or_max_key_of_the_schema_is_a_threshold_with_owners_or_named_a_setting():
    named = [
        k
        for k in _schema_keys(ProfileModel)
        if k.rsplit(".", 1)[-1].startswith(("min_", "max_")) or "_min_" in k
    ]
    named = [k for k in named if not k.startswith("nccl.")]  # nccl: expectations, listed by expectations_of
    assert named and sorted((set(named) - NOT_THRESHOLDS) | REQUIREMENTS) == sorted(OWNERS)


def test_the_shipped_cpu_profile_thresholds_and_who_judges_them():
    found = {t.ref.key: t for t in profile_thresholds(CPU)}
    assert found["sft.cases[0].max_step_time"].owners == (Owner("test_sft.py", "test_sft", "tiny-zero2"),)
    assert (found["sft.cases[0].max_step_time"].unit, found["sft.cases[0].max_step_time"].comparison) == (
        "s",
        "<=",
    )
    inter = found["collectives.checks[2].min_busbw"]
    assert [str(o) for o in inter.owners] == [
        "test_collectives.py::test_collective[all_reduce-inter-node]",
        "test_collectives.py::test_nccl_tests[all_reduce-inter-node]",
    ]
    assert "collectives.sweep.max_bytes" not in found  # a setting of the sweep, not a threshold
    h200 = {t.ref.key for t in profile_thresholds(load_profile("h200-spectrumx").model)}
    assert {"nccl.min_version", "nccl.gdr", "nvlink.min_link_speed"} <= h200


@pytest.mark.parametrize(
    ("test_id", "hit"),
    [
        ("acceptance/test_sft.py::test_sft[tiny-zero2]", True),
        ("test_sft.py::test_sft[tiny-zero2]", True),
        ("acceptance/test_sft.py::test_sft[tiny-zero3]", False),
        ("acceptance/test_scaling.py::test_sft[tiny-zero2]", False),
        ("acceptance/test_sft.py::test_sft_other[tiny-zero2]", False),
        ("acceptance/test_nccl.py::test_nccl_expectation[launched-tiny-zero2]", True),  # joined ids
    ],
)
def test_an_owner_matches_its_function_and_parameter(test_id, hit):
    owner = Owner(
        "test_nccl.py" if "nccl" in test_id else "test_sft.py",
        "test_nccl_expectation" if "nccl" in test_id else "test_sft",
        "tiny-zero2",
    )
    assert owner.matches(test_id) is hit


def _m(path: tuple, value: float = 1.0) -> Measurement:
    return Measurement.of(
        Check("x", value, "s", 2.0, "<=", ThresholdRef("cpu-local", path)), test_id="t", time=0.0
    )


def _o(test_id: str, category: str = "pass", message: str = "") -> Outcome:
    outcome = {"pass": "passed", "skipped": "skipped"}.get(category, "failed")
    return Outcome(test_id, outcome, category, 1.0, message)  # type: ignore[arg-type]


def test_a_test_that_ran_and_recorded_nothing_under_a_key_fails_it_as_not_measured():
    measured = [_m(("sft", "cases", 0, "max_step_time")), _m(("sft", "cases", 0, "max_peak_memory"))]
    found = coverage(CPU, measured, [_o(SFT0)])
    missing = {c.ref.key: c for c in found.checks if c.ref is not None}
    assert sorted(missing) == ["sft.cases[0].min_samples_per_s", "sft.cases[0].min_tokens_per_s_per_gpu"]
    check = missing["sft.cases[0].min_samples_per_s"]
    assert (
        check.failed and check.problem == "not measured" and math.isnan(check.value) and check.threshold == 20
    )
    text = failure_message(check)
    assert text.startswith(
        "NOT MEASURED: profile.sft.cases[0].min_samples_per_s: measured n/a, expected at least 20"
    )
    assert f"ran: {SFT0} (passed)" in text
    assert found.measured == 2
    # the rest of the profile: its tests never ran here
    assert "collectives.checks[0].min_busbw" in [u.ref.key for u in found.not_run]
    # a NaN check recorded under the key judged it (its own test failed NOT MEASURED, saying why)
    nan = [_m(("sft", "cases", 0, k), math.nan) for k in ("min_samples_per_s", "min_tokens_per_s_per_gpu")]
    assert not coverage(CPU, measured + nan, [_o(SFT0)]).checks


def test_a_skip_with_its_reason_excuses_and_a_failed_test_does_not():
    skip = _o("acceptance/test_collectives.py::test_collective[all_reduce-inter-node]", "skipped",
              "Skipped: needs 2 nodes, the cluster has 1")  # fmt: skip
    found = coverage(CPU, [], [skip])
    [excused] = found.excused
    assert (excused.ref.key, excused.why) == (
        "collectives.checks[2].min_busbw",
        "needs 2 nodes, the cluster has 1",
    )
    crashed = _o(SFT0, "infrastructure", "JobFailed: rank 1 exited")
    [*checks] = coverage(CPU, [], [crashed]).checks
    assert len(checks) == 4 and all(f"{SFT0} (infrastructure)" in c.hint for c in checks)
    assert coverage(CPU, [], []).to_json()["not_run"][0] == "collectives.checks[0].min_busbw"


def test_per_dtype_floors_are_thresholds_each():
    numerics = CPU.numerics.model_copy(update={"min_flops": {"bf16": 1e9, "fp32": 2e9}})
    model = CPU.model_copy(update={"numerics": numerics})
    found = {t.ref.key: t for t in profile_thresholds(model)}
    assert found["numerics.min_flops.bf16"].value == 1e9 and "numerics.min_flops.fp32" in found
    assert found["numerics.min_flops.bf16"].unit == "FLOP/s"
    assert [str(o) for o in found["numerics.min_flops.bf16"].owners] == [
        "test_numerics.py::test_numerics_throughput"
    ]
