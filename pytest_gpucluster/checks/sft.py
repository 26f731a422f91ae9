"""The parent side of SFT acceptance: a profile's SFT case becomes workload options, and what the
ranks (or a training log) measured becomes the checks ``results.check`` records.

Used by ``acceptance/test_sft.py`` and ``acceptance/test_scaling.py``. Pure: no pytest, no torch;
the rank side is ``workloads/sft.py``. Every check names the profile key it gates
(``profile NAME: sft.cases[0].max_step_time``), so ``gpucluster profiles derive`` maps it back.

What is gated, per case:

=========================== ====================== =============================================
metric                      threshold              value
=========================== ====================== =============================================
``sft.step_time``           ``max_step_time``      median optimizer-step time of the slowest rank
``sft.samples_per_s``       ``min_samples_per_s``  whole job, from that slowest median
``sft.tokens_per_s_per_gpu`` ``min_tokens_per_s_per_gpu`` the slowest rank's processed tokens/s
``sft.mfu``                 ``min_mfu``            the slowest rank's MFU (needs cluster.peak_flops)
``sft.peak_memory``         ``max_peak_memory``    per rank (labels rank, host): CUDA max reserved,
                                                   or the process's max resident set on CPU
``sft.gpu_util``            ``min_gpu_util``       per rank, mean NVML utilisation in the timed steps
``sft.loss_finite``         always                 every step's loss is finite
``sft.loss_decreased``      always (launched runs) the last step's loss is below the first
=========================== ====================== =============================================

A metric whose threshold is unset is still recorded (verdict ``info``) when it was measured.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import ParseError, ProfileError
from pytest_gpucluster.maths.shapes import SHAPES
from pytest_gpucluster.parsers.train_log import TrainLog
from pytest_gpucluster.profiles.schema import ClusterSection, ProfileModel, ScalingSection, SftCase
from pytest_gpucluster.results.model import Spread
from pytest_gpucluster.results.recorder import Recorder, ThresholdFailure

__all__ = [
    "SFT_WORKLOAD",
    "Check",
    "LogArgument",
    "SftRun",
    "case_ranks_per_node",
    "gate",
    "launched_checks",
    "log_checks",
    "parse_log_argument",
    "run_case",
    "scaling_counts",
    "scaling_job",
    "scaling_throughput",
    "workload_options",
]

SFT_WORKLOAD = "pytest_gpucluster.workloads.sft:train"
CASE_PREFIX = "case="
_OFFLOAD = {"none": [], "optimizer": ["optimizer"], "optimizer+params": ["optimizer", "param"]}


@dataclass(frozen=True, slots=True)
class Check:
    """One ``results.check`` call, built here and made in the test."""

    metric: str
    value: float
    threshold: float | None
    unit: str
    comparison: str = ">="
    labels: Mapping[str, Any] = field(default_factory=dict)
    spread: Spread | None = None
    source: str | None = None
    context: str = ""

    def kwargs(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "unit": self.unit,
            "comparison": self.comparison,
            "labels": dict(self.labels),
            "spread": self.spread,
            "source": self.source,
            "context": self.context,
        }


def gate(results: Recorder, checks: Sequence[Check], unmeasured: Sequence[str] = ()) -> None:
    """Record every check, then fail once with all the misses (a run shows the whole damage).

    ``unmeasured`` are thresholds the profile sets that nothing measured: they fail the test too,
    after the measurements are recorded, but as an error of the set-up rather than a slow cluster.
    """
    __tracebackhide__ = True
    failures = []
    for check in checks:
        try:
            results.check(**check.kwargs())
        except ThresholdFailure as exc:
            failures.append(str(exc))
    if failures:
        raise ThresholdFailure("\n".join([*failures, *unmeasured]))
    if unmeasured:
        raise AssertionError("\n".join(unmeasured))


# --------------------------------------------------------------------------------------------
# Case -> job
# --------------------------------------------------------------------------------------------


def _model_option(case: SftCase) -> dict[str, str]:
    key = case.model.strip().lower().replace("_", "-")
    if key in SHAPES:
        return {"model": key}
    if os.sep in case.model or "/" in case.model or case.model.startswith(("~", ".")):
        return {"model_path": os.path.expanduser(case.model)}
    raise ProfileError(
        f"sft case {case.name!r}: model {case.model!r} is neither a named shape ({', '.join(SHAPES)}) "
        "nor a path to a local checkpoint directory (write it with a '/')"
    )


def workload_options(case: SftCase, cluster: ClusterSection) -> dict[str, Any]:
    """The ``workloads/sft.py`` options for ``case`` (``SFTOptions`` field names).

    MFU's denominator is ``cluster.peak_flops`` (the dense BF16/FP16 peak): with ``precision: fp32``
    on a GPU the MFU reads low against it, which is the point of a BF16 peak.
    """
    options: dict[str, Any] = {
        **_model_option(case),
        "zero_stage": case.zero_stage,
        "offload": _OFFLOAD[case.offload],
        "precision": case.precision,
        "micro_batch": case.micro_batch,
        "grad_accum": case.grad_accum,
        "gradient_checkpointing": case.gradient_checkpointing,
        "seq_len": case.seq_len,
        "steps": case.steps,
        "warmup_steps": case.warmup_steps,
        "extra": {"case": case.name},
    }
    if case.attn_implementation is not None:
        options["attn_implementation"] = case.attn_implementation
    if cluster.peak_flops is not None:
        options["peak_flops"] = cluster.peak_flops
    return options


def case_ranks_per_node(case: SftCase, session_ranks_per_node: int) -> int:
    """The case's own ``ranks_per_node``, else the session's (``--nproc-per-node`` or the profile's)."""
    return case.ranks_per_node or session_ranks_per_node


@dataclass(frozen=True, slots=True)
class SftRun:
    """One launched case: every rank's ``train`` result and where the job ran."""

    values: tuple[dict[str, Any], ...]
    job_dir: Path
    nodes: int
    nproc_per_node: int
    test_id: str
    """The test that launched it (a later test reusing the run says so)."""


def run_case(
    cluster: Any,
    cache: MutableMapping[tuple[str, int, int], SftRun],
    case: SftCase,
    profile: ProfileModel,
    *,
    nodes: int,
    nproc_per_node: int,
    timeout: float,
    test_id: str,
) -> SftRun:
    """Launch ``case`` on ``nodes`` x ``nproc_per_node`` ranks, or return the run of the same case
    and shape this session already made (test_scaling reuses test_sft's run at the case's own size:
    one launch fewer, and the same numbers in both reports).

    Raises what ``JobResult.values`` raises: ``JobFailed`` (every rank's story) or ``JobSkipped``.
    """
    key = (case.name, nodes, nproc_per_node)
    if key in cache:
        return cache[key]
    job = cluster.run(
        SFT_WORKLOAD,
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        timeout=timeout,
        options=workload_options(case, profile.cluster),
        name=f"sft-{case.name}-{nodes}x{nproc_per_node}",
    )
    run = SftRun(tuple(job.values), Path(job.job_dir), nodes, nproc_per_node, test_id)
    cache[key] = run
    return run


# --------------------------------------------------------------------------------------------
# Launched runs -> checks
# --------------------------------------------------------------------------------------------


def _source(profile: str, index: int, key: str, case: SftCase) -> str:
    where = f"profile {profile}: sft.cases[{index}].{key}"
    return f"{where} ({case.source})" if case.source else where


def _spread(values: Sequence[float]) -> Spread:
    median = statistics.median(values)
    return Spread(
        median=median,
        min=min(values),
        max=max(values),
        mad=statistics.median(abs(v - median) for v in values),
        n=len(values),
        values=tuple(values),
    )


def _memory_context(kind: str) -> str:
    if kind == "cpu_max_rss":
        what = "the rank process's peak resident set (getrusage ru_maxrss), as this CPU rank trains"
    else:
        what = "torch.cuda.max_memory_reserved on the rank's GPU (allocated plus the caching allocator's reserve)"
    return (
        f"Peak memory is {what}. Next: compare the rank with the others (a rank far above them holds "
        "something extra), and the case's micro_batch, seq_len, zero_stage and gradient_checkpointing "
        "with the job the threshold came from."
    )


def launched_checks(
    case: SftCase, index: int, profile: ProfileModel, values: Sequence[Mapping[str, Any]]
) -> tuple[list[Check], list[str]]:
    """The checks for one launched case (every rank's ``train`` result), and the thresholds set
    in the profile that the run could not measure, each as a sentence."""
    name = profile.name
    world = len(values)
    base = {"case": case.name}
    slowest = max(values, key=lambda v: v["step_time_median_s"])
    where = (
        f"rank {slowest['rank']} on {slowest['host']} was the slowest; {world} ranks, "
        f"{slowest['model']} ({slowest['params'] / 1e6:.3g}M parameters), ZeRO-{case.zero_stage}, "
        f"{slowest['options']['precision']}, micro-batch {case.micro_batch} x {case.grad_accum} accumulation "
        f"x {case.seq_len} tokens"
    )
    cpu_note = (
        f"; it spent {slowest['step_process_cpu_median_s']:.3g} s of CPU per step"
        if slowest.get("step_process_cpu_median_s") is not None and slowest.get("cpu_threads")
        else ""
    )
    speed_context = (
        f"{where}{cpu_note}. Next: the rank logs in the job directory (a rank far slower than the "
        "others points at its node), then the collectives tests for the network."
    )
    checks = [
        Check(
            "sft.step_time",
            slowest["step_time_median_s"],
            case.max_step_time,
            "s",
            "<=",
            base,
            _spread(slowest["step_times_s"]),
            _source(name, index, "max_step_time", case),
            speed_context,
        ),
        Check(
            "sft.samples_per_s",
            min(v["samples_per_s"] for v in values),
            case.min_samples_per_s,
            "samples/s",
            ">=",
            base,
            None,
            _source(name, index, "min_samples_per_s", case),
            speed_context,
        ),
        Check(
            "sft.tokens_per_s_per_gpu",
            min(v["tokens_per_s_per_device"] for v in values),
            case.min_tokens_per_s_per_gpu,
            "tokens/s",
            ">=",
            base,
            None,
            _source(name, index, "min_tokens_per_s_per_gpu", case),
            f"Processed tokens (padding included) per second per device. {speed_context}",
        ),
    ]
    unmeasured: list[str] = []
    mfus = [v["mfu"] for v in values if v.get("mfu") is not None]
    if len(mfus) == world:
        checks.append(
            Check(
                "sft.mfu",
                min(mfus),
                case.min_mfu,
                "fraction",
                ">=",
                base,
                None,
                _source(name, index, "min_mfu", case),
                f"PaLM MFU against cluster.peak_flops = {slowest['peak_flops']:.4g} FLOP/s per device. "
                f"{speed_context}",
            )
        )
    elif case.min_mfu is not None:
        reason = next((v.get("mfu_reason") for v in values if v.get("mfu") is None), None)
        unmeasured.append(
            f"sft.mfu (case={case.name}): profile {name} sets sft.cases[{index}].min_mfu but MFU was not "
            f"measured: {reason or 'no rank reported it'}. Set cluster.peak_flops in the profile."
        )
    for v in values:
        rank_labels = {**base, "rank": v["rank"], "host": v["host"]}
        checks.append(
            Check(
                "sft.peak_memory",
                v["peak_memory_bytes"],
                case.max_peak_memory,
                "B",
                "<=",
                rank_labels,
                None,
                _source(name, index, "max_peak_memory", case),
                _memory_context(v["peak_memory_kind"]),
            )
        )
    for v in values:
        util = v.get("gpu_util_pct")
        if util is not None:
            checks.append(
                Check(
                    "sft.gpu_util",
                    util["mean"] / 100.0,
                    case.min_gpu_util,
                    "fraction",
                    ">=",
                    {**base, "rank": v["rank"], "host": v["host"]},
                    None,
                    _source(name, index, "min_gpu_util", case),
                    f"Mean of {util['samples']} NVML samples every {util['interval_s']} s during the timed "
                    f"steps (min {util['min']:.0f}%, max {util['max']:.0f}%). A GPU waiting for data, "
                    "the host or its peers shows low utilisation.",
                )
            )
        elif case.min_gpu_util is not None:
            unmeasured.append(
                f"sft.gpu_util (case={case.name}, rank={v['rank']}, host={v['host']}): profile {name} sets "
                f"sft.cases[{index}].min_gpu_util but utilisation was {v.get('gpu_util_reason')}."
            )
    losses = values[0]["losses"]  # all-reduced across ranks: every rank holds the job's mean
    shown = " ".join(f"{x:.3g}" for x in losses)
    checks.append(
        Check(
            "sft.loss_finite",
            float(all(math.isfinite(x) for x in losses)),
            1.0,
            "bool",
            "==",
            base,
            context=f"Loss per step (mean over ranks): {shown}. A NaN or inf loss: an fp16 overflow, a "
            "bad learning rate, or a rank computing garbage (check its GPU for Xid errors).",
        )
    )
    checks.append(
        Check(
            "sft.loss_decreased",
            float(losses[-1] < losses[0]),
            1.0,
            "bool",
            "==",
            base,
            context=f"Loss per step (mean over ranks): {shown}. Training from random weights on the same "
            "data must lower the loss; if it does not, gradients are not reaching the optimizer "
            "(or ranks disagree on the model).",
        )
    )
    return checks, unmeasured


# --------------------------------------------------------------------------------------------
# Training logs -> checks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogArgument:
    """One ``--train-log`` value: an optional ``case=NAME:`` prefix, then a path or glob."""

    case: str | None
    pattern: str


def parse_log_argument(argument: str) -> LogArgument:
    """``case=llama-13b-zero2-8gpu:logs/*.log`` -> case and pattern; without the prefix, no case."""
    if argument.startswith(CASE_PREFIX):
        name, sep, pattern = argument[len(CASE_PREFIX) :].partition(":")
        if not sep or not name.strip() or not pattern.strip():
            raise ParseError(
                f"--train-log {argument}: expected case=NAME:PATH (the case name, a colon, then the log path)"
            )
        return LogArgument(name.strip(), pattern.strip())
    return LogArgument(None, argument)


def find_case(profile: ProfileModel, name: str | None) -> tuple[int, SftCase]:
    """The case named ``name`` (the first case when None); ProfileError lists the names."""
    cases = profile.sft.cases
    if not cases:
        raise ProfileError(f"profile {profile.name} has no sft: cases to gate a training log against")
    if name is None:
        return 0, cases[0]
    for index, case in enumerate(cases):
        if case.name == name:
            return index, case
    raise ProfileError(
        f"--train-log case={name}: profile {profile.name} has no sft case of that name "
        f"(its cases: {', '.join(c.name for c in cases)})"
    )


def log_checks(
    case: SftCase, index: int, profile: ProfileModel, log: TrainLog, log_name: str
) -> tuple[list[Check], list[str]]:
    """Checks of the case's thresholds that a training log can answer, and a sentence for each
    threshold it leaves unchecked (the log does not say, or no log can say)."""
    name = profile.name
    base = {"case": case.name, "log": log_name}
    found = f"read from {log_name} ({', '.join(log.formats)})"
    checks: list[Check] = []
    unchecked: list[str] = []

    def gated(metric: str, value: float | None, key: str, unit: str, comparison: str, what: str) -> None:
        threshold = getattr(case, key)
        if value is not None:
            source = _source(name, index, key, case)
            checks.append(
                Check(metric, value, threshold, unit, comparison, base, None, source, f"{what}, {found}.")
            )
        elif threshold is not None:
            unchecked.append(f"{key}: the log has no {what.split(' (')[0]}")

    gated(
        "sft.step_time",
        log.s_per_it,
        "max_step_time",
        "s",
        "<=",
        "Seconds per iteration (the training progress bar's last rate, or Megatron's elapsed time per iteration)",
    )
    gated(
        "sft.samples_per_s",
        log.summary.train_samples_per_second,
        "min_samples_per_s",
        "samples/s",
        ">=",
        "train_samples_per_second (HF Trainer's summary, or DeepSpeed's SamplesPerSec)",
    )
    memory = None if log.peak_memory_gib is None else log.peak_memory_gib * 2**30
    gated(
        "sft.peak_memory",
        memory,
        "max_peak_memory",
        "B",
        "<=",
        "peak GPU memory (the largest figure DeepSpeed or torch printed, allocated or reserved, lowest rank)",
    )
    for key in ("min_tokens_per_s_per_gpu", "min_mfu", "min_gpu_util"):
        if getattr(case, key) is not None:
            unchecked.append(f"{key}: not answerable from a training log (launch the case to measure it)")
    losses = [s.loss for s in log.steps if s.loss is not None]
    if log.summary.train_loss is not None:
        losses.append(log.summary.train_loss)
    if losses:
        bad = [x for x in losses if not math.isfinite(x)]
        checks.append(
            Check(
                "sft.loss_finite",
                float(not bad),
                1.0,
                "bool",
                "==",
                base,
                context=f"{len(losses)} loss values {found}; {len(bad)} not finite.",
            )
        )
    return checks, unchecked


# --------------------------------------------------------------------------------------------
# Scaling
# --------------------------------------------------------------------------------------------


def scaling_counts(scaling: ScalingSection) -> tuple[int, ...]:
    """Every node (or rank) count the steps name, ascending: each is measured once."""
    return tuple(sorted({n for s in scaling.steps for n in (s.from_nodes, s.to_nodes)}))


def scaling_job(scaling: ScalingSection, case: SftCase, count: int, ranks_per_node: int) -> tuple[int, int]:
    """``(nodes, nproc_per_node)`` of the job at ``count``: ``count`` nodes of the case's ranks per
    node (unit nodes), or ``count`` ranks on one node (unit ranks)."""
    if scaling.unit == "ranks":
        return 1, count
    return count, case_ranks_per_node(case, ranks_per_node)


def scaling_throughput(values: Sequence[Mapping[str, Any]]) -> float:
    """Whole-job samples/s, as the slowest rank saw it (ranks step together in data parallelism)."""
    return min(v["samples_per_s"] for v in values)
