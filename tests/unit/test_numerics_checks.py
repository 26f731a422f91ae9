"""Judging the numerics job (checks/numerics.py) on the records of a real 2-rank run on the CPU VM
(tests/data/numerics: the clean part and the self-test's part of one acceptance run), and on
copies of them that stand for more ranks, a consistently wrong rank, or a skipped dtype; and the
per-dtype floors (plans/numerics.py) of the shipped profiles."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks import numerics as v
from pytest_gpucluster.plans.numerics import dtype_floors, numerics_part
from pytest_gpucluster.profiles.devices import load_devices
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.text import failure_message

DATA = Path(__file__).parents[1] / "data" / "numerics"


def _clean() -> list[dict[str, Any]]:
    return json.loads((DATA / "cpu_vm_2ranks.json").read_text())


def _injected() -> list[dict[str, Any]]:
    return json.loads((DATA / "cpu_vm_2ranks_injected.json").read_text())


def _as_rank(record: dict[str, Any], rank: int, gpu: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(record)
    out.update(rank=rank, local_rank=rank, gpu=gpu, injected=None)
    return out


def _corrupt_everywhere(record: dict[str, Any], dtype: str, seed: str) -> None:
    """Every run of ``seed`` gave another digest: a GPU that is consistently wrong."""
    counts = record["dtypes"][dtype]["digests"][seed]
    record["dtypes"][dtype]["digests"][seed] = {"f" * 32: sum(counts.values())}


def _failed(checks: list[Any]) -> list[tuple[int, str]]:
    return sorted((c.labels["rank"], c.labels["dtype"]) for c in checks if c.failed)


def test_a_healthy_run_passes_every_verdict_per_rank_and_dtype() -> None:
    values = _clean()
    agreement, alone = v.agreement_checks(values)
    checks = agreement + v.stability_checks(values) + v.known_answer_checks(values)
    assert alone == []
    assert {(c.metric, c.labels["rank"], c.labels["dtype"]) for c in checks} == {
        (m, r, d) for m in v.VERDICTS for r in (0, 1) for d in ("fp32", "bf16")
    }
    assert not any(c.failed for c in checks)
    assert all(c.baseline_gate is False for c in checks)


def test_the_injected_flip_is_named_by_agreement_and_stability_and_nobody_else() -> None:
    values = _injected()
    agreement, _ = v.agreement_checks(values)
    stability = v.stability_checks(values)
    assert _failed(agreement) == [(1, "bf16")]
    assert _failed(stability) == [(1, "bf16")]
    checks = agreement + stability + v.known_answer_checks(values)
    assert v.named(checks) == [(values[1]["host"], 1, None, "bf16")]
    assert v.injected_problem(values, checks) is None
    hint = next(c.hint for c in agreement if c.failed)
    assert "rank 1 on" in hint and "bf16" in hint and "where 2 of 2 ranks gave" in hint
    suspects = v.suspects(checks)
    assert [(s.node, s.rank, s.kind, s.check, s.evidence["dtype"]) for s in suspects] == [
        (values[1]["host"], 1, "node", "numerics", "bf16"),
        (values[1]["host"], 1, "node", "numerics", "bf16"),
    ]


def test_a_self_test_that_names_the_wrong_rank_or_nobody_says_so() -> None:
    values = _injected()
    clean = v.agreement_checks(_clean())[0] + v.stability_checks(_clean())
    problem = v.injected_problem(values, clean)
    assert problem is not None and "named nobody" in problem and "flipped bit 0 of its bf16" in problem
    values[0]["injected"] = None
    values[1]["injected"] = None
    assert "got 0" in (v.injected_problem(values, clean) or "")


def test_a_consistently_wrong_gpu_is_the_minority_of_three_and_named_with_its_gpu() -> None:
    base = _clean()[0]
    gpus = [f"GPU {i} (00000000:{i + 0x18:02X}:00.0)" for i in range(3)]
    values = [_as_rank(base, r, gpus[r]) for r in range(3)]
    _corrupt_everywhere(values[2], "fp32", "2")
    checks, _ = v.agreement_checks(values)
    assert _failed(checks) == [(2, "fp32")]
    bad = next(c for c in checks if c.failed)
    assert bad.labels == {"host": base["host"], "rank": 2, "gpu": gpus[2], "dtype": "fp32"}
    assert bad.value == 1  # one seed of three
    assert f"{gpus[2]} of {base['host']} (rank 2), fp32" in failure_message(bad)
    # consistent: the repeats agree with each other, so only the vote can see it
    assert not any(c.failed for c in v.stability_checks(values))
    assert [s.kind for s in v.suspects(checks)] == ["gpu"]


def test_two_ranks_that_disagree_consistently_are_both_named_for_want_of_a_majority() -> None:
    values = [_as_rank(_clean()[0], 0), _as_rank(_clean()[0], 1)]
    _corrupt_everywhere(values[1], "bf16", "1")
    checks, _ = v.agreement_checks(values)
    assert _failed(checks) == [(0, "bf16"), (1, "bf16")]
    assert all("no digest held by a majority of 2 ranks" in c.hint for c in checks if c.failed)


def test_ranks_on_different_platforms_are_not_compared_and_a_lone_one_is_said() -> None:
    values = [_as_rank(_clean()[0], r) for r in range(3)]
    values[2]["platform"]["key"] = "CPU AVX2 (x86_64), 1 threads, torch 2.13.0+cpu"
    _corrupt_everywhere(values[2], "fp32", "1")
    checks, alone = v.agreement_checks(values)
    assert {c.labels["rank"] for c in checks} == {0, 1}
    assert not any(c.failed for c in checks)
    assert len(alone) == 1 and "rank 2" in alone[0] and "AVX2" in alone[0]


def test_an_unstable_rank_fails_stability_even_where_nobody_agrees() -> None:
    values = [_as_rank(_clean()[0], 0)]
    values[0]["dtypes"]["fp32"]["digests"]["3"] = {"a" * 32: 5, "b" * 32: 2}
    values[0]["dtypes"]["fp32"]["first_change"] = {"3": 4}
    checks = v.stability_checks(values)
    bad = [c for c in checks if c.failed]
    assert [(c.labels["dtype"], c.value) for c in bad] == [("fp32", 2.0)]
    assert "seed 3: 2 different digests in 7 runs, the first change at run 4" in bad[0].hint


def test_a_known_answer_beyond_its_bound_fails_naming_the_element() -> None:
    values = _clean()
    values[1]["dtypes"]["bf16"]["known_answer"].update(ratio=3.5, gemm_ratio=3.5)
    checks = v.known_answer_checks(values)
    assert _failed(checks) == [(1, "bf16")]
    assert "Worst element [" in next(c.hint for c in checks if c.failed)


def test_throughput_is_recorded_per_rank_and_dtype_with_its_spread_and_gated_where_floored() -> None:
    values = _clean()
    ungated = v.throughput_checks(values, {})
    assert [(c.labels["rank"], c.labels["dtype"], c.threshold) for c in ungated] == [
        (0, "bf16", None), (0, "fp32", None), (1, "bf16", None), (1, "fp32", None)
    ]  # fmt: skip
    for check in ungated:
        done = values[check.labels["rank"]]["dtypes"][check.labels["dtype"]]
        assert check.value == done["flops"] and check.spread is not None and check.spread.n == done["runs"]
    floors = {"bf16": v.Floor(1e15, None, "absurd"), "fp8": v.Floor(1.0, None, "any")}
    gated = v.throughput_checks(values, floors)
    assert _failed([c for c in gated if c.measured]) == [(0, "bf16"), (1, "bf16")]
    missing = [c for c in gated if c.labels["dtype"] == "fp8"]
    assert [c.problem for c in missing] == ["not measured", "not measured"]
    assert all(math.isnan(c.value) and "not run" in c.hint for c in missing)


# ------------------------------------------------------------------------ plans/numerics


def test_floors_are_the_profiles_min_flops_per_dtype_with_their_keys() -> None:
    """A part profile's floors are fractions of the part's dense peaks (tests/unit/test_part_profiles.py
    recomputes them); a site profile that extends the part inherits them."""
    site, part = load_profile("h200-spectrumx").model, load_profile("h200-sxm").model
    floors = dtype_floors(site)
    assert sorted(floors) == ["bf16", "fp16", "fp32", "fp8", "tf32"]
    assert {d: f.value for d, f in floors.items()} == dict(part.numerics.min_flops)
    assert floors["fp8"].ref is not None and floors["fp8"].ref.key == "numerics.min_flops.fp8"
    assert str(floors["fp8"].ref) in floors["fp8"].why
    assert sorted(dtype_floors(load_profile("a100-sxm-80gb").model)) == ["bf16", "fp16", "fp32", "tf32"]
    assert sorted(dtype_floors(load_profile("cpu-local").model)) == ["bf16", "fp32"]


def test_the_gpu_part_sets_cublas_workspace_and_lets_the_device_pick_its_dtypes() -> None:
    class Settings:
        job_timeout = None
        rendezvous_timeout = 60.0

        def source(self, name: str) -> str:
            return "default"

    gpu = numerics_part(load_profile("h200-spectrumx").model, 2, Settings())
    assert gpu.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert gpu.options["dtypes"] is None and gpu.options["matmul_n"] == 8192
    cpu = numerics_part(load_profile("cpu-local").model, 1, Settings(), inject_rank=1)
    assert cpu.env == {} and cpu.options["inject"] == {"rank": 1, "dtype": None, "bit": 0}
    assert cpu.options["duration_s"] == 0.0 and cpu.name == "numerics-injected-corruption"
    assert "numerics.duration" in cpu.deadline
    assert "x 5 dtypes" in gpu.deadline and "x 2 dtypes" in cpu.deadline


def test_every_dense_peak_in_the_device_table_is_consistent_with_the_bf16_peak() -> None:
    """Dense tensor-core peaks per dtype: fp16 = bf16, tf32 = bf16 / 2, fp8 = 2 x bf16 (where the
    part has them), fp32 on the CUDA cores below tf32; bf16 is the table's peak_flops."""
    assert all(device.dense_flops for device in load_devices())
    for device in load_devices():
        peaks = dict(device.dense_flops)
        assert peaks["bf16"] == device.peak_flops, device.key
        assert peaks.get("fp16", peaks["bf16"]) == peaks["bf16"], device.key
        # datasheets round: the L40S prints TF32 183 against BF16 362.05, the B200 2.2 against 4.5 PF
        assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.025), device.key
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.015), device.key
        assert peaks["fp32"] < peaks["tf32"], device.key


