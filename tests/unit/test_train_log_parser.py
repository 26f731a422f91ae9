"""Training-log parser on recorded real logs (tests/data/train_logs, see SOURCES.md there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.train_log import TrainStep, parse_train_log, to_json

DATA = Path(__file__).resolve().parents[1] / "data" / "train_logs"


def load(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def parse(name: str):
    return parse_train_log(load(name), source=name)


@pytest.mark.parametrize(
    ("name", "runtime", "samples_s", "steps_s", "train_loss", "s_per_it"),
    [
        ("seed000_a800_llama7b_1gpu.log", 5606.7798, 1.141, 0.143, 1.1899223804473877, 7.01),
        ("seed000_a800_llama7b_8gpu.log", 1323.6301, 4.835, 0.076, 1.1723517608642577, 13.24),
        ("seed000_h800_llama13b_1gpu.log", 7284.2064, 0.879, 0.11, 1.0952609968185425, 9.11),
        ("seed000_h800_llama13b_8gpu.log", 779.6666, 8.209, 0.128, 1.129374122619629, 7.80),
    ],
)
def test_seed_runs(name, runtime, samples_s, steps_s, train_loss, s_per_it):
    log = parse(name)
    assert log.summary.train_runtime_s == runtime
    assert log.summary.train_samples_per_second == samples_s
    assert log.summary.train_steps_per_second == steps_s
    assert log.summary.train_loss == train_loss
    assert log.s_per_it == pytest.approx(s_per_it)
    assert log.peak_memory_gib is None
    assert log.formats == ("hf_trainer", "tqdm")


def test_seed_loss_line_is_a_step():
    log = parse("seed000_a800_llama7b_1gpu.log")
    assert log.steps == (TrainStep(step=1, loss=1.4187, learning_rate=2e-05),)


def test_seed_to_json():
    data = to_json(parse("seed000_a800_llama7b_1gpu.log"))
    assert data == {
        "summary": {
            "train_runtime_s": 5606.7798,
            "train_samples_per_second": 1.141,
            "train_steps_per_second": 0.143,
            "train_loss": 1.1899223804473877,
        },
        "s_per_it": 7.01,
        "steps": [{"step": 1, "loss": 1.4187, "learning_rate": 2e-05}],
        "peak_memory_gib": None,
        "formats": ["hf_trainer", "tqdm"],
    }
    json.dumps(data, allow_nan=False)


def test_hf_with_deepspeed_bar_glued_to_step_line():
    log = parse("transformers_14531_hf_deepspeed_t5_11b.log")
    assert [s.loss for s in log.steps] == [6.2645, 0.0, 0.0, 0.0, 0.0]
    assert [s.step for s in log.steps] == [1, 2, 3, 4, 5]
    assert {s.learning_rate for s in log.steps} == {0.001}
    assert log.s_per_it == pytest.approx(3.33)
    # No HF summary in this log: samples/s falls back to DeepSpeed's timer line.
    assert log.summary.train_samples_per_second == 9.526738918021234
    assert log.summary.train_runtime_s is None
    assert log.peak_memory_gib is None
    assert set(log.formats) == {"hf_trainer", "tqdm", "deepspeed"}


def test_eval_dict_glued_to_bar_is_not_training_data():
    log = parse("transformers_28683_bar_glued_to_eval.log")
    assert log.s_per_it == pytest.approx(4.69)
    assert log.steps == ()
    assert log.summary.train_runtime_s is None
    assert log.summary.train_samples_per_second is None


def test_rank_labelled_lines_read_rank_0_only():
    log = parse("transformers_9415_rank_labelled.log")
    assert [s.loss for s in log.steps] == [
        10.5927734375,
        6.9972802049411325,
        6.86546826171875,
        6.84359375,
        6.812291015625,
    ]
    assert log.steps[-1].learning_rate == 0.0004978375617231397


def test_torchrun_rank_prefix():
    text = load("transformers_9415_rank_labelled.log")
    relabelled = "\n".join(
        f"[rank{line[0]}]:{line[2:]}" if line[:2] in ("0:", "1:") else line for line in text.splitlines()
    )
    assert [s.loss for s in parse_train_log(relabelled).steps] == [
        s.loss for s in parse("transformers_9415_rank_labelled.log").steps
    ]


def test_hf_deepspeed_overflow_bars_and_eval():
    log = parse("hf_deepspeed_zero2_overflow_glued.log")
    assert len(log.steps) == 56
    assert log.steps[0] == TrainStep(1, 10.6234, 4.6275642631951835e-06)
    assert log.steps[-1] == TrainStep(56, 4.0088, 1e-05)
    assert log.s_per_it == pytest.approx(13.91)  # last training bar: 400/2515 [1:33:28<8:10:14, 13.91s/it]
    assert log.summary.train_runtime_s is None


def test_carriage_return_redrawn_bars():
    # What tqdm writes to a file: each redraw of the bar starts with "\r" instead of a newline.
    lines = load("hf_deepspeed_zero2_overflow_glued.log").splitlines()
    text = "".join(("\r" if line.lstrip().startswith(("0%", "8%", "16%")) else "\n") + line for line in lines)
    assert text.count("\r") == 8
    log = parse_train_log(text)
    assert log.s_per_it == pytest.approx(13.91)
    assert len(log.steps) == 56


def test_it_per_s_and_summary_dict_glued_to_bar():
    log = parse("hf_lora_chatglm2_it_per_s.log")
    assert log.s_per_it == pytest.approx(1 / 4.70)  # the last bar, not the glued 3.44it/s one
    assert log.summary.train_runtime_s == 31174.0434
    assert log.summary.train_samples_per_second == 4.698
    assert log.summary.train_steps_per_second == 4.698
    assert log.summary.train_loss == 1.6946858559184583
    assert log.steps == ()


def test_hf_metrics_block_alone():
    text = load("hf_lora_chatglm2_it_per_s.log")
    without_dict = text[: text.index("{'train_runtime'")] + text[text.index("}\n") + 1 :]
    log = parse_train_log(without_dict)
    assert log.summary.train_runtime_s == pytest.approx(8 * 3600 + 39 * 60 + 34.04)
    assert log.summary.train_loss == 1.6947
    assert log.summary.train_samples_per_second == 4.698


def test_megatron_deepspeed_bf16():
    log = parse("deepspeed_3742_megatron_deepspeed_bf16.log")
    # Megatron's iteration line carries the loss, so it wins over DeepSpeed's step=35 line.
    assert log.steps == (TrainStep(34, 11.18665, 2.111e-06),)
    assert log.s_per_it == pytest.approx(4.1031)
    assert log.peak_memory_gib == 63.31
    assert log.summary.train_samples_per_second == 7.864669709950182
    assert log.formats == ("deepspeed", "megatron")


def test_deepspeed_only_step_and_timer():
    log = parse("deepspeed_1825_step_and_timer.log")
    assert log.steps == (TrainStep(40, None, 5e-05), TrainStep(50, None, 5e-05), TrainStep(60, None, 5e-05))
    assert log.peak_memory_gib == 9.02
    assert log.summary.train_samples_per_second == 83.73838805358588
    assert log.s_per_it is None


def test_see_memory_usage_ignores_cpu_memory():
    log = parse("deepspeed_4528_see_memory_usage.log")
    assert log.peak_memory_gib == 13.1  # CA after ZeRO init; not the 200.93 GB of host memory
    assert log.steps == ()
    assert log.formats == ("deepspeed",)


def test_megatron_lm_iterations():
    log = parse("megatron_lm_756_mixtral_h100.log")
    assert log.steps == (
        TrainStep(43, 1.825991, 8.6e-06),
        TrainStep(44, 1.875063, 8.8e-06),
        TrainStep(45, 1.834162, 9.0e-06),
    )
    assert log.s_per_it == pytest.approx(5.7186)


def test_megatron_llm_iterations():
    log = parse("megatron_llm_11_llama_iterations.log")
    assert [s.step for s in log.steps] == [122, 123, 124, 125]
    assert log.steps[0] == TrainStep(122, 2.504220, 9.150e-06)
    assert log.s_per_it == pytest.approx(89.0752)


def test_megatron_memory_report_in_mib():
    log = parse("megatron_deepspeed_alcf_llama_memory.log")
    assert log.steps == (TrainStep(1, 11.17136, 3.0e-04), TrainStep(2, 25.37718, 3.0e-04))
    assert log.peak_memory_gib == pytest.approx(46764.0 / 1024)  # max reserved, MiB -> GiB
    assert log.s_per_it == pytest.approx(20.2983)


def test_hf_dict_with_step_key_and_nan_loss():
    log = parse_train_log(
        "{'loss': 2.5, 'learning_rate': 1e-05, 'epoch': 0.1, 'step': 10}\n"
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.2, 'step': 20}\n"
    )
    assert [s.step for s in log.steps] == [10, 20]
    data = to_json(log)
    assert data["steps"][1] == {"step": 20, "loss": None, "learning_rate": 1e-05}
    json.dumps(data, allow_nan=False)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "Traceback (most recent call last):\nRuntimeError: CUDA out of memory.\n",
        "{'eval_loss': 0.5, 'epoch': 1.0}\n",
        "  0%|          | 0/100 [00:00<?, ?it/s]\n",
    ],
)
def test_nothing_recognised(text):
    with pytest.raises(ParseError, match=r"^job\.log: no training-log lines recognised"):
        parse_train_log(text, source="job.log")


def test_nvidia_smi_table_is_not_a_training_log():
    # Verbatim from seed 000 (H800, one GPU): percentages and MiB, but no training line.
    table = (
        "|   7  NVIDIA H800         On   | 00000000:E2:00.0 Off |                  Off |\n"
        "| N/A   44C    P0   153W / 700W |  60787MiB / 81559MiB |     23%      Default |\n"
        "|    7   N/A  N/A     82977      C   ...nv-py310-cu118/bin/python    60570MiB |\n"
    )
    with pytest.raises(ParseError):
        parse_train_log(table)
