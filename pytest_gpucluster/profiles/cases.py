"""Physics checks of the ``sft:`` cases and the ``scaling:`` section.

Throughput (``min_samples_per_s``, ``min_tokens_per_s_per_gpu``, ``max_step_time``, ``min_mfu``)
    Each implies a rate of tokens per GPU (the SFT workload pads every sample to ``seq_len``; a step
    is ``micro_batch x grad_accum`` samples per rank); times the PaLM FLOPs per token of the shape
    (``6N + 12·L·H·Q·T``) over the dense bf16 peak, that is the MFU the threshold demands: above
    100% an error, above 60% a warning (PaLM reports 46.2% on 6144 TPU v4 chips).
Memory (class 1 of thresholds/README.md)
    ``max_peak_memory`` above the device is an error. The case's model states + activations +
    allowance (``estimates.estimate_memory``) above the device memory, at the case's own size and
    at every scaling size it runs at, is an error (it cannot run); a ``max_peak_memory`` below that
    estimate is a warning (a healthy run cannot pass it).
Time (class 2)
    Each job of the case (``estimates.estimate_case_runtime``: steps x step time at a slow MFU,
    plus start-up) must fit the timeout it runs under: ``timeout:``, else ``--job-timeout``'s
    default, 900 s.
Gates that cannot fail (class 6)
    A case that gates no throughput (none of the four above) is warned about: a cluster several
    times slower still passes it. ``min_gpu_util`` does not count: NVML's utilisation is the share
    of time "one or more kernels was executing on the GPU" (NVML ``nvmlUtilization_t.gpu``), which
    NCCL kernels waiting on a slow network fill as well as matmuls do.
"""

from __future__ import annotations

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.profiles.estimates import (
    DEFAULT_JOB_TIMEOUT_S,
    case_shape,
    estimate_case_runtime,
    estimate_memory,
)
from pytest_gpucluster.profiles.findings import Collector, KeyPath, gib, pct, seconds, sig, tflops
from pytest_gpucluster.profiles.peaks import Figure, Peaks
from pytest_gpucluster.profiles.schema import ClusterSection, ProfileModel, SftCase

__all__ = ["MFU_WARNING", "case_world", "check_case", "check_scaling", "implied_mfu"]

MFU_WARNING = 0.60
"""Implied MFU above this is suspicious (warning); above 1.0 it is impossible (error)."""

_THROUGHPUT = ("max_step_time", "min_samples_per_s", "min_tokens_per_s_per_gpu", "min_mfu")


def case_world(case: SftCase, cluster: ClusterSection) -> int:
    """Ranks of an SFT case: its nodes x its ranks per node (the cluster's when it sets none)."""
    return case.nodes * (case.ranks_per_node or cluster.effective_ranks_per_node)


def implied_mfu(
    case: SftCase, field: str, value: float, cluster: ClusterSection, peak: Figure
) -> tuple[float, str] | None:
    """The MFU a throughput threshold demands, with its arithmetic; None for an unknown model."""
    shape = case_shape(case.model)
    if shape is None:
        return None
    world = case_world(case, cluster)
    t = case.seq_len
    if field == "min_samples_per_s":
        tokens = value * t / world
        rate = f"{sig(value, 6)} samples/s x {t} tokens / {world} GPUs = {sig(tokens, 6)} tokens/s per GPU"
    elif field == "min_tokens_per_s_per_gpu":
        tokens = value
        rate = f"{sig(tokens, 6)} tokens/s per GPU"
    elif field == "max_step_time":
        per_step = case.micro_batch * case.grad_accum * t
        tokens = per_step / value
        rate = (
            f"{case.micro_batch} x {case.grad_accum} x {t} tokens per GPU per step "
            f"(micro_batch x grad_accum x seq_len) / {value:.4g} s = {sig(tokens, 6)} tokens/s per GPU"
        )
    else:
        raise ValueError(f"not a throughput threshold: {field}")
    fpt = shape.flops_per_token(t)
    mfu = metrics.mfu(tokens, fpt, peak.value)
    text = (
        f"{rate}; x {sig(fpt / 1e9)} GFLOP/token ({case.model} at seq_len {t}, PaLM 6N + 12·L·H·Q·T) "
        f"= {tflops(tokens * fpt)} per GPU; / {tflops(peak.value)} dense peak ({peak.source}) = {pct(mfu)} MFU"
    )
    return mfu, text