@pytest.mark.parametrize(
    ("fragment", "said"),
    [
        ("numerics: {matmul_n: 100}", "key 'numerics.matmul_n'"),
        ("numerics: {known_answer_k: 256}", "key 'numerics.known_answer_k'"),
        ("numerics: {dtypes: [fp32, int4]}", "key 'numerics.dtypes[1]'"),
        ("numerics: {min_flops: {fp64: 1TFLOP/s}}", "key 'numerics.min_flops.fp64"),
        ("numerics: {min_repeats: 1}", "key 'numerics.min_repeats'"),
        ("numerics: {duraton: 5s}", "key 'numerics.duraton'"),
    ],
)
def test_a_bad_numerics_section_names_its_file_and_key(tmp_path: Path, fragment: str, said: str) -> None:
    from pytest_gpucluster.errors import ProfileError

    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\ndescription: d\nextends: cpu-local\n{fragment}\n")
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert "bad.yaml" in str(err.value) and said in str(err.value), str(err.value)


def test_a_minority_gpu_becomes_a_hardware_finding_to_reset_and_two_that_disagree_both_do() -> None:
    from pytest_gpucluster.results.findings import findings_of
    from pytest_gpucluster.results.model import Measurement

    base = _clean()[0]
    values = [_as_rank(base, r, f"GPU {r}") for r in range(3)]
    _corrupt_everywhere(values[2], "bf16", "1")
    checks, _ = v.agreement_checks(values)
    found = findings_of([Measurement.of(c, test_id="t", time=0.0) for c in checks])
    assert [(f.metric, f.gpu, f.reason, f.action) for f in found] == [
        ("numerics.agreement", "GPU 2", "hardware", "reset GPU")
    ]
    pair = [_as_rank(base, r, f"GPU {r}") for r in range(2)]
    _corrupt_everywhere(pair[1], "bf16", "1")
    checks, _ = v.agreement_checks(pair)
    found = findings_of([Measurement.of(c, test_id="t", time=0.0) for c in checks])
    assert sorted((f.gpu, f.reason) for f in found) == [("GPU 0", "hardware"), ("GPU 1", "hardware")]


