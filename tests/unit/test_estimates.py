"""profiles/estimates.py: GPU memory per rank and run time per job, checked by hand arithmetic."""

import pytest

from pytest_gpucluster.maths.shapes import get_shape
from pytest_gpucluster.profiles.estimates import (
    DEFAULT_JOB_TIMEOUT_S,
    ESTIMATE_MFU,
    HOST_ADAM_PARAMS_PER_S,
    STARTUP_ALLOWANCE_S,
    estimate_case_runtime,
    estimate_memory,
    estimate_step_time,
)
from pytest_gpucluster.profiles.schema import ClusterSection, SftCase

LLAMA_7B = get_shape("llama2-7b").dims  # 6,738,415,616 parameters
N = LLAMA_7B.params


def memory(**overrides):
    settings = {
        "zero_stage": 2,
        "precision": "bf16",
        "offload": "none",
        "ranks": 1,
        "micro_batch": 1,
        "seq_len": 512,
        "gradient_checkpointing": True,
    }
    return estimate_memory(LLAMA_7B, **{**settings, **overrides})


@pytest.mark.parametrize(
    ("zero_stage", "ranks", "offload", "precision", "bytes_per_param"),
    [
        (2, 1, "none", "fp16", 16),  # one rank partitions nothing
        (0, 8, "none", "bf16", 16),
        (1, 8, "none", "bf16", 2 + 2 + 12 / 8),
        (2, 8, "none", "bf16", 2 + (2 + 12) / 8),
        (3, 8, "none", "bf16", 16 / 8),
        (2, 1, "optimizer", "fp16", 2),  # ZeRO-Offload: gradients and Adam states on the host
        (3, 8, "optimizer", "bf16", 2 / 8),
        (3, 8, "optimizer+params", "bf16", 0),
        (2, 1, "none", "fp32", 4 + 4 + 8),
    ],
)
def test_model_states_follow_zero_and_offload(zero_stage, ranks, offload, precision, bytes_per_param):
    estimate = memory(zero_stage=zero_stage, ranks=ranks, offload=offload, precision=precision)
    assert estimate.model_states == pytest.approx(bytes_per_param * N)
    full = 16 * N / (ranks if zero_stage == 3 else 1)
    if offload == "none" and zero_stage in (0, 3):
        assert estimate.host_bytes == 0
    if offload != "none":
        assert estimate.host_bytes > 0 and estimate.model_states < full


def test_activations_by_hand_with_and_without_checkpointing():
    # llama2-7b: h 4096, kv 4096, I 11008, 32 layers, vocab 32000; 2 x 512 tokens, 2 bytes
    per_layer = 6 * 4096 + 2 * 4096 + 4 * 11008
    tokens = 2 * 512
    logits = tokens * 32000 * (2 + 4 + 4)
    plain = memory(micro_batch=2, gradient_checkpointing=False)
    assert plain.activations == pytest.approx(32 * per_layer * 2 * tokens + logits)
    ckpt = memory(micro_batch=2, gradient_checkpointing=True)
    assert ckpt.activations == pytest.approx(32 * 4096 * 2 * tokens + per_layer * 2 * tokens + logits)
    eager = memory(micro_batch=2, gradient_checkpointing=False, attn_implementation="eager")
    assert eager.activations - plain.activations == pytest.approx(32 * 32 * 512 * 2 * tokens)


def test_allowance_is_context_buckets_and_fragmentation():
    e = memory(zero_stage=2, precision="bf16")
    assert e.allowance == pytest.approx(2**30 + 2 * 5e8 * 2 + 0.10 * (e.model_states + e.activations))
    z3 = memory(zero_stage=3, ranks=8)
    assert z3.allowance == pytest.approx(2**30 + (1e9 + 5e7) * 2 + 0.10 * (z3.model_states + z3.activations))
    assert "total" in e.arithmetic and e.total == e.model_states + e.activations + e.allowance


def test_ranks_must_be_positive():
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        memory(ranks=0)


def test_step_time_at_the_estimate_mfu():
    step, text = estimate_step_time(LLAMA_7B, micro_batch=8, grad_accum=16, seq_len=2048, peak_flops=989e12)
    tokens = 8 * 16 * 2048
    assert step == pytest.approx(tokens * LLAMA_7B.flops_per_token(2048) / (989e12 * ESTIMATE_MFU))
    assert "262,144 tokens per GPU" in text and "15% MFU" in text


def test_offload_adds_the_hosts_adam_per_node():
    plain, _ = estimate_step_time(LLAMA_7B, micro_batch=2, grad_accum=4, seq_len=512, peak_flops=312e12)
    off, text = estimate_step_time(
        LLAMA_7B, micro_batch=2, grad_accum=4, seq_len=512, peak_flops=312e12, offload="optimizer", nodes=2
    )
    assert off - plain == pytest.approx(N / 2 / HOST_ADAM_PARAMS_PER_S)
    assert "host Adam" in text and "/ 2 nodes" in text


def test_case_runtime_counts_warmup_and_startup():
    case = SftCase(
        name="c", model="llama2-7b", micro_batch=1, grad_accum=1, seq_len=512, steps=10, warmup_steps=2
    )
    cluster = ClusterSection(gpus_per_node=8, peak_flops="989TFLOP/s")
    estimate = estimate_case_runtime(case, cluster)
    step, _ = estimate_step_time(LLAMA_7B, micro_batch=1, grad_accum=1, seq_len=512, peak_flops=989e12)
    assert estimate.total_s == pytest.approx(STARTUP_ALLOWANCE_S + 12 * step)
    assert estimate.total_s < DEFAULT_JOB_TIMEOUT_S


def test_case_runtime_says_why_it_cannot_estimate():
    cluster = ClusterSection(gpus_per_node=8)
    assert "not a named shape" in estimate_case_runtime(SftCase(name="c", model="./ckpt"), cluster)
    assert "no device peak" in estimate_case_runtime(SftCase(name="c", model="llama2-7b"), cluster)
