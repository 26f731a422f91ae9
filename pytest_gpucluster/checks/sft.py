"""Verdicts of SFT and scaling acceptance: what the ranks (or a training log) measured, as checks.

Used by ``acceptance/test_sft.py`` and ``acceptance/test_scaling.py``; what they launch is
``plans/sft.py``, the rank side ``workloads/sft.py``. Pure: no pytest, no torch. Every threshold
names its profile key (``ThresholdRef(profile, ("sft", "cases", 0, "max_step_time"))``), so
``gpucluster profiles derive`` maps it back.

What is judged, per case:

============================ =========================== =========================================
metric                       threshold                   value
============================ =========================== =========================================
``sft.step_time``            ``max_step_time``           median optimizer-step time, slowest rank
``sft.samples_per_s``        ``min_samples_per_s``       whole job, from that slowest median
``sft.tokens_per_s_per_gpu`` ``min_tokens_per_s_per_gpu`` the slowest rank's processed tokens/s
``sft.mfu``                  ``min_mfu``                 the slowest rank's MFU (needs peak_flops)
``sft.peak_memory``          ``max_peak_memory``         per rank (labels rank, host): CUDA max
                                                         reserved, or the process's peak resident set
``sft.gpu_util``             ``min_gpu_util``            per rank, mean NVML utilisation (never a
                                                         throughput figure: see below)
``sft.loss_finite``          always                      every step's loss is finite
``sft.loss_decreased``       always (launched runs)      the last step's loss is below the first
============================ =========================== =========================================

A metric whose threshold is unset is still recorded (verdict ``info``) when it was measured; a
threshold set but not measured (MFU without ``cluster.peak_flops``) is a check with no value,
which ``Recorder.check_all`` reports as not measured.

GPU utilisation is not throughput: NVML counts the time any kernel runs, and NCCL kernels spinning
on a slow network count as busy, so a network-bound job reads ~100%. It stays recorded, while
throughput (step time, samples/s, tokens/s per GPU, MFU) is always recorded beside it and gated
where the case sets a floor. A case that gates utilisation but no throughput says so in the
``sft.gpu_util`` hint (``gpucluster profiles check`` warns about such a case too, class 6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.maths.metrics import scaling_efficiency
from pytest_gpucluster.parsers.train_log import TrainLog
from pytest_gpucluster.profiles.schema import ProfileModel, SftCase
from pytest_gpucluster.results.model import Check, Comparison, Spread, ThresholdRef

__all__ = ["launched_checks", "log_checks", "scaling_checks", "throughput"]

NOT_MEASURED = float("nan")
THROUGHPUT_KEYS = ("max_step_time", "min_samples_per_s", "min_tokens_per_s_per_gpu", "min_mfu")
"""The case keys that gate throughput; ``min_gpu_util`` is not one (module doc)."""


def _ref(profile: ProfileModel, index: int, key: str) -> ThresholdRef:
    return ThresholdRef(profile.name, ("sft", "cases", index, key))


def _threshold_note(case: SftCase) -> str:
    return f" Threshold: {case.source}." if case.source else ""


def _memory_hint(kind: str) -> str:
    if kind == "cpu_max_rss":
        what = "the rank process's peak resident set, as this CPU rank trains"
    else:
        what = "torch.cuda.max_memory_reserved on the rank's GPU (allocated plus the caching allocator's reserve)"
    return (
        f"Peak memory is {what}. Next: compare the rank with the others (a rank far above them holds "
        "something extra), and the case's micro_batch, seq_len, zero_stage and gradient_checkpointing "
        "with the job the threshold came from."
    )


class _CaseChecks:
    """Builds the checks of one case: the profile key of each threshold, the case label."""

    def __init__(self, case: SftCase, index: int, profile: ProfileModel, labels: Mapping[str, Any]) -> None:
        self.case, self.index, self.profile = case, index, profile
        self.labels = dict(labels)
        self.out: list[Check] = []

    def add(
        self,
        metric: str,
        value: float,
        key: str,
        unit: str,
        comparison: Comparison,
        hint: str,
        *,
        labels: Mapping[str, Any] | None = None,
        spread: Spread | None = None,
    ) -> None:
        threshold = getattr(self.case, key)
        self.out.append(
            Check(
                metric,
                value,
                unit,
                threshold,
                comparison,
                _ref(self.profile, self.index, key) if threshold is not None else None,
                labels={**self.labels, **(labels or {})},
                spread=spread,
                hint=hint + (_threshold_note(self.case) if threshold is not None else ""),
            )
        )


def _speed_hint(case: SftCase, values: Sequence[Mapping[str, Any]], slowest: Mapping[str, Any]) -> str:
    cpu_note = (
        f"; it spent {slowest['step_process_cpu_median_s']:.3g} s of CPU per step"
        if slowest.get("step_process_cpu_median_s") is not None and slowest.get("cpu_threads")
        else ""
    )
    return (
        f"rank {slowest['rank']} on {slowest['host']} was the slowest; {len(values)} ranks, "
        f"{slowest['model']} ({slowest['params'] / 1e6:.3g}M parameters), ZeRO-{case.zero_stage}, "
        f"{slowest['options']['precision']}, micro-batch {case.micro_batch} x {case.grad_accum} accumulation "
        f"x {case.seq_len} tokens{cpu_note}. Next: the rank logs in the job directory (a rank far slower "
        "than the others points at its node), then the collectives tests for the network."
    )


def _loss_checks(build: _CaseChecks, losses: Sequence[float]) -> None:
    shown = " ".join(f"{x:.3g}" for x in losses)
    build.out.append(
        Check(
            "sft.loss_finite",
            float(all(math.isfinite(x) for x in losses)),
            "bool",
            1.0,
            "==",
            labels=build.labels,
            hint=f"Loss per step (mean over ranks): {shown}. A NaN or inf loss: an fp16 overflow, a bad "
            "learning rate, or a rank computing garbage (check its GPU for Xid errors).",
        )
    )
    build.out.append(
        Check(
            "sft.loss_decreased",
            float(losses[-1] < losses[0]),
            "bool",
            1.0,
            "==",
            labels=build.labels,
            hint=f"Loss per step (mean over ranks): {shown}. Training from random weights on the same data "
            "must lower the loss; if it does not, gradients are not reaching the optimizer (or ranks "
            "disagree on the model).",
        )
    )


def _per_step(rate: float, value: Mapping[str, Any]) -> Spread | None:
    """A rate measured over the median step (``rate`` = work / median step time), step by step:
    the same work over each timed step's time — the noise the regression gate holds a change against."""
    times = [t for t in value.get("step_times_s") or () if t > 0]
    median = value.get("step_time_median_s") or 0.0
    if not times or median <= 0:
        return None
    return Spread.of(rate * median / t for t in times)


