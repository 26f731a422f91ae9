"""checks/fail_closed.py: every threshold a profile sets is measured, excused by a skip that says
why, not run in this selection, or a NOT MEASURED failure naming the tests that ran for it."""

from __future__ import annotations

import ast
import contextlib
import math
import typing
from pathlib import Path

import pydantic
import pytest

from pytest_gpucluster.checks.fail_closed import (
    NOT_THRESHOLDS,
    OWNERS,
    Inventory,
    Owner,
    coverage,
    profile_thresholds,
)
from pytest_gpucluster.profiles.loader import known_profiles, load_profile
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, Measurement, ThresholdRef
from pytest_gpucluster.results.model import TestOutcome as Outcome
from pytest_gpucluster.results.text import failure_message

CPU = load_profile("cpu-local").model
ACCEPTANCE = Path(__file__).resolve().parents[2] / "acceptance"
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


def test_every_key_of_the_schema_is_a_threshold_with_owners_or_named_a_setting():
    keys = [k for k in _schema_keys(ProfileModel) if not k.startswith("nccl.")]  # expectations_of lists those
    assert not set(OWNERS) & NOT_THRESHOLDS
    assert sorted(set(keys) - NOT_THRESHOLDS) == sorted(OWNERS)
    assert not (set(OWNERS) | NOT_THRESHOLDS) - set(keys), "a key that the schema no longer has"


def _acceptance_functions() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in ACCEPTANCE.glob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[path.name] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return out


def test_every_owner_names_a_test_that_exists_in_the_acceptance_suite():
    found = _acceptance_functions()
    owners = {
        o for name in known_profiles() for t in profile_thresholds(load_profile(name).model) for o in t.owners
    }
    owners |= {o for t in profile_thresholds(_everything()) for o in t.owners}
    for rule in OWNERS.values():
        with contextlib.suppress(AttributeError, TypeError):  # a rule that reads the profile: above
            owners |= set(rule.owners(None, ()))  # type: ignore[arg-type]
    assert len({o.function for o in owners}) > 25
    missing = [str(o) for o in owners if o.function not in found.get(o.module, set())]
    assert not missing, f"owners naming no test of acceptance/: {missing}"
    assert Owner("test_burnin.py", "test_gone") not in owners  # the check above can fail: a made-up owner
    assert "test_gone" not in found["test_burnin.py"]


def _everything() -> ProfileModel:
    """A shipped profile with every kind of threshold set (GPU, RDMA, pins, xid, corrected ECC)."""
    model = load_profile("dgx-h100-ib").model
    burnin = model.burnin.model_copy(update={"require_xid_source": True, "max_corrected_ecc_per_hour": 10.0})
    return model.model_copy(update={"burnin": burnin, "versions": {"driver": "550.90.07"}})


def test_the_keys_that_are_not_min_or_max_are_thresholds_too():
    keys = {t.ref.key for t in profile_thresholds(_everything())}
    assert {
        "nvlink.topology", "burnin.forbidden_throttle_reasons", "cluster.gpu_memory", "cluster.nics_per_node",
        "versions", "burnin.require_xid_source", "cluster.gpu_model",
    } <= keys  # fmt: skip
    assert "burnin.require_xid_source" not in {
        t.ref.key for t in profile_thresholds(CPU)
    }  # false: no threshold


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


def test_a_skip_excuses_only_where_the_cluster_lacks_the_capability_the_test_needs():
    skip = _o("acceptance/test_collectives.py::test_collective[all_reduce-inter-node]", "skipped",
              "Skipped: needs 2 nodes, the cluster has 1")  # fmt: skip
    one_node = Inventory.of(CPU, _facts(["vm"]))
    [excused] = coverage(CPU, [], [skip], one_node).excused
    assert (excused.ref.key, excused.why) == ("collectives.checks[2].min_busbw", "the cluster has 1 node(s)")
    # the same skip on two nodes names no capability the cluster lacks: not measured, the skip quoted
    [check] = coverage(CPU, [], [skip], Inventory.of(CPU, _facts(["a", "b"]))).checks
    assert check.ref.key == "collectives.checks[2].min_busbw" and check.problem == "not measured"
    assert "skipped: needs 2 nodes, the cluster has 1" in check.hint
    crashed = _o(SFT0, "infrastructure", "JobFailed: rank 1 exited")
    [*checks] = coverage(CPU, [], [crashed]).checks
    assert len(checks) == 4 and all(f"{SFT0} (infrastructure)" in c.hint for c in checks)
    assert coverage(CPU, [], []).to_json()["not_run"][0] == "cluster.nodes"


