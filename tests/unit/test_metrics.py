"""maths/metrics.py against values computed by hand (the arithmetic is in each comment)."""

from __future__ import annotations

import math

import pytest

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.maths.metrics import (
    COLLECTIVES,
    Spread,
    TransformerShape,
    algbw,
    bus_factor,
    busbw,
    mfu,
    scaling_efficiency,
    summarize,
)
from pytest_gpucluster.maths.shapes import get_shape

# --- bus bandwidth ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collective", "nranks", "factor"),
    [
        ("all_reduce", 8, 1.75),  # 2*7/8
        ("all_reduce", 16, 1.875),  # 2*15/16
        ("all_reduce", 2, 1.0),  # 2*1/2
        ("all_reduce", 1, 0.0),  # nccl-tests prints busbw 0.00 on one GPU
        ("all_gather", 8, 0.875),  # 7/8
        ("reduce_scatter", 4, 0.75),  # 3/4
        ("alltoall", 16, 0.9375),  # 15/16
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 2, 1.0),
    ],
)
def test_bus_factor(collective: str, nranks: int, factor: float) -> None:
    assert bus_factor(collective, nranks) == pytest.approx(factor, abs=1e-15)


def test_every_listed_collective_has_a_factor() -> None:
    assert set(COLLECTIVES) == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "sendrecv",
    }
    for name in COLLECTIVES:
        assert 0.0 < bus_factor(name, 8) <= 2.0


def test_unknown_collective_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'allreduce'.*all_reduce, all_gather, .*sendrecv"):
        bus_factor("allreduce", 8)


def test_bad_rank_count_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bus_factor("all_reduce", 0)


def test_algbw_and_busbw_by_hand() -> None:
    # 1 GB in 10 ms is 100 GB/s; all_reduce over 8 ranks: 100 * 1.75 = 175 GB/s.
    assert algbw(1e9, 0.01) == pytest.approx(1e11)
    assert busbw("all_reduce", 1e9, 0.01, 8) == pytest.approx(1.75e11)


def test_busbw_of_an_all_reduce_row() -> None:
    # An 8-rank all_reduce row: 8589934592 bytes in 37915 us.
    # 8589934592 / 0.037915 = 226.56e9; * 1.75 = 396.48e9 (nccl-tests rounds time to 1 us).
    assert algbw(8589934592, 37915e-6) / 1e9 == pytest.approx(226.56, abs=0.01)
    assert busbw("all_reduce", 8589934592, 37915e-6, 8) / 1e9 == pytest.approx(396.48, abs=0.01)


def test_all_gather_size_is_the_total_buffer() -> None:
    # all_gather over 8 ranks, 1 MiB per rank: nccl-tests' size column is 8 MiB, and busbw
    # is (size/t) * 7/8 — i.e. each rank received 7 MiB in t.
    per_rank = 1 << 20
    size = per_rank * 8
    t = 1e-3
    assert busbw("all_gather", size, t, 8) == pytest.approx(7 * per_rank / t)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_algbw_refuses_a_bad_time(bad: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        algbw(1024, bad)


# --- model shapes and MFU --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # The totals Hugging Face reports for these checkpoints.
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
    ],
)
def test_parameter_counts_match_the_published_checkpoints(name: str, params: int) -> None:
    assert get_shape(name).dims.params == params
    assert get_shape(name).dims is metrics.KNOWN_SHAPES[name]  # the MFU arithmetic counts the same model


def test_llama2_7b_parameters_by_hand() -> None:
    s = get_shape("llama2-7b").dims
    # per layer: 4*4096^2 (q,k,v,o) + 3*4096*11008 (MLP) + 2*4096 (norms) = 202_383_360
    assert s.layer_params == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096 == 202_383_360
    # 32 layers + final norm + embedding table + separate lm_head
    assert s.params == 32 * 202_383_360 + 4096 + 2 * 32000 * 4096
    # the lookup table does no matmul; the lm_head does
    assert s.matmul_params == s.params - 32000 * 4096


def test_llama2_70b_flops_per_token_by_hand() -> None:
    s = get_shape("llama2-70b").dims
    # 6N with N = 68_976_648_192 - 32000*8192 = 68_714_504_192
    assert s.matmul_params == 68_714_504_192
    assert s.flops_per_token(attention=False) == 6 * 68_714_504_192
    # + 12 * L * H * Q * T = 12 * 80 * 64 * 128 * 4096 = 32_212_254_720
    assert s.flops_per_token() == 6 * 68_714_504_192 + 32_212_254_720 == 444_499_279_872
    # a shorter sequence only changes the attention term
    assert s.flops_per_token(2048) == 6 * 68_714_504_192 + 32_212_254_720 // 2


def test_tied_embeddings_count_the_shared_matrix_once() -> None:
    untied = TransformerShape(256, 2, 4, 4, 512, 1000, 128)
    tied = TransformerShape(256, 2, 4, 4, 512, 1000, 128, tied_embeddings=True)
    assert untied.params - tied.params == 1000 * 256
    assert untied.matmul_params == tied.matmul_params


def test_seed_001_mfu_with_the_seed_convention() -> None:
    # Seed 001 (FlagScale llama2-70b, 32x H800, amp TP4PP8DP1): 791.37 tokens/GPU/s, MFU 33.6%.
    # It reaches 33.6% with 6 * 70e9 FLOP/token (nominal 70B, no attention term):
    # 791.37 * 4.2e11 / 989e12 = 0.33607. The seed prints one decimal, so the tolerance is
    # half of its last digit (0.05 percentage points).
    assert mfu(791.37, 6 * 70e9, 989e12) == pytest.approx(0.336, abs=0.0005)