def launched_checks(
    case: SftCase, index: int, profile: ProfileModel, values: Sequence[Mapping[str, Any]], origin: str
) -> list[Check]:
    """The checks of one launched case, from every rank's ``train`` result; ``origin`` (the job)
    goes into the hints."""
    build = _CaseChecks(case, index, profile, {"case": case.name})
    slowest = max(values, key=lambda v: v["step_time_median_s"])
    speed = f"{_speed_hint(case, values, slowest)} Job: {origin}."
    build.add(
        "sft.step_time", slowest["step_time_median_s"], "max_step_time", "s", "<=", speed,
        spread=Spread.of(slowest["step_times_s"]),
    )  # fmt: skip
    by_samples = min(values, key=lambda v: v["samples_per_s"])
    build.add(
        "sft.samples_per_s", by_samples["samples_per_s"], "min_samples_per_s", "samples/s", ">=", speed,
        spread=_per_step(by_samples["samples_per_s"], by_samples),
    )  # fmt: skip
    by_tokens = min(values, key=lambda v: v["tokens_per_s_per_device"])
    build.add(
        "sft.tokens_per_s_per_gpu", by_tokens["tokens_per_s_per_device"], "min_tokens_per_s_per_gpu",
        "tokens/s", ">=", f"Processed tokens (padding included) per second per device. {speed}",
        spread=_per_step(by_tokens["tokens_per_s_per_device"], by_tokens),
    )  # fmt: skip
    padding = [v["padding_fraction"] for v in values if v.get("padding_fraction") is not None]
    if padding:
        build.out.append(
            Check(
                "sft.padding_fraction", max(padding), "fraction", labels=build.labels, baseline_gate=False,
                hint=f"Share of the processed tokens that were padding (the most of any rank); MFU counts "
                f"attention over {slowest.get('mfu_formula') or 'the padded length'}. Job: {origin}.",
            )
        )  # fmt: skip
    mfus = [v["mfu"] for v in values if v.get("mfu") is not None]
    if len(mfus) == len(values) or case.min_mfu is not None:
        reason = next((v.get("mfu_reason") for v in values if v.get("mfu") is None), None)
        hint = (
            f"MFU against cluster.peak_flops = {slowest['peak_flops']:.4g} FLOP/s per device; model FLOPs "
            f"{slowest.get('mfu_formula') or 'PaLM: (6N + 12*L*H*Q*T) x processed tokens'}"
            + (
                f"; padding {slowest['padding_fraction']:.0%} of the tokens"
                if slowest.get("padding_fraction") is not None
                else ""
            )
            + f". {speed}"
            if len(mfus) == len(values)
            else f"MFU was not measured: {reason or 'no rank reported it'}. Set cluster.peak_flops in the profile."
        )
        build.add(
            "sft.mfu",
            min(mfus) if len(mfus) == len(values) else NOT_MEASURED,
            "min_mfu",
            "fraction",
            ">=",
            hint,
        )
    util_note = (
        ""
        if any(getattr(case, k) is not None for k in THROUGHPUT_KEYS)
        else (
            " Not a throughput gate: this case gates no throughput (none of "
            f"{', '.join(THROUGHPUT_KEYS)}), and NVML counts NCCL kernels spinning on a slow network as busy; "
            "judge the tokens/s per GPU recorded beside it, and set min_tokens_per_s_per_gpu or min_mfu."
        )
    )
    for v in values:
        rank = {"rank": v["rank"], "host": v["host"]}
        build.add(
            "sft.peak_memory", v["peak_memory_bytes"], "max_peak_memory", "B", "<=",
            _memory_hint(v["peak_memory_kind"]), labels=rank,
        )  # fmt: skip
        util = v.get("gpu_util_pct")
        if util is not None:
            hint = (
                f"Mean of {util['samples']} NVML samples every {util['interval_s']} s during the timed steps "
                f"(min {util['min']:.0f}%, max {util['max']:.0f}%). A GPU waiting for data, the host or its "
                f"peers shows low utilisation.{util_note}"
            )
            build.add(
                "sft.gpu_util", util["mean"] / 100.0, "min_gpu_util", "fraction", ">=", hint, labels=rank
            )
        elif case.min_gpu_util is not None:
            hint = f"GPU utilisation was {v.get('gpu_util_reason')}."
            build.add("sft.gpu_util", NOT_MEASURED, "min_gpu_util", "fraction", ">=", hint, labels=rank)
    _loss_checks(build, values[0]["losses"])  # all-reduced: every rank holds the job's mean
    return build.out


