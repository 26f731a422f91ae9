"""Supervised fine-tuning trains as fast as the profile says: step time, throughput, MFU, memory,
GPU utilisation and a loss that goes down, for every SFT case of the profile.

The cluster exists to train, and teams judge it the way the seeds do: a Llama model fine-tuned
on Alpaca data under DeepSpeed ZeRO, seconds per step, samples/s, tokens/s per GPU, MFU and the
memory each GPU holds. Each case of the profile's ``sft: cases:`` is one test (``test_sft[NAME]``):

- launched (the default): ``workloads/sft.py`` trains the case on ``case.nodes`` nodes with random
  weights (no download) for ``warmup_steps + steps`` optimizer steps; every measurement is recorded
  against its threshold (``checks/sft.py`` has the table), all misses reported together. A case
  needing more nodes than the cluster has skips saying so; on a cuda profile, a machine without
  CUDA skips.
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

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.sft import launched_checks, log_checks
from pytest_gpucluster.errors import GpuClusterError, GpuClusterWarning
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.inputs import expand
from pytest_gpucluster.parsers.train_log import parse_train_log
from pytest_gpucluster.plans.deadlines import sft_deadline, sft_estimate
from pytest_gpucluster.plans.sft import case_ranks_per_node, find_case, parse_log_argument, sft_part
from pytest_gpucluster.session import GpuClusterSession, get_session


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


def _recorded(argument: str, root: Path) -> list[RecordedLog]:
    """Every file one --train-log value names (in order), or one entry saying why it names none."""
    try:
        return [
            RecordedLog(argument, p)
            for p in expand("--train-log", parse_log_argument(argument).pattern, root)
        ]
    except GpuClusterError as exc:
        return [RecordedLog(argument, None, str(exc))]


def _launched(index: int, case: Any, profile: Any) -> Any:
    needs: dict[str, Any] = {"min_nodes": case.nodes}
    if profile.cluster.device == "cuda":
        needs |= {"min_gpus_per_node": case.ranks_per_node or 0, "needs": ["cuda"]}
    return pytest.param(LaunchedCase(index), id=case.name, marks=pytest.mark.gpucluster(**needs))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sft_subject" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    profile = session.profile.model
    if session.settings.train_log:
        root = Path(metafunc.config.invocation_params.dir)
        logs = [log for argument in session.settings.train_log for log in _recorded(argument, root)]
        params = [pytest.param(log, id=f"log-{log.path.name if log.path else log.argument}") for log in logs]
    elif profile.sft.cases:
        params = [_launched(index, case, profile) for index, case in enumerate(profile.sft.cases)]
    else:
        reason = f"profile {profile.name} has no sft: cases, so there is no training to measure"
        params = [pytest.param(None, id="no-cases", marks=pytest.mark.skip(reason=reason))]
    metafunc.parametrize("sft_subject", params)


@job_part
def sft_run(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """The launched case trained on its nodes (None for a recorded log: nothing to launch)."""
    subject = params.get("sft_subject")
    if not isinstance(subject, LaunchedCase):
        return None
    profile = session.profile.model
    case = profile.sft.cases[subject.index]
    nproc = case_ranks_per_node(case, session.ranks_per_node)
    deadline = sft_deadline(case, profile, nodes=case.nodes, settings=session.settings)
    return sft_part(
        case,
        profile,
        nodes=case.nodes,
        nproc_per_node=nproc,
        timeout_s=deadline.seconds,
        deadline=deadline.text,
        estimate_s=sft_estimate(case, profile, nodes=case.nodes),
    )


def test_sft(
    sft_subject: LaunchedCase | RecordedLog, sft_run: PartRun | None, hw: Any, results: Any, rerun_part: Any
) -> None:
    """One SFT case of the profile, trained here, or one training log, against the case's thresholds.
    With ``--baseline``, a suspected regression trains the case once more before it fails."""
    if isinstance(sft_subject, RecordedLog):
        _check_log(sft_subject, hw, results)
        return
    assert sft_run is not None
    index = sft_subject.index

    def checks_of(run: PartRun) -> Any:
        return launched_checks(hw.sft.cases[index], index, hw, run.values, run.origin)

    results.check_all(checks_of(sft_run), remeasure=lambda _: checks_of(rerun_part(sft_run.part)))


def _check_log(log: RecordedLog, hw: Any, results: Any) -> None:
    if log.path is None:
        pytest.fail(log.problem or f"--train-log {log.argument}: nothing to read", pytrace=False)
    try:
        index, case = find_case(hw, parse_log_argument(log.argument).case)
        parsed = parse_train_log(log.path.read_text(encoding="utf-8", errors="replace"), str(log.path))
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    checks, unchecked = log_checks(case, index, hw, parsed, log.path.name)
    if unchecked:
        not_checked = (
            f"--train-log {log.path.name} against sft case {case.name} of profile {hw.name}: not checked: "
        )
        warnings.warn(GpuClusterWarning(not_checked + "; ".join(unchecked)), stacklevel=1)
    results.check_all(checks)
    if not any(c.threshold is not None and c.metric != "sft.loss_finite" for c in checks):
        pytest.fail(
            f"--train-log {log.path}: the log answers none of sft case {case.name}'s thresholds "
            f"({'; '.join(unchecked) or 'the case sets none a log can answer'}). Gate it against another "
            f"case with case=NAME: before the path.",
            pytrace=False,
        )
