"""What the harness costs a training step: its SFT workload against a plain DeepSpeed loop.

    python benchmarks/sft_overhead.py [--model tiny] [--zero-stage 2] [--nproc 2] [--steps 30]

One torchrun launch; in the same processes, and alternating (A B, then B A, ... so that drift of a
shared machine falls on both), every rank runs

- A: ``pytest_gpucluster.workloads.sft.train`` — what ``cluster.run`` runs on a rank, and
- B: a plain DeepSpeed training loop written here, independently: same model shape, data,
  DeepSpeed settings, micro-batch, accumulation and sequence length; a timer, nothing else.

It prints the median step time of each (pooled over rounds) and, last, ``ratio`` = A / B.
The target is at most 1.05. On a 2-core machine shared with other work, single runs move by a
few percent either way; use ``--rounds`` and ``--steps`` to tighten it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a named shape (default tiny)")
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (order alternates)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one per GPU on a GPU machine)")
    parser.add_argument("--backend", default=None, help="gloo or nccl (default: nccl when CUDA is there)")
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------
# B: the plain loop
# --------------------------------------------------------------------------------------------


def plain_deepspeed_loop(
    args: argparse.Namespace, device: str, rank: int, world: int
) -> tuple[list[float], float]:
    """Build, initialize, train; time each step (wall, and the process's CPU time). Nothing else."""
    import deepspeed
    import torch
    import transformers

    from pytest_gpucluster.maths.shapes import get_shape
    from pytest_gpucluster.workloads import sft_data
    from pytest_gpucluster.workloads.sft_model import llama_config

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    torch.manual_seed(1234)
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(
            llama_config(get_shape(args.model)), dtype=dtype, attn_implementation="sdpa"
        )
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
    if args.precision != "fp32":
        config[args.precision] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    tokenizer = sft_data.ByteTokenizer()
    items = sft_data.tokenize_dataset(
        sft_data.load_examples(sft_data.DEFAULT_DATASET), tokenizer, args.seq_len
    )
    batches = sft_data.batches_for_rank(
        items, args.micro_batch, args.seq_len, tokenizer.pad_id, rank, world, 1234, count=10**6
    )

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, cpu_times, i = [], [], 0
    for step in range(args.warmup + args.steps):
        sync()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(args.grad_accum):
            batch = {k: v.to(device) for k, v in batches[i % len(batches)].items()}
            i += 1
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
    engine.destroy()
    return times, statistics.median(cpu_times)


# --------------------------------------------------------------------------------------------
# A: the harness's workload, and the rank-side driver
# --------------------------------------------------------------------------------------------


def harness_workload(args: argparse.Namespace, ctx: Any) -> tuple[list[float], float]:
    from pytest_gpucluster.workloads import sft

    options = {
        "model": args.model,
        "zero_stage": args.zero_stage,
        "precision": args.precision,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "lr": args.lr,
    }
    ctx = type(ctx)(**{**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__}, "options": options})
    result = sft.train(ctx)
    return result["step_times_s"], result["step_process_cpu_median_s"]


def rank_side(args: argparse.Namespace) -> None:
    import gc

    import torch
    import torch.distributed as dist

    from pytest_gpucluster.workloads._runtime import RankContext, RankIdentity

    identity = RankIdentity.from_environ()
    identity.export()
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(identity.local_rank)
        device = f"cuda:{identity.local_rank}"
    dist.init_process_group(backend)
    job_dir = Path(tempfile.mkdtemp(prefix=f"sft-overhead-{identity.rank}-"))
    ctx = RankContext(
        rank=identity.rank,
        world_size=identity.world_size,
        local_rank=identity.local_rank,
        local_world_size=identity.local_world_size,
        node_rank=identity.node_rank,
        host=identity.host,
        device=device,
        backend=backend,
        job_dir=job_dir,
    )
    pooled: dict[str, list[float]] = {"harness": [], "plain": [], "harness_cpu": [], "plain_cpu": []}
    for round_ in range(args.rounds):
        order = ("harness", "plain") if round_ % 2 == 0 else ("plain", "harness")
        for side in order:
            if side == "harness":
                times, cpu = harness_workload(args, ctx)
            else:
                times, cpu = plain_deepspeed_loop(args, device, identity.rank, identity.world_size)
            pooled[side] += times
            pooled[f"{side}_cpu"].append(cpu)
            gc.collect()
            dist.barrier()
            if identity.rank == 0:
                median = statistics.median(times)
                print(
                    f"round {round_ + 1} {side:8s} median {median:.4f} s/step, CPU {cpu:.4f} s/step",
                    flush=True,
                )
    if identity.rank == 0 and args.out:
        args.out.write_text(json.dumps({**pooled, "device": device, "world_size": identity.world_size}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter finalization (see workloads/_worker.py: a gloo teardown race)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_side:
        rank_side(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="sft-overhead-") as tmp:
        out = Path(tmp) / "result.json"
        forwarded = [a for a in (sys.argv[1:] if argv is None else argv)]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
        ]
        cmd += [str(Path(__file__).resolve()), "--rank-side", "--out", str(out), *forwarded]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        )
        env.setdefault("LOCAL_SIZE", str(args.nproc))
        env.setdefault("OMP_NUM_THREADS", "1")  # both sides alike; torchrun sets it only for nproc > 1
        started = time.monotonic()
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not out.exists():
            print(f"the benchmark's ranks failed (exit code {proc.returncode}); see their output above")
            return 1
        result = json.loads(out.read_text())
    harness, plain = statistics.median(result["harness"]), statistics.median(result["plain"])
    print(
        f"\nSFT step time, {args.model} ZeRO-{args.zero_stage} {args.precision}, micro-batch {args.micro_batch} "
        f"x accum {args.grad_accum} x seq {args.seq_len}, {result['world_size']} ranks on {result['device']}, "
        f"{args.rounds} rounds x {args.steps} steps each ({time.monotonic() - started:.0f} s):"
    )
    print(f"  harness SFT workload   median {harness:.4f} s/step  ({len(result['harness'])} steps)")
    print(f"  plain DeepSpeed loop   median {plain:.4f} s/step  ({len(result['plain'])} steps)")
    harness_cpu, plain_cpu = statistics.median(result["harness_cpu"]), statistics.median(result["plain_cpu"])
    # Not the gated figure: CPU time is steadier than wall time on a shared machine.
    print(f"  cross-check: process CPU time per step, harness/plain = {harness_cpu / plain_cpu:.3f}")
    print(f"overhead ratio harness/plain (target <= 1.05): {harness / plain:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
