"""Supervised fine-tuning of a Llama-family model under DeepSpeed, measured: ``train(ctx) -> dict``.

What one rank does: build the model (a named shape with random weights, or a local checkpoint),
wrap it with ``deepspeed.initialize`` in the process group the worker already joined, train on
Alpaca-format data for ``warmup_steps + steps`` optimizer steps, and report, from the timed
steps only: step time (median, p90), samples/s, tokens/s per device, MFU (PaLM), peak memory,
the loss at the start and end of training, and GPU utilisation sampled through NVML.

A "step" is one optimizer step, ``grad_accum`` micro-batches of ``micro_batch`` sequences of
exactly ``seq_len`` tokens (what HF Trainer's progress bar calls an ``it``). Tokens per second
count *processed* tokens, padding included (``micro_batch * grad_accum * seq_len`` per step):
that is the figure thresholds gate, as in Megatron and FlagScale logs; the non-padding count is
reported beside it as ``real_tokens_per_s_per_device``, and ``padding_fraction`` says how much of
each batch was padding. MFU counts the dense ``6N`` over processed tokens and the attention term
over the padded length, or over each sequence's real length where the attention implementation
skips padding (``flash_attention_2``); ``mfu_formula`` names which (``maths.metrics.step_model_flops``).

Rank-side module: the standard library, ``metrics``, torch, DeepSpeed and ``transformers``
(the last three imported inside ``train``), never pytest or the launch side.
"""

from __future__ import annotations

import gc
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.workloads import sft_data
from pytest_gpucluster.workloads._rank_stats import peak_memory, start_sampler
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip
from pytest_gpucluster.workloads.sft_model import build_model

__all__ = ["SFTOptions", "train"]

_PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_ATTENTION = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True, slots=True)
class SFTOptions:
    """The SFT case as the profile gives it (``job.json`` ``options``); every field is optional."""

    model: str = "tiny"
    """A named shape (``llama2-7b``, ``llama3-8b``, ``tiny``...; see ``maths.shapes.SHAPES``)."""
    model_path: str | None = None
    """A local checkpoint directory, loaded with ``local_files_only``; wins over ``model``."""
    layers: int | None = None
    """Cut a named shape to this many layers (a real width on fewer GPUs)."""
    tokenizer_path: str | None = None
    """A local tokenizer; default: ``model_path`` when it holds one, else the byte-level one."""
    data_path: str | None = None
    """An Alpaca JSON file; default: the small generated one shipped with the package."""
    zero_stage: int = 2
    offload: tuple[str, ...] = ()
    """What ZeRO moves to CPU memory: ``optimizer``, ``param`` (stage 3 only), both or none."""
    precision: str = "auto"
    """``bf16``, ``fp16`` (CUDA only), ``fp32``; ``auto`` is bf16 on CUDA and fp32 on CPU."""
    micro_batch: int = 2
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    seq_len: int = 256
    steps: int = 8
    """Timed optimizer steps."""
    warmup_steps: int = 2
    """Untimed optimizer steps before them (allocator, kernel selection, first all-gathers)."""
    lr: float = 1e-3
    attn_implementation: str = "sdpa"
    zero_init: bool | None = None
    """Build the model inside ``deepspeed.zero.Init`` (ZeRO-3 only); default: on CUDA, not on CPU."""
    optimizer: str = "auto"
    """``torch`` (torch.optim.AdamW), ``deepspeed`` (FusedAdam, or CPUAdam when offloading);
    ``auto`` is deepspeed when offloading, else torch (FusedAdam needs a JIT build with nvcc)."""
    peak_flops: float | None = None
    """The device's dense peak FLOP/s for this precision, from the profile; MFU needs it."""
    seed: int = 1234
    cpu_threads: int | None = None
    """Threads per rank on CPU; default OMP_NUM_THREADS, else 1 (a core per rank, as a GPU per rank,
    so 1-rank and N-rank runs compare; torchrun sets 1 only for more than one rank per node)."""
    gpu_util_interval_s: float = 0.1
    progress_interval_s: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form labels from the profile (case name...), echoed in the result."""

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SFTOptions:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown SFT option(s) {unknown}; the known ones are {sorted(known)}")
        values = dict(options)
        offload = values.get("offload") or ()
        if isinstance(offload, str):
            offload = {"none": (), "both": ("optimizer", "param")}.get(
                offload, offload.replace("+", ",").split(",")
            )
        values["offload"] = tuple(sorted({str(o).strip() for o in offload}))
        opts = cls(**values)
        opts._validate()
        return opts

    def _validate(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"SFT option {name}={getattr(self, name)!r}: {rule}")

        if self.zero_stage not in (0, 1, 2, 3):
            raise bad("zero_stage", "must be 0, 1, 2 or 3")
        if not set(self.offload) <= {"optimizer", "param"}:
            raise bad("offload", "must be 'none', 'optimizer', 'param' or 'optimizer,param'")
        if "param" in self.offload and self.zero_stage != 3:
            raise bad("offload", "parameter offload needs zero_stage 3")
        if "optimizer" in self.offload and self.zero_stage == 0:
            raise bad("offload", "optimizer offload needs zero_stage 1, 2 or 3")
        if self.precision not in _PRECISIONS:
            raise bad("precision", f"must be one of {', '.join(_PRECISIONS)}")
        if self.attn_implementation not in _ATTENTION:
            raise bad("attn_implementation", f"must be one of {', '.join(_ATTENTION)}")
        if self.optimizer not in ("auto", "torch", "deepspeed"):
            raise bad("optimizer", "must be auto, torch or deepspeed")
        for name in ("micro_batch", "grad_accum", "seq_len", "steps", "cpu_threads"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise bad(name, "must be a positive integer")
        if self.warmup_steps < 0:
            raise bad("warmup_steps", "must not be negative")
        if not self.lr > 0:
            raise bad("lr", "must be positive")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise bad("peak_flops", "must be a positive FLOP/s figure (e.g. 989e12 for H100 BF16)")


def _resolve_precision(opts: SFTOptions, cuda: bool) -> str:
    precision = opts.precision if opts.precision != "auto" else ("bf16" if cuda else "fp32")
    if precision == "fp16" and not cuda:
        raise ValueError("SFT option precision='fp16' needs a CUDA device; on CPU use fp32 or bf16")
    return precision


def _check_attention(opts: SFTOptions, cuda: bool, precision: str) -> None:
    if opts.attn_implementation != "flash_attention_2":
        return
    from transformers.utils import is_flash_attn_2_available

    if not cuda:
        raise WorkloadSkip("attn_implementation='flash_attention_2' needs CUDA; this rank runs on CPU")
    if not is_flash_attn_2_available():
        raise WorkloadSkip(
            "attn_implementation='flash_attention_2' but the flash-attn package is not installed "
            "(pip install flash-attn --no-build-isolation), or not usable with this torch"
        )
    if precision == "fp32":
        raise ValueError("flash_attention_2 needs bf16 or fp16 precision, not fp32")


def _zero_init(opts: SFTOptions, cuda: bool) -> bool:
    return opts.zero_init if opts.zero_init is not None else cuda


def deepspeed_config(opts: SFTOptions, world_size: int, precision: str, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed config dict for these options (also written into the result)."""
    zero: dict[str, Any] = {"stage": opts.zero_stage}
    if "optimizer" in opts.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if "param" in opts.offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    impl = opts.optimizer if opts.optimizer != "auto" else ("deepspeed" if opts.offload else "torch")
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": opts.micro_batch,
        "gradient_accumulation_steps": opts.grad_accum,
        "train_batch_size": opts.micro_batch * opts.grad_accum * world_size,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,  # DeepSpeed's own step logging stays out of the timed steps
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": opts.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        },
        "zero_optimization": zero,
    }
    if impl == "torch":
        config["optimizer"]["params"]["torch_adam"] = True
        if opts.offload:
            config["zero_force_ds_cpu_optimizer"] = False
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


@dataclass
class _Prepared:
    """Everything a rank builds before its first step: data, model and DeepSpeed config."""

    precision: str
    reused_group: bool
    tokenizer: str
    data_path: Path
    examples: int
    batches: list[Any]
    real_tokens_of: list[int]
    lengths_of: list[list[int]]
    """Per batch, each sequence's real (non-padding) length."""
    ds_config: dict[str, Any]
    model: Any
    dims: metrics.TransformerShape
    model_name: str


