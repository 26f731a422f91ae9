"""The SFT workload's pure parts: Alpaca prompts and masking, batches, the shipped data, shapes, options."""

from __future__ import annotations

import json

import pytest

from pytest_gpucluster.maths.shapes import SHAPES, get_shape
from pytest_gpucluster.workloads import sft_data
from pytest_gpucluster.workloads.sft import SFTOptions, deepspeed_config
from pytest_gpucluster.workloads.sft_data import (
    IGNORE_INDEX,
    ByteTokenizer,
    Example,
    Tokenized,
    batches_for_rank,
    collate,
    generate_dataset,
    load_examples,
    prompt_of,
    tokenize_dataset,
    tokenize_example,
)
from pytest_gpucluster.workloads.sft_model import llama_config

# --------------------------------------------------------------------------------------------
# Alpaca prompts and label masking
# --------------------------------------------------------------------------------------------


def test_prompts_are_stanford_alpacas():
    with_input = prompt_of(Example("Add the numbers.", "1 and 2", "3"))
    assert with_input == (
        "Below is an instruction that describes a task, paired with an input that provides further "
        "context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nAdd the numbers.\n\n### Input:\n1 and 2\n\n### Response:"
    )
    without = prompt_of(Example("Say hi.", "", "hi"))
    assert without == (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:"
    )


def test_byte_tokenizer_round_trips_and_stays_in_its_vocabulary():
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓")
    assert ids[0] == tok.bos_id
    assert all(tok.offset <= i < tok.vocab_size for i in ids[1:])
    assert tok.decode(ids) == "héllo ✓"
    assert tok.vocab_size == 260


def test_the_prompt_is_masked_and_the_response_and_eos_are_learned():
    tok = ByteTokenizer()
    example = Example("Reverse the word.", "abc", "cba")
    item = tokenize_example(example, tok, seq_len=1024)
    prompt_len = len(tok.encode(prompt_of(example)))
    assert item is not None
    assert item.labels[:prompt_len] == (IGNORE_INDEX,) * prompt_len
    assert item.labels[prompt_len:] == item.input_ids[prompt_len:]
    assert tok.decode(item.input_ids[prompt_len:]) == "cba"
    assert item.input_ids[-1] == tok.eos_id


def test_truncation_keeps_seq_len_and_drops_examples_with_no_response_left():
    tok = ByteTokenizer()
    example = Example("Reverse the word.", "abc", "cba" * 50)
    prompt_len = len(tok.encode(prompt_of(example)))
    item = tokenize_example(example, tok, seq_len=prompt_len + 5)
    assert item is not None and len(item.input_ids) == prompt_len + 5
    assert sum(label != IGNORE_INDEX for label in item.labels) == 5
    assert tokenize_example(example, tok, seq_len=prompt_len) is None


def test_a_seq_len_shorter_than_every_prompt_says_what_to_raise_it_to():
    with pytest.raises(ValueError, match=r"seq_len=32 leaves no response token .* raise seq_len above \d+"):
        tokenize_dataset([Example("Say hi.", "", "hi")], ByteTokenizer(), 32)


def test_collate_pads_to_exactly_seq_len():
    items = [Tokenized((1, 5, 6), (-100, 5, 6)), Tokenized((1, 7), (-100, 7))]
    batch = collate(items, pad_id=0, seq_len=6)
    assert batch["input_ids"].tolist() == [[1, 5, 6, 0, 0, 0], [1, 7, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 5, 6, -100, -100, -100], [-100, 7, -100, -100, -100, -100]]
    assert batch["attention_mask"].sum(dim=1).tolist() == [3, 2]


def test_ranks_draw_disjoint_examples_and_runs_repeat():
    items = [Tokenized((1, i + 10), (-100, i + 10)) for i in range(16)]

    def first_tokens(rank: int, count: int) -> list[int]:
        batches = batches_for_rank(items, 2, 4, 0, rank, 2, seed=7, count=count)
        return [int(t) for batch in batches for t in batch["input_ids"][:, 1]]

    rank0, rank1 = first_tokens(0, 100), first_tokens(1, 100)
    assert len(rank0) == 8  # capped at one pass: 16 examples / (2 ranks x 2 per micro-batch) x 2
    assert not set(rank0) & set(rank1)
    assert sorted(rank0 + rank1) == [i + 10 for i in range(16)]
    assert first_tokens(0, 2) == rank0[:4]
    assert first_tokens(0, 100) == rank0


# --------------------------------------------------------------------------------------------
# Data files
# --------------------------------------------------------------------------------------------