def test_seed_001_mfu_with_the_full_palm_formula() -> None:
    # Our flops_per_token adds PaLM's attention term and uses the real N (68.7B, not 70B):
    # 791.37 * 444_499_279_872 / 989e12 = 0.35568, two points above the seed's 33.6%:
    # +7.8% from 12LHQT at T=4096, -1.8% from N. Both are "PaLM MFU"; thresholds must say
    # which one they use, and ours always include the attention term.
    value = mfu(791.37, get_shape("llama2-70b").dims.flops_per_token(), 989e12)
    assert value == pytest.approx(0.3557, abs=0.0001)
    assert 0.336 < value < 0.37


def test_mfu_refuses_a_zero_peak() -> None:
    with pytest.raises(ValueError, match="peak"):
        mfu(100.0, 1e9, 0.0)


def test_a_shape_is_found_by_any_spelling_of_its_name_and_an_unknown_one_lists_the_known() -> None:
    assert get_shape("Llama2_70B").dims is metrics.KNOWN_SHAPES["llama2-70b"]
    with pytest.raises(ValueError, match=r"'gpt-5'.*llama2-70b"):
        get_shape("gpt-5")


def test_shape_validation() -> None:
    with pytest.raises(ValueError, match="divisible by heads"):
        TransformerShape(100, 1, 3, 3, 10, 10, 10)
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        TransformerShape(96, 1, 8, 3, 10, 10, 10)
    with pytest.raises(ValueError, match=r"TransformerShape\.layers"):
        TransformerShape(64, 0, 8, 8, 10, 10, 10)


# --- scaling efficiency ----------------------------------------------------------------------


def test_scaling_efficiency_by_hand() -> None:
    # 2 nodes: 30 samples/s; 4 nodes: 57.6 samples/s -> 57.6 / (2 * 30) = 0.96 (seed 002's target)
    assert scaling_efficiency(57.6, 4, 30.0, 2) == pytest.approx(0.96)
    # perfect scaling from one node to eight
    assert scaling_efficiency(800.0, 8, 100.0, 1) == pytest.approx(1.0)
    # super-linear is reported as such, not clipped
    assert scaling_efficiency(250.0, 2, 100.0, 1) == pytest.approx(1.25)


def test_scaling_efficiency_refuses_zero_base() -> None:
    with pytest.raises(ValueError, match="base throughput"):
        scaling_efficiency(1.0, 2, 0.0, 1)
    with pytest.raises(ValueError, match="node counts"):
        scaling_efficiency(1.0, 0, 1.0, 1)


# --- spreads ---------------------------------------------------------------------------------


def test_summarize_odd_count_with_an_outlier() -> None:
    # sorted 1 2 3 4 100: median 3; p90 at position 0.9*(5-1) = 3.6 -> 4 + 0.6*(100-4) = 61.6;
    # deviations 2 1 0 1 97 -> MAD 1.
    assert summarize([4, 100, 1, 3, 2]) == Spread(median=3.0, p90=61.6, min=1.0, max=100.0, mad=1.0, n=5)


def test_summarize_even_count() -> None:
    # 1 2 3 4: median 2.5; p90 at 2.7 -> 3.7; deviations 1.5 .5 .5 1.5 -> MAD 1.0
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert (s.median, s.mad, s.n) == (2.5, 1.0, 4)
    assert s.p90 == pytest.approx(3.7)


def test_summarize_single_value() -> None:
    assert summarize([7.5]) == Spread(7.5, 7.5, 7.5, 7.5, 0.0, 1)


def test_summarize_refuses_empty_and_nan() -> None:
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="NaN"):
        summarize([1.0, math.nan])


def test_attention_over_real_tokens_when_flash_attention_skips_the_padding():
    """The shipped Alpaca sample, tokenized as the SFT workload does, padded to 2048 for Llama 7B:
    with flash_attention_2 the attention term counts each sequence's real length, so MFU is lower
    than the padded formula's by the padded attention's share (7.5% of the count at 2048)."""
    import torch  # noqa: F401  (batches_for_rank builds tensors)

    from pytest_gpucluster.workloads import sft_data

    tokenizer = sft_data.load_tokenizer(None)
    items = sft_data.tokenize_dataset(sft_data.load_examples(sft_data.DEFAULT_DATASET), tokenizer, 2048)
    batches = sft_data.batches_for_rank(items, 4, 2048, tokenizer.pad_id, 0, 1, 0, count=8)
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(dim=1).tolist()]
    processed = len(lengths) * 2048
    padding = 1 - sum(lengths) / processed
    assert padding > 0.5  # Alpaca's short answers leave most of 2048 positions empty
    shape = get_shape("llama-7b").dims
    padded, how = metrics.step_model_flops(shape, processed, 2048, lengths, skips_padding=False)
    real, how_real = metrics.step_model_flops(shape, processed, 2048, lengths, skips_padding=True)
    assert (how, how_real) == ("padded", "real")
    assert padded == pytest.approx(processed * shape.flops_per_token(2048))  # the PaLM formula as before
    attention_share = 12 * 32 * 32 * 128 * 2048 / shape.flops_per_token(2048)
    assert attention_share == pytest.approx(0.075, abs=0.002)
    assert real < padded and padded / real - 1 == pytest.approx(
        (shape.attention_flops([2048] * len(lengths)) - shape.attention_flops(lengths)) / real
    )
    assert 0.05 < padded / real - 1 < 0.09  # MFU overstated by this much, relative, with the padded formula
    assert "flash_attention_2 skips padding" in metrics.MFU_FORMULAS["real"]