def log_checks(
    case: SftCase, index: int, profile: ProfileModel, log: TrainLog, log_name: str
) -> tuple[list[Check], list[str]]:
    """Checks of the case's thresholds that a training log can answer, and a sentence for each
    threshold it leaves unchecked (the log does not say, or no log can say)."""
    build = _CaseChecks(case, index, profile, {"case": case.name, "log": log_name})
    found = f"read from {log_name} ({', '.join(log.formats)})"
    unchecked: list[str] = []
    memory = None if log.peak_memory_gib is None else log.peak_memory_gib * 2**30
    answers: tuple[tuple[str, float | None, str, str, Comparison, str], ...] = (
        ("sft.step_time", log.s_per_it, "max_step_time", "s", "<=",
         "Seconds per iteration (the training progress bar's last rate, or Megatron's elapsed time per iteration)"),
        ("sft.samples_per_s", log.summary.train_samples_per_second, "min_samples_per_s", "samples/s", ">=",
         "train_samples_per_second (HF Trainer's summary, or DeepSpeed's SamplesPerSec)"),
        ("sft.peak_memory", memory, "max_peak_memory", "B", "<=",
         "peak GPU memory (the largest figure DeepSpeed or torch printed, allocated or reserved, lowest rank)"),
    )  # fmt: skip
    for metric, value, key, unit, comparison, what in answers:
        if value is not None:
            build.add(metric, value, key, unit, comparison, f"{what}, {found}.")
        elif getattr(case, key) is not None:
            unchecked.append(f"{key}: the log has no {what.split(' (')[0]}")
    for key in ("min_tokens_per_s_per_gpu", "min_mfu", "min_gpu_util"):
        if getattr(case, key) is not None:
            unchecked.append(f"{key}: not answerable from a training log (launch the case to measure it)")
    losses = [s.loss for s in log.steps if s.loss is not None]
    if log.summary.train_loss is not None:
        losses.append(log.summary.train_loss)
    if losses:
        bad = [x for x in losses if not math.isfinite(x)]
        build.out.append(
            Check(
                "sft.loss_finite", float(not bad), "bool", 1.0, "==", labels=build.labels,
                hint=f"{len(losses)} loss values {found}; {len(bad)} not finite.",
            )
        )  # fmt: skip
    return build.out, unchecked


