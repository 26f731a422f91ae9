"""Training logs from HF Trainer, DeepSpeed and Megatron-LM: summary, speed, loss curve, peak memory.

Reads what these tools print to the console, as captured in a job log:

- HF Trainer: python-dict lines ``{'loss': 1.4187, 'learning_rate': 2e-05, 'epoch': 0.12}``, the
  final ``{'train_runtime': ..., 'train_samples_per_second': ...}`` dict, and the
  ``***** train metrics *****`` block;
- tqdm bars ``100%|███| 800/800 [1:33:26<00:00,  7.01s/it]`` (or ``it/s``), also when a bar is
  glued to the next log line or redrawn with carriage returns;
- DeepSpeed: ``step=10, skipped=0, lr=[...]``, the timer line (``RunningAvgSamplesPerSec=``,
  ``MaxMemAllocated=..GB``) and ``see_memory_usage`` (``MA .. GB  Max_MA .. GB  CA .. GB  Max_CA .. GB``);
- Megatron-LM / Megatron-DeepSpeed: ``iteration N/ M | ... | elapsed time per iteration (ms): ..
  | learning rate: .. | lm loss: .. |`` and ``memory (MB) | allocated: .. | max allocated: ..``.

When lines carry a launcher's rank label (``srun --label``'s ``3: ``, torchrun's ``[rank3]:``),
only the lowest rank is read. DeepSpeed's "GB" is bytes / 1024**3, so it is taken as GiB.
Pure: text in, dataclasses out; standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.errors import ParseError

__all__ = ["TrainLog", "TrainStep", "TrainSummary", "parse_train_log", "to_json"]


@dataclass(frozen=True, slots=True)
class TrainSummary:
    """HF Trainer's end-of-training numbers; None where the log does not give them."""

    train_runtime_s: float | None = None
    train_samples_per_second: float | None = None
    """From HF's summary; failing that, DeepSpeed's last (RunningAvg)SamplesPerSec."""
    train_steps_per_second: float | None = None
    train_loss: float | None = None


@dataclass(frozen=True, slots=True)
class TrainStep:
    step: int
    """The step the log names (Megatron iteration, DeepSpeed step=); for HF dicts without a
    ``step`` key, the dict's 1-based order of appearance."""
    loss: float | None
    learning_rate: float | None


@dataclass(frozen=True, slots=True)
class TrainLog:
    summary: TrainSummary
    s_per_it: float | None
    """Seconds per iteration: the training progress bar's last rate (it/s inverted), or
    Megatron's last ``elapsed time per iteration``."""
    steps: tuple[TrainStep, ...]
    """From one source, the first present of: HF loss dicts, Megatron iterations, DeepSpeed steps."""
    peak_memory_gib: float | None
    """Largest GPU memory figure DeepSpeed or torch reported (allocated or reserved), in GiB."""
    formats: tuple[str, ...]
    """What was recognised: any of "hf_trainer", "tqdm", "deepspeed", "megatron"."""


_RANK_LABEL = re.compile(r"\s*(?:(\d+): |\[(?:rank|default)(\d+)\]:)")
_N = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

_HF_DICT = re.compile(r"\{'[^{}]*\}")
_HF_ITEM = re.compile(r"'([^']+)':\s*('[^']*'|[^,}]+)")
_HF_METRIC = re.compile(
    r"\s*(train_runtime|train_samples_per_second|train_steps_per_second|train_loss)\s*=\s*(\S+)\s*$"
)
_HF_TOTAL_STEPS = re.compile(r"Total optimization steps = ([\d,]+)")
_BAR = re.compile(r"\d+%\|[^|\n]*\|\s*\d+/(\d+)\s*\[[^\]\[<]*<[^\],]*,\s*(\?|" + _N + r")\s*(s/it|it/s)")

_DS_STEP = re.compile(r"\bstep=(\d+), skipped=\d+, lr=\[([^\]]*)\]")
_DS_SPEED = re.compile(r"(?:\bRunningAvgSamplesPerSec|(?<![A-Za-z])SamplesPerSec)=(" + _N + ")")
_DS_TIMER_MEM = re.compile(r"\b(?:Max)?MemAllocated=(" + _N + r")GB")
_DS_SEE_MEM = re.compile(rf"\bMA ({_N}) GB\s+Max_MA ({_N}) GB\s+CA ({_N}) GB\s+Max_CA ({_N}) GB")

