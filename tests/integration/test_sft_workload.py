"""Real SFT training on 2 gloo ranks: torchrun + the rank worker + DeepSpeed ZeRO-2/3 on the tiny model.

Each launch takes about 15-40 s on a 2-core machine, nearly all of it imports (torch, DeepSpeed,
transformers, inductor via DeepSpeed's optimizer check) and DeepSpeed's set-up; the steps
themselves are a few seconds.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed", reason="the SFT workload needs DeepSpeed (pip install deepspeed)")
pytest.importorskip("transformers", reason="the SFT workload needs transformers (pip install transformers)")

from pytest_gpucluster.workloads import sft
from pytest_gpucluster.workloads._rank_stats import GpuUtilSampler
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip

REPO = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 6, 2
PROGRESS_LINE = re.compile(rf"step \d+/{STEPS + WARMUP}  \d+\.\d\d s/it  loss \d+\.\d\d  ETA \d+s")


def run_sft(job_dir: Path, options: dict[str, Any], nproc: int = 2, timeout_s: float = 240) -> list[dict]:
    """Launch the worker like the plugin will, and return every rank's record."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job = {"workload": "pytest_gpucluster.workloads.sft:train", "options": options, "backend": "gloo"}
    (job_dir / "job.json").write_text(json.dumps({**job, "timeout_s": timeout_s}))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "pytest_gpucluster.workloads._worker", str(job_dir)]
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=job_dir, capture_output=True, text=True, timeout=timeout_s)
    records = []
    for rank in range(nproc):
        path = job_dir / f"rank-{rank}.json"
        log = job_dir / f"rank-{rank}.log"
        assert path.exists(), f"rank {rank} wrote no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        record = json.loads(path.read_text())
        assert record["status"] in ("ok", "skipped"), (
            f"rank {rank}: {record.get('error', {}).get('traceback') or record}\n{log.read_text()[-3000:]}"
        )
        records.append(record)
    print(f"{nproc} ranks, {options}: {time.monotonic() - started:.1f} s wall")
    return records