def _prepare(ctx: RankContext, opts: SFTOptions) -> _Prepared:
    """Join DeepSpeed to the worker's group, tokenize the dataset, cut this rank's batches (before
    the clock starts: the steps only copy them over) and build the model."""
    import deepspeed
    import torch
    import torch.distributed as dist

    precision = _resolve_precision(opts, ctx.is_cuda)
    _check_attention(opts, ctx.is_cuda, precision)
    if not ctx.is_cuda and (opts.cpu_threads or "OMP_NUM_THREADS" not in os.environ):
        torch.set_num_threads(opts.cpu_threads or 1)
    world_group = dist.group.WORLD if dist.is_initialized() else None
    deepspeed.init_distributed(dist_backend=ctx.backend)
    tokenizer_path = opts.tokenizer_path
    if not tokenizer_path and opts.model_path and (Path(opts.model_path) / "tokenizer_config.json").is_file():
        tokenizer_path = opts.model_path
    tokenizer = sft_data.load_tokenizer(tokenizer_path)
    data_path = Path(opts.data_path) if opts.data_path else sft_data.DEFAULT_DATASET
    items = sft_data.tokenize_dataset(sft_data.load_examples(data_path), tokenizer, opts.seq_len)
    count = (opts.warmup_steps + opts.steps) * opts.grad_accum
    batches = sft_data.batches_for_rank(
        items,
        opts.micro_batch,
        opts.seq_len,
        tokenizer.pad_id,
        ctx.rank,
        ctx.world_size,
        opts.seed,
        count=count,
    )
    if ctx.is_cuda:
        batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]
    torch.manual_seed(opts.seed)
    ds_config = deepspeed_config(opts, ctx.world_size, precision, ctx.is_cuda)
    model, dims, model_name = build_model(
        shape=opts.model,
        path=opts.model_path,
        layers=opts.layers,
        precision=precision,
        attn_implementation=opts.attn_implementation,
        device=ctx.device,
        zero3_config=ds_config if opts.zero_stage == 3 and _zero_init(opts, ctx.is_cuda) else None,
        gradient_checkpointing=opts.gradient_checkpointing,
    )
    if tokenizer.vocab_size > dims.vocab:
        raise ValueError(
            f"the {tokenizer.name} tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary "
            f"holds {dims.vocab}; use a model with a larger vocabulary or the matching tokenizer"
        )
    return _Prepared(
        precision, world_group is not None and dist.group.WORLD is world_group, tokenizer.name, data_path,
        len(items), batches, [int(b["attention_mask"].sum()) for b in batches],
        [[int(n) for n in b["attention_mask"].sum(dim=1).tolist()] for b in batches], ds_config, model, dims, model_name,
    )  # fmt: skip


@dataclass
class _Steps:
    """What the timed steps measured on this rank."""

    losses: list[float]
    """Every step's loss, averaged over the ranks."""
    step_times: list[float]
    step_cpu_times: list[float]
    real_tokens: int
    real_lengths: list[int]
    """Every timed sequence's real length, in order (for attention FLOPs over real tokens)."""
    util: dict[str, Any] | None
    util_reason: str | None
    nvml_used: int


def _run_steps(ctx: RankContext, opts: SFTOptions, engine: Any, prep: _Prepared) -> _Steps:
    """``warmup_steps + steps`` optimizer steps; the timed ones start together on every rank."""
    import torch
    import torch.distributed as dist

    total_steps = opts.warmup_steps + opts.steps
    losses, step_times, step_cpu_times, real_tokens, real_lengths = [], [], [], 0, []
    sampler, util_reason, last_print = None, None, 0.0
    try:
        for step in range(1, total_steps + 1):
            if step == opts.warmup_steps + 1:
                ctx.barrier()  # every rank starts the timed steps together
                sampler, util_reason = start_sampler(ctx, opts.gpu_util_interval_s)
            ctx.synchronize()
            start, start_cpu = time.perf_counter(), time.process_time()
            loss_sum = None
            for micro in range(opts.grad_accum):
                index = ((step - 1) * opts.grad_accum + micro) % len(prep.batches)
                inputs = {k: v.to(ctx.device, non_blocking=True) for k, v in prep.batches[index].items()}
                loss = engine(**inputs).loss
                engine.backward(loss)
                engine.step()
                loss_sum = loss.detach().float() if loss_sum is None else loss_sum + loss.detach().float()
                if step > opts.warmup_steps:
                    real_tokens += prep.real_tokens_of[index]
                    real_lengths += prep.lengths_of[index]
            ctx.synchronize()
            elapsed = time.perf_counter() - start
            losses.append(loss_sum / opts.grad_accum)
            if step > opts.warmup_steps:
                step_times.append(elapsed)
                step_cpu_times.append(time.process_time() - start_cpu)
            now = time.perf_counter()
            if ctx.rank == 0 and (step in (1, total_steps) or now - last_print >= opts.progress_interval_s):
                last_print = now
                eta = (total_steps - step) * elapsed
                ctx.progress(
                    f"step {step}/{total_steps}  {elapsed:.2f} s/it  loss {float(losses[-1]):.2f}  ETA {eta:.0f}s"
                )
        util, nvml_used = sampler.stop() if sampler is not None else (None, 0)
    except BaseException:
        if sampler is not None and not sampler.stopped:
            sampler.stop()
        raise
    if sampler is not None and util is None:
        util_reason = sampler.error or "not sampled: the timed steps were shorter than one NVML interval"
    # One all-reduce after the clock stops: the loss every rank reports is the job's mean.
    loss_curve = torch.stack(losses)
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(loss_curve)
        loss_curve /= ctx.world_size
    values = [float(v) for v in loss_curve.cpu()]
    return _Steps(values, step_times, step_cpu_times, real_tokens, real_lengths, util, util_reason, nvml_used)