def test_on_one_gpu_alone_the_self_test_needs_only_stability_to_name_the_flip() -> None:
    alone = [_injected()[1]]
    agreement, lonely = v.agreement_checks(alone)
    assert agreement == [] and len(lonely) == 1
    checks = v.stability_checks(alone) + v.known_answer_checks(alone)
    assert v.injected_problem(alone, checks) is None
    unseen = [c for c in checks if c.metric != v.STABILITY]
    assert "named nobody" in (v.injected_problem(alone, unseen) or "")


def test_a_median_above_the_parts_dense_peak_is_a_broken_measurement_never_a_pass() -> None:
    from pytest_gpucluster.plans.numerics import dtype_ceilings

    assert dtype_ceilings(load_profile("cpu-local").model) == {}
    ceilings = dtype_ceilings(load_profile("h200-spectrumx").model)
    assert ceilings["fp8"] == (1979e12, "devices.yaml h200-sxm dense_flops.fp8")
    values = _clean()
    tiny = {"bf16": (1e9, "a 1 GFLOP/s part"), "fp32": (1e15, "a fast part")}
    checks = v.throughput_checks(values, {"bf16": v.Floor(1.0, None, "1 FLOP/s")}, tiny)
    bf16 = [c for c in checks if c.labels["dtype"] == "bf16"]
    assert [c.problem for c in bf16] == ["broken measurement"] * 2
    assert all(
        c.failed and "above the dense bf16 peak 0.001 TFLOP/s (a 1 GFLOP/s part)" in c.hint for c in bf16
    )
    assert not any(c.problem for c in checks if c.labels["dtype"] == "fp32")