def save_local_checkpoint(directory: Path) -> Path:
    """A tiny Llama and a byte-level BPE tokenizer trained on the shipped data, saved like a hub model."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pytest_gpucluster.maths.shapes import get_shape
    from pytest_gpucluster.workloads import sft_data
    from pytest_gpucluster.workloads.sft_model import llama_config

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [sft_data.prompt_of(e) + e.output for e in sft_data.load_examples(sft_data.DEFAULT_DATASET)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(directory)
    transformers.LlamaForCausalLM(llama_config(get_shape("tiny"))).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("zero_stage", "source"), [(2, "local checkpoint"), (3, "named shape")])
def test_tiny_llama_trains_under_deepspeed_zero(tmp_path, zero_stage, source):
    options: dict[str, Any] = {"zero_stage": zero_stage, "steps": STEPS, "warmup_steps": WARMUP}
    if source == "named shape":
        options.update(model="tiny", peak_flops=1e11)
    else:
        options.update(model_path=str(save_local_checkpoint(tmp_path / "checkpoint")))
    peak_flops = options.get("peak_flops")
    records = run_sft(tmp_path / "job", options)
    values = [r["value"] for r in records]
    if source == "named shape":
        assert values[0]["model"] == "tiny" and values[0]["tokenizer"] == "byte-level (built in)"
    else:  # the model and its tokenizer both come from the directory; nothing is downloaded
        assert values[0]["model"] == options["model_path"]
        assert values[0]["tokenizer"].endswith(f" from {options['model_path']}")

    for v in values:
        assert v["deepspeed_config"]["zero_optimization"]["stage"] == zero_stage
        assert v["deepspeed_reused_process_group"] is True  # DeepSpeed joined the worker's group
        assert len(v["step_times_s"]) == STEPS and all(t > 0 for t in v["step_times_s"])
        assert 0 < v["step_time_median_s"] <= v["step_time_p90_s"]
        for key in (
            "samples_per_s",
            "tokens_per_s_per_device",
            "real_tokens_per_s_per_device",
            "flops_per_token",
        ):
            assert math.isfinite(v[key]) and v[key] > 0, key
        assert v["samples_per_s"] == pytest.approx(2 * v["samples_per_s_per_device"])
        assert v["tokens_per_s_per_device"] == pytest.approx(v["samples_per_s_per_device"] * 256)
        assert v["real_tokens_per_s_per_device"] < v["tokens_per_s_per_device"]
        assert len(v["losses"]) == STEPS + WARMUP and v["loss_finite"]
        assert v["loss_last"] < v["loss_first"], v["losses"]
        assert v["peak_memory_kind"] == "cpu_max_rss" and v["peak_memory_bytes"] > 50 * 2**20
        assert v["gpu_util_pct"] is None and "CPU" in v["gpu_util_reason"]
        real = v["real_tokens_per_s_per_device"] / v["tokens_per_s_per_device"]
        assert v["padding_fraction"] == pytest.approx(1 - real) and 0 < v["padding_fraction"] < 1
        assert v["mfu_formula"].startswith("PaLM: (6N + 12*L*H*Q*T)")  # sdpa computes the padding
        if peak_flops:
            expected = v["tokens_per_s_per_device"] * v["flops_per_token"] / peak_flops
            assert v["mfu"] == pytest.approx(expected)
        else:
            assert v["mfu"] is None and "peak_flops" in v["mfu_reason"]
    # The loss every rank reports is the job's mean, so the ranks agree.
    assert values[0]["losses"] == values[1]["losses"]

    progress = (tmp_path / "job" / "progress.log").read_text()
    assert PROGRESS_LINE.search(progress), progress
    assert f"step {STEPS + WARMUP}/{STEPS + WARMUP}" in progress
    assert f"ZeRO-{zero_stage}" in progress.splitlines()[-1]


def cpu_context(tmp_path: Path, options: dict[str, Any]) -> RankContext:
    return RankContext(0, 1, 0, 1, 0, "localhost", "cpu", "gloo", tmp_path, options)


def test_flash_attention_on_cpu_is_a_skip_that_says_why(tmp_path):
    # Refused before DeepSpeed joins any group, so no launch is needed to see it.
    with pytest.raises(WorkloadSkip, match=r"flash_attention_2.* needs CUDA"):
        sft.train(cpu_context(tmp_path, {"attn_implementation": "flash_attention_2"}))


def test_fp16_on_cpu_is_an_error_that_names_the_alternatives(tmp_path):
    with pytest.raises(ValueError, match="precision='fp16' needs a CUDA device; on CPU use fp32 or bf16"):
        sft.train(cpu_context(tmp_path, {"precision": "fp16"}))


def test_the_tiny_shape_counts_the_parameters_the_model_has():
    import transformers

    from pytest_gpucluster.maths.shapes import get_shape
    from pytest_gpucluster.workloads.sft_model import llama_config

    shape = get_shape("tiny")
    model = transformers.LlamaForCausalLM(llama_config(shape))
    assert sum(p.numel() for p in model.parameters()) == shape.dims.params


def test_gpu_utilisation_is_sampled_through_nvml(monkeypatch):
    """The NVML sampler against a stand-in pynvml (no GPU here): it finds the GPU by UUID."""
    import types

    import torch

    opened: list[str] = []
    reads: list[int] = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: opened.append(uuid) or "handle",
        nvmlDeviceGetUtilizationRates=lambda handle: reads.append(1) or types.SimpleNamespace(gpu=90),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="abc-1"))
    sampler = GpuUtilSampler(0, interval_s=0.01)
    sampler.start()
    end = time.monotonic() + 30  # wait for 3 samples, not a fixed 0.1 s a loaded machine may not give
    while len(reads) < 3 and time.monotonic() < end:
        time.sleep(0.01)
    util, mem_used = sampler.stop()
    assert opened == ["GPU-abc-1"]
    assert util["mean"] == util["min"] == util["max"] == 90 and util["samples"] >= 3
    assert mem_used == 3 * 2**30
