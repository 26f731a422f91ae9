"""What an SFT case needs before it runs: GPU memory per rank, and wall time per job.

Pure arithmetic over a model shape and the case's settings, each estimate carrying the sentence
that shows its working. ``profiles check`` holds them against the device memory and the job
timeout (``profiles/cases.py``); the launch side can call :func:`estimate_case_runtime` to set a
job's deadline from the same numbers. Imports ``maths`` (metrics and shapes) and the schema only.

Memory per rank (:func:`estimate_memory`)
    *Model states* (ZeRO, Rajbhandari et al. 2020, §3): mixed-precision Adam holds 16 bytes per
    parameter: 16-bit weights (2) and gradients (2), and fp32 master weights, momentum and variance
    (12); fp32 training holds 4 + 4 + 8. ZeRO-1 partitions the optimizer states over the
    data-parallel ranks, ZeRO-2 the gradients too, ZeRO-3 the weights too; on one rank nothing is
    partitioned. ``offload: optimizer`` (ZeRO-Offload, Ren et al. 2021, §4) keeps only the 16-bit
    weights on the GPU: gradients and optimizer states live and update in host memory;
    ``optimizer+params`` (ZeRO-3) moves the weights too, leaving the live working set.
    *Activations* of one micro-batch (Korthikanti et al. 2022, §4, adapted to the Llama block:
    RMSNorm, SwiGLU, grouped-query attention, no dropout): each layer keeps ``6h + 2h_kv + 4I``
    values per token (norm inputs and outputs, Q, K, V, attention output; gate, SiLU, up and
    product), plus ``heads x seq_len`` attention probabilities per token with eager attention.
    With gradient checkpointing each layer keeps only its input (``h`` per token) and one layer's
    set is rebuilt at a time. The loss adds ``vocab`` logits per token in the training dtype, their
    fp32 upcast and the fp32 log-softmax kept for backward.
    *Allowance*: 1 GiB of CUDA context, cuBLAS workspace and NCCL buffers; DeepSpeed's buffers at
    their defaults (the workload sets none), in the training dtype: ``reduce_bucket_size`` +
    ``allgather_bucket_size`` = 2 x 5e8 elements at ZeRO-1/2; at ZeRO-3 the gathered weights,
    ``stage3_max_live_parameters`` = 1e9 elements (or the whole model if smaller), +
    ``stage3_prefetch_bucket_size`` = 5e7; and 10% of the rest for the caching allocator's
    fragmentation. This is a floor on what a run needs, not
    a prediction of ``max_memory_reserved``: real runs hold more (seed 000's 13B job reported
    59.5-68.9 GB where this counts ~33 GB).

Run time per job (:func:`estimate_step_time`, :func:`estimate_case_runtime`)
    A step moves ``micro_batch x grad_accum x seq_len`` tokens per GPU; at the PaLM FLOPs per token
    of the shape and :data:`ESTIMATE_MFU` of the device's dense peak, that is the compute time.
    With optimizer offload the host then updates every parameter: at :data:`HOST_ADAM_PARAMS_PER_S`
    per node. A job is ``warmup_steps + steps`` steps plus :data:`STARTUP_ALLOWANCE_S`. The figures are
    deliberately slow (a healthy run beats them), so a timeout set from them does not kill a
    healthy run.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.profiles.findings import gib, seconds, sig
from pytest_gpucluster.profiles.schema import ClusterSection, SftCase

__all__ = [
    "DEFAULT_JOB_TIMEOUT_S",
    "ESTIMATE_MFU",
    "HOST_ADAM_PARAMS_PER_S",
    "STARTUP_ALLOWANCE_S",
    "MemoryEstimate",
    "RuntimeEstimate",
    "case_shape",
    "estimate_case_runtime",
    "estimate_memory",
    "estimate_step_time",
]

DEFAULT_JOB_TIMEOUT_S = 900.0
"""``--job-timeout``'s default: what a case without ``timeout:`` runs under."""

ESTIMATE_MFU = 0.15
"""MFU assumed for a step-time estimate: less than half of what healthy DeepSpeed/FSDP training
reaches on Hopper (seed 001: 33.6%; llm-foundry's H100 table: 40-46% for 7B), so a run half as
fast as healthy still finishes inside a timeout set from the estimate."""

HOST_ADAM_PARAMS_PER_S = 0.5e9
"""Parameters per second one node's CPU Adam updates with optimizer offload. Seed 000's slowest
offload run (A800, 8 GPUs, llama-7b, 13.24 s per step) updated 6.7e9 parameters per step, so at
least 0.51e9/s even if the whole step had been the host's; the others were faster (1.5-2e9/s)."""