def _check_throughput(
    out: Collector, base: KeyPath, case: SftCase, model: ProfileModel, peaks: Peaks
) -> None:
    for field in ("min_samples_per_s", "min_tokens_per_s_per_gpu", "max_step_time"):
        value = getattr(case, field)
        if value is None:
            continue
        key = (*base, field)
        if peaks.peak_flops is None:
            out.skip(key, "no device peak (cluster.peak_flops, or a gpu_model in devices.yaml)")
            continue
        if field == "max_step_time" and value <= 0:
            out.error(key, "max_step_time must be positive")
            continue
        result = implied_mfu(case, field, value, model.cluster, peaks.peak_flops)
        if result is None:
            out.skip(key, f"model {case.model!r} is not a named shape; its FLOPs per token are unknown")
            continue
        out.checked += 1
        mfu, text = result
        shown = f"{value:.4g} s" if field == "max_step_time" else sig(value, 6)
        if mfu > 1.0:
            out.error(
                key,
                f"{field} {shown} implies {pct(mfu)} MFU, more than the GPU's peak: {text}. "
                "No GPU computes faster than its peak; lower the threshold (or fix seq_len/model/peak_flops).",
            )
        elif mfu > MFU_WARNING:
            out.warning(
                key,
                f"{field} {shown} implies {pct(mfu)} MFU, above {pct(MFU_WARNING)} (PaLM reports 46.2%): "
                f"{text}. Possible, but check the number.",
            )
    if case.min_mfu is not None:
        key = (*base, "min_mfu")
        out.checked += 1
        if case.min_mfu > 1.0:
            out.error(key, f"min_mfu {pct(case.min_mfu)} is above 100%: no GPU computes faster than its peak")
        elif case.min_mfu > MFU_WARNING:
            out.warning(key, f"min_mfu {pct(case.min_mfu)} is above {pct(MFU_WARNING)} (PaLM reports 46.2%)")
    if case.min_gpu_util is not None:
        out.checked += 1
        if case.min_gpu_util > 1.0:
            out.error(
                (*base, "min_gpu_util"),
                f"min_gpu_util {pct(case.min_gpu_util)} is above 100%, which cannot be measured",
            )


def _run_sizes(case: SftCase, model: ProfileModel) -> list[tuple[int, int, str]]:
    """(nodes, ranks, what) of every job this case runs: its own, and each scaling count."""
    per_node = case.ranks_per_node or model.cluster.effective_ranks_per_node
    sizes = {(case.nodes, case.nodes * per_node): "as the case runs"}
    scaling = model.scaling
    if scaling is not None and scaling.case == case.name:
        for step in scaling.steps:
            for count in (step.from_nodes, step.to_nodes):
                job = (1, count) if scaling.unit == "ranks" else (count, count * per_node)
                sizes.setdefault(job, f"at scaling {scaling.unit}={count}")
    return [(n, r, what) for (n, r), what in sorted(sizes.items())]


def _check_memory(out: Collector, base: KeyPath, case: SftCase, model: ProfileModel, peaks: Peaks) -> None:
    if model.cluster.device != "cuda":
        if case.max_peak_memory is not None:
            out.skip(
                (*base, "max_peak_memory"),
                "a CPU profile's peak memory is resident memory, not device memory",
            )
        return
    memory = peaks.memory
    if memory is None:
        out.skip(base, "no device memory (cluster.gpu_memory, or a gpu_model in devices.yaml)")
        return
    if case.max_peak_memory is not None:
        out.checked += 1
        if case.max_peak_memory > memory.value:
            out.error(
                (*base, "max_peak_memory"),
                f"max_peak_memory {gib(case.max_peak_memory)} is above the device memory {gib(memory.value)} "
                f"({memory.source}): a process cannot hold more than the device has, so this ceiling never fails",
            )
    shape = case_shape(case.model)
    if shape is None:
        out.skip(base, f"memory not estimated: model {case.model!r} is not a named shape")
        return
    out.checked += 1
    estimates = [
        (
            estimate_memory(
                shape,
                zero_stage=case.zero_stage,
                precision=case.precision,
                offload=case.offload,
                ranks=ranks,
                micro_batch=case.micro_batch,
                seq_len=case.seq_len,
                gradient_checkpointing=case.gradient_checkpointing,
                attn_implementation=case.attn_implementation,
            ),
            ranks,
            what,
        )
        for _, ranks, what in _run_sizes(case, model)
    ]
    worst, ranks, what = max(estimates, key=lambda e: e[0].total)
    settings = f"zero_stage {case.zero_stage}, offload {case.offload}, {case.precision}"
    if worst.total > memory.value:
        out.error(
            base,
            f"sft case {case.name!r} cannot fit on {ranks} rank{'s' if ranks != 1 else ''} ({what}; {settings}): "
            f"it needs about {gib(worst.total)} per GPU, more than the {gib(memory.value)} device memory "
            f"({memory.source}). {worst.arithmetic}. Offload the optimizer (offload: optimizer), partition "
            "over more ranks (zero_stage 3), or train a smaller model or batch.",
        )
        return
    if case.max_peak_memory is not None and case.max_peak_memory < worst.total:
        out.warning(
            (*base, "max_peak_memory"),
            f"max_peak_memory {gib(case.max_peak_memory)} is below what the case needs at least, "
            f"{gib(worst.total)} on {ranks} ranks ({what}): {worst.arithmetic}. A healthy run cannot pass it.",
        )


