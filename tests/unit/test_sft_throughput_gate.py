"""GPU utilisation is not a throughput gate (issue 17, item 7): an SFT case's throughput is always
recorded beside its utilisation, a case that gates only utilisation is warned about (profile
check) and says so in its results, and every shipped case gates a throughput figure."""

from __future__ import annotations

import pytest

from pytest_gpucluster.checks.sft import THROUGHPUT_KEYS, launched_checks
from pytest_gpucluster.profiles.loader import known_profiles, load_profile
from pytest_gpucluster.profiles.physics import check_profile


def rank_value(rank: int, util_pct: float) -> dict:
    """One rank of a network-bound 2-node job, as workloads/sft.py returns it: NVML reads ~99% busy
    (NCCL kernels spinning) while each step takes 30 s. Stands for an H200 rank; no recording of one exists."""
    step = 30.0
    return {
        "rank": rank, "host": f"node{rank // 8}", "model": "llama2-7b", "params": 6.7e9,
        "options": {"precision": "bf16"}, "step_times_s": [step] * 3, "step_time_median_s": step,
        "step_process_cpu_median_s": None, "cpu_threads": None, "samples_per_s": 16 / step,
        "tokens_per_s_per_device": 2 * 2048 / step, "mfu": 0.012, "peak_flops": 989e12,
        "peak_memory_bytes": 60e9, "peak_memory_kind": "cuda_max_reserved",
        "gpu_util_pct": {"mean": util_pct, "min": util_pct, "max": util_pct, "samples": 50, "interval_s": 0.5},
        "losses": [2.0, 1.8, 1.6],
    }  # fmt: skip


def util_only_profile():
    model = load_profile("h200-spectrumx").model
    case = model.sft.cases[0].model_copy(update={k: None for k in THROUGHPUT_KEYS} | {"min_gpu_util": 0.9})
    return model.model_copy(update={"sft": model.sft.model_copy(update={"cases": (case,)}), "scaling": None})


def test_a_case_gating_only_utilisation_still_records_throughput_and_says_it_is_no_gate():
    model = util_only_profile()
    checks = launched_checks(
        model.sft.cases[0], 0, model, [rank_value(0, 99.0), rank_value(1, 99.0)], "job J"
    )
    by = {c.metric: c for c in checks if c.labels.get("rank") in (None, 0)}
    assert not by["sft.gpu_util"].failed and by["sft.gpu_util"].value == pytest.approx(0.99)
    assert "Not a throughput gate: this case gates no throughput" in by["sft.gpu_util"].hint
    # throughput is measured and recorded beside it, every time
    assert (
        by["sft.tokens_per_s_per_gpu"].value == pytest.approx(4096 / 30)
        and by["sft.tokens_per_s_per_gpu"].verdict == "info"
    )
    assert by["sft.step_time"].value == 30.0 and by["sft.mfu"].value == pytest.approx(0.012)


def test_the_profile_check_warns_about_that_case():
    warnings = [f for f in check_profile(util_only_profile()).findings if f.level == "warning"]
    assert any(
        f.key == ("sft", "cases", 0, "min_gpu_util") and "gates only GPU utilisation" in f.message
        for f in warnings
    )


def test_a_throughput_floor_beside_utilisation_fails_the_network_bound_job():
    """The shipped h200-spectrumx case gates MFU (20%) beside utilisation (90%): the same
    network-bound ranks pass the utilisation gate and fail the MFU one."""
    model = load_profile("h200-spectrumx").model
    case = model.sft.cases[0]
    checks = launched_checks(case, 0, model, [rank_value(0, 99.0), rank_value(1, 99.0)], "job J")
    failed = {c.metric for c in checks if c.failed}
    assert "sft.mfu" in failed and "sft.gpu_util" not in failed
    assert "Not a throughput gate" not in next(c.hint for c in checks if c.metric == "sft.gpu_util")


@pytest.mark.parametrize("name", sorted(n for n in known_profiles() if not n.startswith("_")))
def test_every_shipped_sft_case_gates_a_throughput_figure(name):
    for case in load_profile(name).model.sft.cases:
        gated = [k for k in THROUGHPUT_KEYS if getattr(case, k) is not None]
        assert gated, f"profile {name}: sft case {case.name!r} gates no throughput"
