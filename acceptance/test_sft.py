"""Supervised fine-tuning trains as fast as the profile says: step time, throughput, MFU, memory,
GPU utilisation and a loss that goes down, for every SFT case of the profile.

The cluster exists to train, and teams judge it the way the seeds do: a Llama model fine-tuned
on Alpaca data under DeepSpeed ZeRO, seconds per step, samples/s, tokens/s per GPU, MFU and the
memory each GPU holds. Each case of the profile's ``sft: cases:`` is one test (``test_sft[NAME]``):

- launched (the default): ``workloads/sft.py`` trains the case on ``case.nodes`` nodes with random
  weights (no download) for ``warmup_steps + steps`` optimizer steps; every measurement is recorded
  against its threshold (see ``pytest_gpucluster/sft_cases.py`` for the table), all misses are
  reported together. A case needing more nodes than the cluster has skips saying so; on a cuda
  profile, a machine without CUDA skips.
- recorded (``--train-log PATH``, repeatable, globs): the log of a training job that already ran
  (HF Trainer, DeepSpeed, Megatron console output) is gated instead of launching: ``max_step_time``
  against the progress bar's s/it, ``min_samples_per_s`` against ``train_samples_per_second``,
  ``max_peak_memory`` against the largest memory figure DeepSpeed or torch printed, and the loss
  must be finite. A log is checked against the case named by a ``case=NAME:`` prefix of the
  argument (``--train-log case=llama-13b-zero2-8gpu:logs/rank0.log``), else against the profile's
  first case. Thresholds a log cannot answer (MFU, tokens/s/GPU, GPU utilisation) or does not
  (no memory lines) are listed in a warning; a log that answers none of the case's thresholds fails.

``test_scaling.py`` reuses a launched case's run where it needs the same case at the same size.
"""

from __future__ import annotations

import glob
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_gpucluster.checks.sft import (
    case_ranks_per_node,
    find_case,
    gate,
    launched_checks,
    log_checks,
    parse_log_argument,
    run_case,
)
from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.parsers.train_log import parse_train_log
from pytest_gpucluster.plugin import get_session

RUNS_KEY = "sft.runs"
"""Where launched runs are kept in the session (``gpucluster_session.extra``) for test_scaling."""


@dataclass(frozen=True)
class LaunchedCase:
    index: int


@dataclass(frozen=True)
class RecordedLog:
    argument: str
    """The --train-log value as given."""
    path: Path | None
    """One file it names; None when it names none (the test fails saying so)."""
    problem: str | None = None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sft_subject" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    profile = session.profile.model
    arguments = session.settings["gpucluster_train_log"]
    if arguments:
        root = Path(metafunc.config.invocation_params.dir)
        params = [
            pytest.param(log, id=f"log-{log.path.name if log.path else log.argument}")
            for argument in arguments
            for log in _expand(argument, root)
        ]
    elif profile.sft.cases:
        params = [_case_param(index, case, profile) for index, case in enumerate(profile.sft.cases)]
    else:
        reason = f"profile {profile.name} has no sft: cases, so there is no training to measure"
        params = [pytest.param(None, id="no-cases", marks=pytest.mark.skip(reason=reason))]
    metafunc.parametrize("sft_subject", params)


def _case_param(index: int, case, profile) -> object:
    if profile.cluster.device == "cuda":
        mark = pytest.mark.gpucluster(
            min_nodes=case.nodes, min_gpus_per_node=case.ranks_per_node or 0, needs=["cuda"]
        )
    else:
        mark = pytest.mark.gpucluster(min_nodes=case.nodes)
    return pytest.param(LaunchedCase(index), id=case.name, marks=mark)


def _expand(argument: str, root: Path) -> list[RecordedLog]:
    """Every file one --train-log value names (in order), or one entry saying why it names none."""
    try:
        pattern = parse_log_argument(argument).pattern
    except GpuClusterError as exc:
        return [RecordedLog(argument, None, str(exc))]
    path = Path(pattern).expanduser()
    if any(c in pattern for c in "*?["):
        matches = sorted(glob.glob(str(path), root_dir=root, recursive=True))
        if not matches:
            return [
                RecordedLog(argument, None, f"--train-log {argument}: no file matches (looked from {root})")
            ]
        return [RecordedLog(argument, root / m) for m in matches]
    if not (root / path).is_file():
        return [RecordedLog(argument, None, f"--train-log {argument}: no such file (looked from {root})")]
    return [RecordedLog(argument, root / path)]


def test_sft(sft_subject, hw, gpucluster_session, request, results) -> None:
    """One SFT case of the profile, trained here, or one training log, against the case's thresholds."""
    if isinstance(sft_subject, RecordedLog):
        _gate_log(sft_subject, hw, results)
        return
    case = hw.sft.cases[sft_subject.index]
    try:
        run = run_case(
            request.getfixturevalue("cluster"),  # not built for --train-log runs
            gpucluster_session.extra.setdefault(RUNS_KEY, {}),
            case,
            hw,
            nodes=case.nodes,
            nproc_per_node=case_ranks_per_node(case, gpucluster_session.ranks_per_node),
            timeout=gpucluster_session.settings["gpucluster_job_timeout"],
            test_id=request.node.nodeid,
        )
    except JobSkipped as exc:
        pytest.skip(str(exc))
    checks, unmeasured = launched_checks(case, sft_subject.index, hw, run.values)
    gate(results, checks, [f"{line} (job dir {run.job_dir})" for line in unmeasured])


def _gate_log(log: RecordedLog, hw, results) -> None:
    if log.path is None:
        pytest.fail(log.problem or f"--train-log {log.argument}: nothing to read", pytrace=False)
    try:
        index, case = find_case(hw, parse_log_argument(log.argument).case)
        parsed = parse_train_log(log.path.read_text(encoding="utf-8", errors="replace"), str(log.path))
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    checks, unchecked = log_checks(case, index, hw, parsed, log.path.name)
    gated = [c for c in checks if c.threshold is not None and c.metric != "sft.loss_finite"]
    if unchecked:
        warnings.warn(
            GpuClusterWarning(
                f"--train-log {log.path.name} against sft case {case.name} of profile {hw.name}: not checked: "
                + "; ".join(unchecked)
            ),
            stacklevel=1,
        )
    problems = []
    if not gated:
        problems.append(
            f"--train-log {log.path}: the log answers none of sft case {case.name}'s thresholds "
            f"({'; '.join(unchecked) or 'the case sets none a log can answer'}). Gate it against another "
            f"case with case=NAME: before the path."
        )
    gate(results, checks, problems)