def _check_runtime(out: Collector, base: KeyPath, case: SftCase, model: ProfileModel, peaks: Peaks) -> None:
    if model.cluster.device != "cuda":
        return  # no peak to estimate from; the CPU cases are calibrated by measurement
    timeout = case.timeout if case.timeout is not None else DEFAULT_JOB_TIMEOUT_S
    source = "timeout" if case.timeout is not None else "--job-timeout default (no timeout: in the case)"
    peak = peaks.peak_flops.value if peaks.peak_flops else None
    jobs = []
    for nodes, _, what in _run_sizes(case, model):
        estimate = estimate_case_runtime(case, model.cluster, nodes=nodes, peak_flops=peak)
        if isinstance(estimate, str):
            out.skip((*base, "timeout"), f"run time not estimated: {estimate}")
            return
        jobs.append((estimate, what))
    out.checked += 1
    longest, what = max(jobs, key=lambda j: j[0].total_s)
    if longest.total_s > timeout:
        runs = f"; it runs {len(jobs)} times (scaling), each under the same timeout" if len(jobs) > 1 else ""
        out.error(
            (*base, "timeout"),
            f"sft case {case.name!r} cannot finish in its timeout ({what}): {longest.arithmetic} > "
            f"{seconds(timeout)} ({source}){runs}. Set timeout: to at least {seconds(longest.total_s)} "
            "or run fewer steps / a smaller grad_accum.",
        )


def _check_gates(out: Collector, base: KeyPath, case: SftCase) -> None:
    if any(getattr(case, f) is not None for f in _THROUGHPUT):
        return
    if case.min_gpu_util is not None:
        out.warning(
            (*base, "min_gpu_util"),
            f"sft case {case.name!r} gates only GPU utilisation: NVML counts the time any kernel runs, and "
            "NCCL kernels spinning on a slow network count as busy, so a cluster several times slower still "
            "passes. Gate throughput too: min_tokens_per_s_per_gpu or min_mfu (or max_step_time).",
        )
    else:
        out.warning(
            base,
            f"sft case {case.name!r} gates no throughput (none of {', '.join(_THROUGHPUT)}): a cluster several "
            "times slower passes it. Gate min_tokens_per_s_per_gpu or min_mfu.",
        )


def check_case(out: Collector, index: int, case: SftCase, model: ProfileModel, peaks: Peaks) -> None:
    base: KeyPath = ("sft", "cases", index)
    _check_throughput(out, base, case, model, peaks)
    _check_memory(out, base, case, model, peaks)
    _check_runtime(out, base, case, model, peaks)
    _check_gates(out, base, case)


def check_scaling(out: Collector, model: ProfileModel) -> None:
    if model.scaling is None:
        return
    for index, step in enumerate(model.scaling.steps):
        out.checked += 1
        if step.min_efficiency > 1.0:
            out.error(
                ("scaling", "steps", index, "min_efficiency"),
                f"min_efficiency {pct(step.min_efficiency)} from {step.from_nodes} to {step.to_nodes} "
                f"{model.scaling.unit} is above 100%: throughput({step.to_nodes}) / "
                f"({step.to_nodes}/{step.from_nodes} x throughput({step.from_nodes})) cannot be "
                "gated above linear scaling",
            )