STARTUP_ALLOWANCE_S = 180.0
"""What an SFT job's deadline (and the soak's) grants launch, imports, random initialisation of the
model, DeepSpeed set-up and NCCL communicator creation before the first step: an allowance, not an
expectation (cpu-local's tiny cases spend 10-30 s there; a 70B ZeRO-3 model built under zero.Init
takes minutes). The plan's expected start-up is `plans.startup`'s."""

_BUCKET_ELEMENTS = 2 * 5e8
"""DeepSpeed's reduce_bucket_size + allgather_bucket_size defaults (ZeRO-1/2)."""
_LIVE_ELEMENTS, _PREFETCH_ELEMENTS = 1e9, 5e7
"""DeepSpeed's stage3_max_live_parameters and stage3_prefetch_bucket_size defaults (ZeRO-3)."""
_CONTEXT_BYTES = 2**30
_FRAGMENTATION = 0.10


def case_shape(model: str) -> metrics.TransformerShape | None:
    """The named shape of a case's ``model`` (``llama2-7b``...), None for a checkpoint path."""
    try:
        from pytest_gpucluster.maths.shapes import get_shape

        return get_shape(model).dims
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """GPU memory one rank needs, by part, and the arithmetic behind each part."""

    model_states: float
    activations: float
    allowance: float
    host_bytes: float
    """Moved to host memory by offload (per rank)."""
    states_text: str
    activations_text: str
    allowance_text: str

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.allowance

    @property
    def arithmetic(self) -> str:
        return (
            f"model states {self.states_text}; activations {self.activations_text}; "
            f"allowance {self.allowance_text}; total {gib(self.total)}"
        )


def _states(
    params: int, zero_stage: int, precision: str, offload: str, ranks: int
) -> tuple[float, float, str]:
    weight, grad, optim = (4, 4, 8) if precision == "fp32" else (2, 2, 12)
    parts = {"weights": float(weight), "gradients": float(grad), "optimizer": float(optim)}
    partitioned = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients")}.get(
        zero_stage, ("optimizer", "gradients", "weights")
    )
    for name in partitioned:
        parts[name] /= ranks
    on_host = {"none": (), "optimizer": ("optimizer", "gradients")}.get(
        offload, ("optimizer", "gradients", "weights")
    )
    host = sum(parts[n] for n in on_host) * params
    gpu = {n: v for n, v in parts.items() if n not in on_host}
    per_param = sum(gpu.values())
    dtype = "fp32" if precision == "fp32" else "16-bit"
    recipe = f"{weight} B {dtype} weights + {grad} B gradients + {optim} B Adam states" + (
        "" if precision == "fp32" else " (fp32 master, momentum, variance)"
    )
    scope = f"ZeRO-{zero_stage} over {ranks} rank{'s' if ranks != 1 else ''}" + (
        " partitions nothing" if ranks == 1 or zero_stage == 0 else f" partitions {', '.join(partitioned)}"
    )
    kept = " + ".join(f"{sig(v, 3)} B {n}" for n, v in gpu.items()) or "0 B"
    moved = f"; offload {offload} moves {', '.join(on_host)} to host memory" if on_host else ""
    text = (
        f"{sig(params / 1e9, 4)}e9 parameters x ({recipe}; {scope}{moved}; on the GPU {kept} "
        f"= {sig(per_param, 3)} B/parameter) = {gib(per_param * params)}"
    )
    return per_param * params, host, text


def _activations(
    shape: metrics.TransformerShape,
    tokens: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    attn_implementation: str | None,
) -> tuple[float, str]:
    width = 4 if precision == "fp32" else 2
    kv = shape.kv_heads * shape.head_dim
    per_layer = 6 * shape.hidden + 2 * kv + 4 * shape.intermediate
    eager = attn_implementation == "eager"
    if eager:
        per_layer += shape.heads * seq_len
    layer_bytes = per_layer * width * tokens
    if checkpointing:
        kept = shape.layers * shape.hidden * width * tokens + layer_bytes
        how = (
            f"{shape.layers} layer inputs x {shape.hidden} + one layer rebuilt "
            f"({per_layer:,} values per token)"
        )
    else:
        kept = shape.layers * layer_bytes
        how = f"{shape.layers} layers x {per_layer:,} values per token"
    logits = tokens * shape.vocab * (width + 8)
    text = (
        f"{tokens:,} tokens per micro-batch x ({how}"
        f"{', eager attention keeps heads x seq_len probabilities' if eager else ''}) x {width} B = "
        f"{gib(kept)}, + logits {tokens:,} x {shape.vocab:,} vocab x ({width} + 4 + 4) B = {gib(logits)}"
    )
    return kept + logits, text