# --------------------------------------------------------------------------------------------
# Scaling
# --------------------------------------------------------------------------------------------


def throughput(values: Sequence[Mapping[str, Any]]) -> float:
    """Whole-job samples/s, as the slowest rank saw it (ranks step together in data parallelism)."""
    return min(v["samples_per_s"] for v in values)


def scaling_checks(
    profile: ProfileModel, step_index: int, runs: Mapping[int, tuple[Sequence[Mapping[str, Any]], str]]
) -> list[Check]:
    """Throughput at each count of the step (info), then the efficiency against ``min_efficiency``.

    ``runs`` maps each count (``from_nodes``, ``to_nodes``) to its ranks' values and where they come
    from (the job, and the test that launched it when another did)."""
    scaling = profile.scaling
    assert scaling is not None, "scaling checks need the profile's scaling: section"
    step = scaling.steps[step_index]
    unit, case = scaling.unit, scaling.case
    rates = {n: throughput(values) for n, (values, _) in runs.items()}
    out = [
        Check(
            "scaling.samples_per_s",
            rates[n],
            "samples/s",
            labels={"case": case, unit: n},
            hint=f"{len(values)} ranks, {origin}",
        )
        for n, (values, origin) in runs.items()
    ]
    base, top = step.from_nodes, step.to_nodes
    note = f" Threshold: {scaling.source}." if scaling.source else ""
    out.append(
        Check(
            "scaling.efficiency",
            scaling_efficiency(rates[top], top, rates[base], base),
            "fraction",
            step.min_efficiency,
            ">=",
            ThresholdRef(profile.name, ("scaling", "steps", step_index, "min_efficiency")),
            labels={"case": case, "unit": unit, "from": base, "to": top},
            hint=f"throughput({top} {unit}) = {rates[top]:.4g} samples/s against {top / base:g} x "
            f"throughput({base} {unit}) = {rates[base]:.4g} samples/s. Next: test_sft's step time at each "
            f"size, and the collectives tests across the {unit} added (gradients cross them every step).{note}",
        )
    )
    return out