def test_the_shipped_dataset_is_what_the_generator_writes():
    shipped = json.loads(sft_data.DEFAULT_DATASET.read_text(encoding="utf-8"))
    assert shipped == generate_dataset(256, seed=0)
    assert sft_data.DEFAULT_DATASET.stat().st_size < 100_000
    examples = load_examples(sft_data.DEFAULT_DATASET)
    assert any(e.input for e in examples) and any(not e.input for e in examples)
    # The CPU default seq_len keeps most examples.
    assert len(tokenize_dataset(examples, ByteTokenizer(), 256)) > 0.7 * len(examples)


def test_generation_is_seeded():
    assert generate_dataset(20, seed=1) == generate_dataset(20, seed=1)
    assert generate_dataset(20, seed=1) != generate_dataset(20, seed=2)


def test_generator_cli_writes_a_file(tmp_path):
    out = tmp_path / "d.json"
    sft_data.main(["--n", "5", "--seed", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == generate_dataset(5, seed=3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "non-empty JSON list"),
        ("[]", "non-empty JSON list"),
        ('[{"instruction": "x"}]', r"record \[0\] has no string 'output'"),
        ('[{"instruction": "x", "output": "y"}, 3]', r"record \[1\] is a int"),
        ('[{"instruction": "x", "output": "y", "input": 5}]', r"record \[0\] has an 'input'"),
        ("[{", "not valid JSON"),
    ],
)
def test_bad_data_files_name_the_file_and_the_record(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_examples(path)
    assert str(path) in str(info.value)


def test_a_missing_data_file_or_tokenizer_directory_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_examples(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="not a local directory"):
        sft_data.load_tokenizer(tmp_path / "nope")


# --------------------------------------------------------------------------------------------
# Model shapes
# --------------------------------------------------------------------------------------------


def test_llama_configs_carry_the_shape():
    config = llama_config(get_shape("llama3-8b"))
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (4096, 32, 8)
    assert config.vocab_size == 128256 and config.max_position_embeddings == 8192
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    assert rope["rope_theta"] == 500000.0
    tiny = llama_config(get_shape("tiny"))
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads, tiny.vocab_size) == (
        128,
        2,
        4,
        1000,
    )


def test_cpu_shapes_hold_the_byte_tokenizer_and_layers_can_be_cut():
    for shape in SHAPES.values():
        assert shape.dims.vocab >= ByteTokenizer.vocab_size
    cut = get_shape("llama2-70b").with_layers(2)
    assert cut.dims.layers == 2 and cut.dims.hidden == 8192
    with pytest.raises(ValueError, match=r"known shapes: .*tiny"):
        get_shape("llama9-1t")


# --------------------------------------------------------------------------------------------
# Options and the DeepSpeed config
# --------------------------------------------------------------------------------------------


def test_options_default_and_parse_offload():
    assert SFTOptions.from_options({}).zero_stage == 2
    assert SFTOptions.from_options({"zero_stage": 3, "offload": "both"}).offload == ("optimizer", "param")
    assert SFTOptions.from_options({"zero_stage": 3, "offload": "param+optimizer"}).offload == (
        "optimizer",
        "param",
    )
    assert SFTOptions.from_options({"offload": "none"}).offload == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"zero_stge": 2}, r"unknown SFT option\(s\) \['zero_stge'\]"),
        ({"zero_stage": 4}, "zero_stage=4: must be 0, 1, 2 or 3"),
        ({"offload": "param"}, "parameter offload needs zero_stage 3"),
        ({"zero_stage": 0, "offload": "optimizer"}, "optimizer offload needs zero_stage 1, 2 or 3"),
        ({"offload": "gpu"}, "offload=.*must be"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"attn_implementation": "flex"}, "attn_implementation='flex'"),
        ({"steps": 0}, "steps=0: must be a positive integer"),
        ({"lr": 0}, "lr=0: must be positive"),
        ({"peak_flops": -1.0}, "peak_flops=-1.0"),
    ],
)
def test_bad_options_say_which_and_why(options, message):
    with pytest.raises(ValueError, match=message):
        SFTOptions.from_options(options)


def test_deepspeed_config_follows_the_options():
    opts = SFTOptions.from_options(
        {"zero_stage": 3, "offload": "both", "micro_batch": 4, "grad_accum": 8, "lr": 2e-5}
    )
    config = deepspeed_config(opts, world_size=16, precision="bf16", cuda=True)
    assert config["train_batch_size"] == 4 * 8 * 16
    assert config["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    }
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert "torch_adam" not in config["optimizer"]["params"]  # offload uses DeepSpeed's CPU Adam
    plain = deepspeed_config(SFTOptions.from_options({}), world_size=2, precision="fp32", cuda=False)
    assert plain["optimizer"]["params"]["torch_adam"] is True
    assert "bf16" not in plain and "fp16" not in plain