def estimate_memory(
    shape: metrics.TransformerShape,
    *,
    zero_stage: int,
    precision: str,
    offload: str,
    ranks: int,
    micro_batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    attn_implementation: str | None = None,
) -> MemoryEstimate:
    """GPU memory one of ``ranks`` data-parallel ranks needs (see the module docstring)."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    states, host, states_text = _states(shape.params, zero_stage, precision, offload, ranks)
    activations, act_text = _activations(
        shape, micro_batch * seq_len, seq_len, precision, gradient_checkpointing, attn_implementation
    )
    width = 4 if precision == "fp32" else 2
    if zero_stage == 3:
        buckets = (min(_LIVE_ELEMENTS, shape.params) + _PREFETCH_ELEMENTS) * width
    else:
        buckets = _BUCKET_ELEMENTS * width if zero_stage in (1, 2) else 0.0
    fragmentation = _FRAGMENTATION * (states + activations)
    allowance = _CONTEXT_BYTES + buckets + fragmentation
    allowance_text = (
        f"1 GiB CUDA context and NCCL + {gib(buckets)} DeepSpeed buckets + 10% fragmentation "
        f"{gib(fragmentation)} = {gib(allowance)}"
    )
    return MemoryEstimate(states, activations, allowance, host, states_text, act_text, allowance_text)


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    """How long one job of a case takes at the deliberately slow rates of this module."""

    step_s: float
    steps: int
    startup_s: float
    step_text: str

    @property
    def work_s(self) -> float:
        """The steps alone, without the start-up allowance."""
        return self.steps * self.step_s

    @property
    def total_s(self) -> float:
        """The steps plus the start-up allowance: what a deadline is set against."""
        return self.startup_s + self.work_s

    @property
    def arithmetic(self) -> str:
        return (
            f"{self.steps} steps (warm-up included) x {self.step_text} + {sig(self.startup_s)} s start-up "
            f"= {seconds(self.total_s)}"
        )


def estimate_step_time(
    shape: metrics.TransformerShape,
    *,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    peak_flops: float,
    nodes: int = 1,
    offload: str = "none",
    mfu: float = ESTIMATE_MFU,
) -> tuple[float, str]:
    """Seconds per optimizer step, and the arithmetic: compute at ``mfu`` of ``peak_flops``, plus
    the host's Adam over every parameter when the optimizer is offloaded."""
    tokens = micro_batch * grad_accum * seq_len
    fpt = shape.flops_per_token(seq_len)
    compute = tokens * fpt / (peak_flops * mfu)
    text = (
        f"{micro_batch} x {grad_accum} x {seq_len} = {tokens:,} tokens per GPU x {sig(fpt / 1e9)} GFLOP/token "
        f"/ ({sig(peak_flops / 1e12)} TFLOP/s x {sig(mfu * 100, 3)}% MFU) = {sig(compute)} s"
    )
    if offload == "none":
        return compute, f"({text} per step)"
    host = shape.params / nodes / HOST_ADAM_PARAMS_PER_S
    text += (
        f" + host Adam {sig(shape.params / 1e9)}e9 parameters / {nodes} node{'s' if nodes != 1 else ''} "
        f"/ {sig(HOST_ADAM_PARAMS_PER_S / 1e9)}e9 per s = {sig(host)} s"
    )
    return compute + host, f"({text} = {sig(compute + host)} s per step)"


def estimate_case_runtime(
    case: SftCase,
    cluster: ClusterSection,
    *,
    nodes: int | None = None,
    peak_flops: float | None = None,
    mfu: float = ESTIMATE_MFU,
) -> RuntimeEstimate | str:
    """One job of ``case`` on ``nodes`` (default: the case's), or a sentence saying why it cannot
    be estimated. ``peak_flops`` defaults to ``cluster.peak_flops`` (the device table's figure is
    the physics checks' business: they pass it in); ``mfu``: the deliberately slow
    :data:`ESTIMATE_MFU` deadlines are set from, unless the plan asks for its expected one."""
    shape = case_shape(case.model)
    if shape is None:
        return f"model {case.model!r} is not a named shape; its FLOPs per token are unknown"
    peak = peak_flops if peak_flops is not None else cluster.peak_flops
    if not peak:
        return "no device peak (cluster.peak_flops, or a gpu_model in devices.yaml)"
    step, text = estimate_step_time(
        shape,
        micro_batch=case.micro_batch,
        grad_accum=case.grad_accum,
        seq_len=case.seq_len,
        peak_flops=peak,
        nodes=nodes or case.nodes,
        offload=case.offload,
        mfu=mfu,
    )
    return RuntimeEstimate(step, case.steps + case.warmup_steps, STARTUP_ALLOWANCE_S, text)
