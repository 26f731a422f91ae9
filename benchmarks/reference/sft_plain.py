#!/usr/bin/env python
"""A plain DeepSpeed + transformers SFT loop: the independent reference of ``sft_overhead.py``.

It imports nothing from pytest_gpucluster: its own tiny Llama config (the shape of
FEASIBILITY.md section 7: hidden 128, 2 layers, 4 heads, vocabulary 1000) unless ``--model-config``
gives a ``LlamaConfig``'s keyword arguments as JSON (the caller's case's shape on a GPU: Llama-2-7B
cut to a few layers), with ``--attn-implementation`` and ``--gradient-checkpointing`` as the
harness's case says; its own byte-level
tokenization of Alpaca records read from a JSON file, its own DeepSpeed config, and a loop of
forward / ``engine.backward`` / ``engine.step`` with a clock around each optimizer step::

    torchrun --standalone --nproc-per-node=2 benchmarks/reference/sft_plain.py \\
        --data pytest_gpucluster/workloads/data/alpaca_tiny.json --steps 30 --out result.json

Same work as the harness's ``workloads/sft.py`` for the same options: a step is ``grad_accum``
micro-batches of ``micro_batch`` sequences padded to exactly ``seq_len`` tokens; batches are
built before the clock starts; ranks start the timed steps together (a barrier); each step is
bracketed by a device synchronize. Rank 0 writes the model's parameter count (so the caller can
check both sides trained the same model) and every rank's step times.

It ends as the harness's worker does — engine destroyed, a barrier, the process group destroyed,
DeepSpeed's ``/dev/shm`` segment of this rank removed, output flushed, ``os._exit`` — because
ZeRO on gloo aborts at interpreter exit in about one run in six otherwise (FEASIBILITY.md
section 7, pytorch/pytorch#190489), and the harness cannot end any other way.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

PROMPT_INPUT = (  # Stanford Alpaca's PROMPT_DICT
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)
PAD, BOS, EOS, BYTE_OFFSET = 0, 1, 2, 4
IGNORE = -100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="an Alpaca JSON file")
    parser.add_argument("--out", type=Path, required=True, help="where rank 0 writes the results")
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--backend", default=None, help="gloo or nccl (default: nccl with CUDA)")
    parser.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="a JSON file of LlamaConfig keyword arguments (default: tiny)",
    )
    parser.add_argument(
        "--attn-implementation", default="sdpa", choices=("eager", "sdpa", "flash_attention_2")
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    return parser.parse_args(argv)


def llama_config(args: argparse.Namespace) -> Any:
    """``--model-config``'s shape, else the tiny one; attention as ``--attn-implementation``."""
    from transformers import LlamaConfig

    if args.model_config is not None:
        kwargs = json.loads(args.model_config.read_text(encoding="utf-8"))
        return LlamaConfig(**{**kwargs, "use_cache": False, "attn_implementation": args.attn_implementation})
    return LlamaConfig(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation=args.attn_implementation,
    )


def encode(text: str) -> list[int]:
    return [BOS, *(b + BYTE_OFFSET for b in text.encode("utf-8"))]


def examples(path: Path, seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per record: prompt + response + EOS, cut to ``seq_len``, the prompt
    masked out of the labels; records whose prompt fills the window are dropped."""
    out = []
    for record in json.loads(path.read_text(encoding="utf-8")):
        template = PROMPT_INPUT if record.get("input") else PROMPT_NO_INPUT
        prompt = template.format(instruction=record["instruction"], input=record.get("input", ""))
        ids = [*encode(prompt + record["output"]), EOS][:seq_len]
        masked = min(len(encode(prompt)), len(ids))
        if masked < len(ids):
            out.append((ids, [IGNORE] * masked + ids[masked:]))
    if not out:
        raise SystemExit(f"{path}: no record keeps a response token within --seq-len {seq_len}")
    return out


def batches(args: argparse.Namespace, rank: int, world: int, count: int) -> list[dict[str, Any]]:
    """``count`` right-padded micro-batches of this rank, disjoint from the other ranks'."""
    import torch

    items = examples(args.data, args.seq_len)
    order = list(range(len(items)))
    random.Random(args.seed).shuffle(order)
    stride = world * args.micro_batch
    out = []
    for i in range(max(min(count, len(items) // stride), 1)):
        ids = torch.full((args.micro_batch, args.seq_len), PAD, dtype=torch.long)
        labels = torch.full((args.micro_batch, args.seq_len), IGNORE, dtype=torch.long)
        mask = torch.zeros((args.micro_batch, args.seq_len), dtype=torch.long)
        for row in range(args.micro_batch):
            seq, lab = items[order[(i * stride + rank * args.micro_batch + row) % len(order)]]
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(seq)] = 1
        out.append({"input_ids": ids, "labels": labels, "attention_mask": mask})
    return out


def deepspeed_config(args: argparse.Namespace, world: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": args.lr,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.0,
                "torch_adam": True,
            },
        },
        "zero_optimization": {"stage": args.zero_stage},
    }
    if args.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif args.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def train(args: argparse.Namespace, device: str, backend: str) -> tuple[int, list[float], list[float], Any]:
    """Build, initialize, train; the parameter count, the timed steps' wall and process CPU
    seconds, the engine."""
    import deepspeed
    import torch
    import torch.distributed as dist
    import transformers

    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(args, rank, world, (args.warmup + args.steps) * args.grad_accum)
    if device.startswith("cuda"):
        data = [{k: v.pin_memory() for k, v in b.items()} for b in data]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(llama_config(args)).to(dtype)
    params = sum(p.numel() for p in model.parameters())
    if args.gradient_checkpointing:  # as the harness: non-reentrant, every decoder block
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=deepspeed_config(args, world)
    )
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, cpu_times, micro = [], [], 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()  # every rank starts the timed steps together
        sync()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(args.grad_accum):
            batch = {k: v.to(device, non_blocking=True) for k, v in data[micro % len(data)].items()}
            micro += 1
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
    return params, times, cpu_times, engine


def remove_shm_segment() -> None:
    """DeepSpeed's CPU comm leaves ``/dev/shm/deepspeed_allreduce_buffer_*_<addr>_<port>_<local
    rank>`` (66 MiB) behind; remove this rank's."""
    addr, port, local = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"), os.environ["LOCAL_RANK"]
    for segment in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{addr}_{port}_{local}"):
        with contextlib.suppress(OSError):
            segment.unlink()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # DeepSpeed's CPU shared-memory op segfaults under torchrun without LOCAL_SIZE (FEASIBILITY §5).
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    import torch
    import torch.distributed as dist

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a core per rank, as a GPU per rank (torchrun sets 1 for N > 1)
    params, times, cpu_times, engine = train(args, device, backend)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (times, cpu_times))
    if dist.get_rank() == 0:
        record = {
            "params": params,
            "device": device,
            "step_times_by_rank": [wall for wall, _ in gathered],
            "step_cpu_times_by_rank": [cpu for _, cpu in gathered],
        }
        args.out.write_text(json.dumps(record))
    engine.destroy()
    dist.barrier()
    del engine
    gc.collect()
    dist.destroy_process_group()
    remove_shm_segment()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