_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|(.*)")
_MEGATRON_MEM = re.compile(
    rf"memory \(MB\) \| allocated: ({_N}) \| max allocated: ({_N}) \| "
    rf"reserved: ({_N}) \| max reserved: ({_N})"
)


def _float(text: str) -> float | None:
    try:
        return float(text.strip().strip("'"))
    except ValueError:
        return None


def _lines(text: str) -> list[str]:
    """Split at newlines and carriage returns; keep unlabelled lines and the lowest rank's."""
    labelled: list[tuple[int | None, str]] = []
    for raw in re.split(r"\r\n|\r|\n", text):
        match = _RANK_LABEL.match(raw)
        if match:
            labelled.append((int(match.group(1) or match.group(2)), raw[match.end() :]))
        else:
            labelled.append((None, raw))
    ranks = {rank for rank, _ in labelled if rank is not None}
    keep = min(ranks) if ranks else None
    return [line for rank, line in labelled if rank is None or rank == keep]


def _hf_dict(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in _HF_ITEM.findall(text):
        number = _float(raw)
        values[key] = number if number is not None else raw.strip().strip("'")
    return values


def _runtime_seconds(text: str) -> float | None:
    """HF's metrics block prints runtime as ``8:39:34.04``; a plain number is seconds."""
    parts = text.split(":")
    numbers = [_float(part) for part in parts]
    if len(parts) > 3 or any(n is None for n in numbers):
        return None
    seconds = 0.0
    for n in numbers:
        seconds = seconds * 60 + n  # type: ignore[operator]
    return seconds


def _megatron_fields(rest: str) -> dict[str, float]:
    fields: dict[str, float] = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(":")
        number = _float(value) if sep else None
        if number is not None:
            fields[key.strip()] = number
    return fields


class _Collector:
    """Walks the lines once, keeping every kind of figure; `result` then picks among them."""

    def __init__(self) -> None:
        self.formats: dict[str, None] = {}  # ordered set
        self.hf_steps: list[TrainStep] = []
        self.hf_summary: dict[str, Any] | None = None
        self.hf_metrics: dict[str, float] = {}
        self.total_steps: int | None = None
        self.bars: list[tuple[int, float]] = []  # (bar total, seconds per iteration)
        self.ds_steps: list[TrainStep] = []
        self.ds_speed: float | None = None
        self.megatron_steps: list[TrainStep] = []
        self.megatron_s_per_it: float | None = None
        self.memory_gib: list[float] = []

    def line(self, line: str) -> None:
        if "{'" in line:
            self._hf_dicts(line)
        if "=" in line:
            self._hf_metric(line)
            self._deepspeed(line)
        if "%|" in line:
            self._bars(line)
        if "iteration" in line or "memory (MB)" in line:
            self._megatron(line)
        if " GB " in line:
            for figures in _DS_SEE_MEM.findall(line):
                self.memory_gib.extend(float(f) for f in figures)
                self.formats["deepspeed"] = None

    def _hf_dicts(self, line: str) -> None:
        for match in _HF_DICT.finditer(line):
            values = _hf_dict(match.group())
            if "train_runtime" in values:
                self.hf_summary = values
            elif isinstance(values.get("loss"), float):
                step = values.get("step", values.get("global_step"))
                lr = values.get("learning_rate", values.get("lr"))
                self.hf_steps.append(
                    TrainStep(
                        step=int(step) if isinstance(step, float) else len(self.hf_steps) + 1,
                        loss=values["loss"],
                        learning_rate=lr if isinstance(lr, float) else None,
                    )
                )
            else:
                continue
            self.formats["hf_trainer"] = None

    def _hf_metric(self, line: str) -> None:
        total = _HF_TOTAL_STEPS.search(line)
        if total:
            self.total_steps = int(total.group(1).replace(",", ""))
        match = _HF_METRIC.match(line)
        if match:
            key, raw = match.groups()
            value = _runtime_seconds(raw) if key == "train_runtime" else _float(raw)
            if value is not None:
                self.hf_metrics[key] = value
                self.formats["hf_trainer"] = None

    def _bars(self, line: str) -> None:
        for total, rate, unit in _BAR.findall(line):
            value = _float(rate)
            if not value:  # "?it/s" before the first update, or a 0.00 rate
                continue
            self.bars.append((int(total), value if unit == "s/it" else 1.0 / value))
            self.formats["tqdm"] = None

    def _deepspeed(self, line: str) -> None:
        step = _DS_STEP.search(line)
        if step:
            lrs = [_float(x) for x in step.group(2).split(",") if x.strip()]
            self.ds_steps.append(TrainStep(int(step.group(1)), None, lrs[0] if lrs else None))
            self.formats["deepspeed"] = None
        speed = _DS_SPEED.search(line)
        if speed:
            self.ds_speed = float(speed.group(1))
            self.formats["deepspeed"] = None
        memory = _DS_TIMER_MEM.findall(line)
        if memory:
            self.memory_gib.extend(float(m) for m in memory)
            self.formats["deepspeed"] = None

    def _megatron(self, line: str) -> None:
        match = _MEGATRON_ITER.search(line)
        if match:
            fields = _megatron_fields(match.group(2))
            loss = fields.get("lm loss", fields.get("lm_loss"))
            self.megatron_steps.append(TrainStep(int(match.group(1)), loss, fields.get("learning rate")))
            elapsed_ms = fields.get("elapsed time per iteration (ms)")
            if elapsed_ms is not None:
                self.megatron_s_per_it = elapsed_ms / 1000.0
            self.formats["megatron"] = None
        for figures in _MEGATRON_MEM.findall(line):
            self.memory_gib.extend(float(f) / 1024.0 for f in figures)
            self.formats["megatron"] = None

    def s_per_it(self) -> float | None:
        if self.bars:
            totals = {total for total, _ in self.bars}
            # Eval and checkpoint-loading bars share the log; the training bar is the one whose
            # length HF announced, or else the longest.
            train_total = self.total_steps if self.total_steps in totals else max(totals)
            return [rate for total, rate in self.bars if total == train_total][-1]
        return self.megatron_s_per_it

    def summary(self) -> TrainSummary:
        found = dict(self.hf_metrics)
        if self.hf_summary:
            found.update((k, v) for k, v in self.hf_summary.items() if isinstance(v, float))
        samples = found.get("train_samples_per_second", self.ds_speed)
        return TrainSummary(
            train_runtime_s=found.get("train_runtime"),
            train_samples_per_second=samples,
            train_steps_per_second=found.get("train_steps_per_second"),
            train_loss=found.get("train_loss"),
        )

    def result(self) -> TrainLog:
        return TrainLog(
            summary=self.summary(),
            s_per_it=self.s_per_it(),
            steps=tuple(self.hf_steps or self.megatron_steps or self.ds_steps),
            peak_memory_gib=max(self.memory_gib) if self.memory_gib else None,
            formats=tuple(self.formats),
        )


def parse_train_log(text: str, source: str = "<log>") -> TrainLog:
    """Parse a training log; :class:`ParseError` naming ``source`` when nothing is recognised."""
    collector = _Collector()
    for line in _lines(text):
        collector.line(line)
    if not collector.formats:
        raise ParseError(
            f"{source}: no training-log lines recognised. Looked for HF Trainer dicts "
            "({'loss': ...} / {'train_runtime': ...}), tqdm bars (N/M [..., X s/it]), DeepSpeed "
            "lines (step=N, SamplesPerSec=, MA .. GB) and Megatron lines (iteration N/ M | ...). "
            "Is this the rank-0 log of the training job?"
        )
    return collector.result()


def _finite(value: float | None) -> float | None:
    # JSON has no NaN; a NaN loss shows as null (the steps around it still tell the story).
    return value if value is None or math.isfinite(value) else None


def to_json(log: TrainLog) -> dict[str, Any]:
    """Plain JSON for the CLI and results.json."""
    summary = log.summary
    return {
        "summary": {
            "train_runtime_s": _finite(summary.train_runtime_s),
            "train_samples_per_second": _finite(summary.train_samples_per_second),
            "train_steps_per_second": _finite(summary.train_steps_per_second),
            "train_loss": _finite(summary.train_loss),
        },
        "s_per_it": _finite(log.s_per_it),
        "steps": [
            {"step": s.step, "loss": _finite(s.loss), "learning_rate": _finite(s.learning_rate)}
            for s in log.steps
        ],
        "peak_memory_gib": _finite(log.peak_memory_gib),
        "formats": list(log.formats),
    }