def train(ctx: RankContext) -> dict[str, Any]:
    """Run the SFT case in ``ctx.options`` on this rank; return this rank's measurements."""
    import deepspeed

    t_setup = time.perf_counter()
    opts = SFTOptions.from_options(ctx.options)
    prep = _prepare(ctx, opts)
    engine = optimizer = None
    try:
        engine, optimizer, _, _ = deepspeed.initialize(
            model=prep.model,
            model_parameters=[p for p in prep.model.parameters() if p.requires_grad],
            config=prep.ds_config,
        )
        prep.model = None  # the engine holds it now
        setup_s = time.perf_counter() - t_setup
        steps = _run_steps(ctx, opts, engine, prep)
    except BaseException:
        if engine is not None:
            engine.destroy()
        raise
    # FEASIBILITY.md §7: without this teardown, ZeRO-3 on gloo can abort at interpreter exit.
    engine.destroy()
    ctx.barrier()
    del engine, optimizer
    gc.collect()
    result = _result(ctx, opts, prep, steps, setup_s)
    if ctx.rank == 0:
        ctx.progress(
            f"SFT {result['model']} ZeRO-{opts.zero_stage} {prep.precision} x{ctx.world_size}: "
            f"{result['step_time_median_s']:.3f} s/it (p90 {result['step_time_p90_s']:.3f}), "
            f"{result['samples_per_s']:.1f} samples/s, {result['tokens_per_s_per_device']:.0f} tokens/s/device, "
            f"loss {steps.losses[0]:.2f} -> {steps.losses[-1]:.2f}"
        )
    return result


def _result(
    ctx: RankContext, opts: SFTOptions, prep: _Prepared, steps: _Steps, setup_s: float
) -> dict[str, Any]:
    """This rank's measurements, as the parent's checks read them (``checks/sft.py``)."""
    import torch

    times = metrics.summarize(steps.step_times)
    samples_per_step = opts.micro_batch * opts.grad_accum
    tokens_per_s = samples_per_step * opts.seq_len / times.median
    flops_per_token = prep.dims.flops_per_token(opts.seq_len)
    processed = samples_per_step * opts.seq_len * opts.steps
    model_flops, formula = metrics.step_model_flops(
        prep.dims, processed, opts.seq_len, steps.real_lengths,
        skips_padding=opts.attn_implementation == "flash_attention_2",
    )  # fmt: skip
    # per device per second at the median step: the timed steps' FLOPs averaged over them
    model_flops_per_s = model_flops / opts.steps / times.median
    mfu = model_flops_per_s / opts.peak_flops if opts.peak_flops else None
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "host": ctx.host,
        "device": ctx.device,
        "model": prep.model_name,
        "params": prep.dims.params,
        "options": {**asdict(opts), "offload": list(opts.offload), "precision": prep.precision},
        "deepspeed_config": prep.ds_config,
        "deepspeed_reused_process_group": prep.reused_group,
        "cpu_threads": None if ctx.is_cuda else torch.get_num_threads(),
        "tokenizer": prep.tokenizer,
        "dataset": str(prep.data_path),
        "examples": prep.examples,
        "setup_s": setup_s,
        "step_times_s": steps.step_times,
        "step_time_median_s": times.median,
        "step_time_p90_s": times.p90,
        # CPU seconds this process spent per timed step: beside the wall time, it tells work
        # from waiting (for peers, the GPU, or other jobs on a shared machine).
        "step_process_cpu_median_s": metrics.summarize(steps.step_cpu_times).median,
        "samples_per_s": samples_per_step * ctx.world_size / times.median,
        "samples_per_s_per_device": samples_per_step / times.median,
        "tokens_per_s_per_device": tokens_per_s,
        "tokens_counted": "processed: micro_batch x grad_accum x seq_len per step, padding included",
        "real_tokens_per_s_per_device": steps.real_tokens / opts.steps / times.median,
        "flops_per_token": flops_per_token,
        "padding_fraction": 1.0 - steps.real_tokens / processed if processed else None,
        "model_flops_per_s_per_device": model_flops_per_s,
        "mfu_formula": metrics.MFU_FORMULAS[formula],
        "peak_flops": opts.peak_flops,
        "mfu": mfu,
        "mfu_reason": None if mfu is not None else "no peak_flops in the options (the profile gives it)",
        "losses": steps.losses,
        "loss_first": steps.losses[0],
        "loss_last": steps.losses[-1],
        "loss_finite": all(math.isfinite(v) for v in steps.losses),
        "gpu_util_pct": steps.util,
        "gpu_util_reason": None if steps.util is not None else steps.util_reason,
        **peak_memory(ctx, steps.nvml_used),
    }