@pytest.mark.parametrize(
    "reason",
    [
        "no before-reading of the ECC/XID counters (test_counters_before did not run in this process)",
        "NVLink state needs NVML (pynvml is not importable (No module named 'pynvml'); pip install nvidia-ml-py)",
        "needs cuda: node gpu-07: lists no GPU",
    ],
)
def test_on_a_gpu_profile_no_skip_excuses_a_gpu_threshold(reason):
    h100 = load_profile("h100-sxm").model
    facts = _facts(["gpu-01", "gpu-02"], gpus=8)
    owners = ["test_burnin.py::test_gpu_health", "test_nvlink.py::test_links_up"]
    found = coverage(h100, [], [_o(f"acceptance/{t}", "skipped", f"Skipped: {reason}") for t in owners],
                     Inventory.of(h100, facts))  # fmt: skip
    keys = {c.ref.key for c in found.checks}
    assert {"burnin.min_matmul", "nvlink.min_link_speed", "burnin.forbidden_throttle_reasons"} <= keys
    assert not [u for u in found.excused if u.ref.key in keys]


def _facts(hosts, gpus=0):
    from pytest_gpucluster.cluster.node_facts import ClusterFacts, GpuFact, NodeFacts

    made = [
        GpuFact(i, "NVIDIA H100 80GB HBM3", None, 85520809984, f"00000000:{0x18 + i:02X}:00.0")
        for i in range(gpus)
    ]
    return ClusterFacts(tuple(NodeFacts(host=h, gpus=tuple(made)) for h in hosts), "test")


def _gpu_m(host, gpu, key=("burnin", "min_matmul")):
    labels = {"host": host, "rank": 0, "gpu": gpu}
    check = Check(
        "burnin.gpu_matmul", 9e14, "FLOP/s", 5e14, ">=", ThresholdRef("h100-sxm", key), labels=labels
    )
    return Measurement.of(check, test_id="acceptance/test_burnin.py::test_gpu_health", time=0.0)


def test_a_gpu_the_inventory_lists_and_the_measurements_lack_is_not_measured_there():
    h100 = load_profile("h100-sxm").model
    inventory = Inventory.of(h100, _facts(["gpu-01", "gpu-02"], gpus=8))
    measured = [
        _gpu_m(h, f"GPU {g} (00000000:{0x18 + g:02x}:00.0)") for h in ("gpu-01", "gpu-02") for g in range(8)
    ]
    ran = [_o("acceptance/test_burnin.py::test_gpu_health")]
    assert not [
        c for c in coverage(h100, measured, ran, inventory).checks if c.ref.key == "burnin.min_matmul"
    ]
    cut = [m for m in measured if not (m.labels["host"] == "gpu-02" and m.labels["gpu"].startswith("GPU 5 "))]
    [check] = [c for c in coverage(h100, cut, ran, inventory).checks if c.ref.key == "burnin.min_matmul"]
    assert check.labels == {"host": "gpu-02", "gpu": "5"} and check.failed and check.problem == "not measured"
    assert "GPU 5 of gpu-02 has no value" in check.hint
    # a node with no value at all: each of its GPUs is named
    other = [m for m in measured if m.labels["host"] != "gpu-02"]
    missing = [
        c.labels for c in coverage(h100, other, ran, inventory).checks if c.ref.key == "burnin.min_matmul"
    ]
    assert missing == [{"host": "gpu-02", "gpu": str(g)} for g in range(8)]


def test_per_dtype_floors_are_thresholds_each():
    numerics = CPU.numerics.model_copy(update={"min_flops": {"bf16": 1e9, "fp32": 2e9}})
    model = CPU.model_copy(update={"numerics": numerics})
    found = {t.ref.key: t for t in profile_thresholds(model)}
    assert found["numerics.min_flops.bf16"].value == 1e9 and "numerics.min_flops.fp32" in found
    assert found["numerics.min_flops.bf16"].unit == "FLOP/s"
    assert [str(o) for o in found["numerics.min_flops.bf16"].owners] == [
        "test_numerics.py::test_numerics_throughput"
    ]