def test_profiles_check_refuses_a_numerics_floor_no_gpu_of_the_part_can_meet() -> None:
    from pytest_gpucluster.profiles.physics import check_profile

    a100 = load_profile("a100-sxm-80gb").model
    assert not [f for f in check_profile(a100).errors if f.key[0] == "numerics"]
    numerics = a100.numerics.model_copy(update={"min_flops": {"bf16": 400e12, "fp8": 100e12, "fp32": 5e12}})
    errors = {f.key: f.message for f in check_profile(a100.model_copy(update={"numerics": numerics})).errors}
    assert "above the dense bf16 peak, 312 TFLOP/s" in errors[("numerics", "min_flops", "bf16")]
    assert "no dense fp8 peak" in errors[("numerics", "min_flops", "fp8")]
    assert ("numerics", "min_flops", "fp32") not in errors


def _shaky(record: dict[str, Any], dtype: str) -> None:
    """Seed 1 gave two different digests over the runs."""
    counts = record["dtypes"][dtype]["digests"]["1"]
    record["dtypes"][dtype]["digests"]["1"] = {**counts, "e" * 32: 1}


def test_most_ranks_unstable_alike_is_the_kernel_a_broken_measurement_not_gpus_to_drain() -> None:
    base = _clean()[0]
    values = [_as_rank(base, r, f"GPU {r}") for r in range(4)]
    for record in values[:3]:
        _shaky(record, "fp32")
    checks = v.agreement_checks(values)[0] + v.stability_checks(values)
    bad = [c for c in checks if c.failed]
    assert bad and all(c.problem == "broken measurement" and c.labels["dtype"] == "fp32" for c in bad)
    assert "3 of 4 ranks on" in bad[0].hint and "a non-deterministic kernel" in bad[0].hint
    assert v.suspects(checks) == [] and v.named(checks) == []
    assert not any(c.failed for c in checks if c.labels["dtype"] == "bf16")
    # one unstable GPU of four is that GPU
    values = [_as_rank(base, r, f"GPU {r}") for r in range(4)]
    _shaky(values[1], "fp32")
    checks = v.agreement_checks(values)[0] + v.stability_checks(values)
    assert v.named(checks) == [(base["host"], 1, "GPU 1", "fp32")]
    assert all(c.problem is None for c in checks)


def test_gpus_under_one_torch_with_different_cublas_builds_are_two_platforms_not_corruption(
    monkeypatch,
) -> None:
    """Four H100s, one torch; two nodes load cuBLAS 12.8.4.1 and two 12.9.1.4, whose kernels may
    round differently: the platform key (workloads/numerics._platform) sets them apart, so their
    different bits are never a silent data corruption."""
    from types import SimpleNamespace

    from pytest_gpucluster.workloads import numerics as w
    from pytest_gpucluster.workloads._runtime import RankContext

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132)
    torch = SimpleNamespace(__version__="2.7.1+cu128", version=SimpleNamespace(cuda="12.8"),
                            cuda=SimpleNamespace(get_device_properties=lambda index: props),
                            _C=SimpleNamespace(_cuda_getDriverVersion=lambda: 12080))  # fmt: skip
    ctx = RankContext(rank=0, world_size=4, local_rank=0, local_world_size=1, node_rank=0, host="n",
                      device="cuda:0", backend="nccl", job_dir=Path("/tmp"))  # fmt: skip
    values = [_as_rank(_clean()[0], r, f"GPU 0 of node{r}") for r in range(4)]
    for rank, cublas in enumerate(["12.8.4.1", "12.8.4.1", "12.9.1.4", "12.9.1.4"]):
        monkeypatch.setattr(w, "cublas_version", lambda cublas=cublas: cublas)
        values[rank]["platform"] = w._platform(torch, ctx, SimpleNamespace(index=0))
    for rank in (2, 3):  # the newer cuBLAS rounds one seed's chain differently, alike on both
        _corrupt_everywhere(values[rank], "fp32", "1")
    checks, alone = v.agreement_checks(values)
    assert checks and not any(c.failed for c in checks) and not alone
