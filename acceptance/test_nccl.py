"""NCCL used the fabric the profile promises: its network, net plugin, provider, GDR, NVLS and version,
the same on every rank.

The most common silent failure of a new cluster is NCCL falling back to TCP sockets, or running
without its net plugin, or without GPUDirect RDMA: jobs still run, at a fraction of the speed. These
tests read NCCL's own ``NCCL_DEBUG=INFO`` account of what it chose and compare it with the profile's
``nccl:`` section; a failure quotes the log line that contradicts the profile, or says which line
was looked for and not found.

Where the logs come from:

- ``--nccl-log PATH`` (repeatable, globs): logs of a job that already ran, e.g. a training job's
  rank logs. All files are read as one job (several ranks or nodes). Works on any machine.
- otherwise: a short NCCL all_reduce across the profile's nodes (``workloads/nccl_probe.py``), with
  every rank's NCCL log captured in the job directory. Needs CUDA and NCCL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_gpucluster.checks.nccl import (
    agreement_check,
    check_agreement,
    check_expectation,
    error_check,
    expectations_of,
    finding_checks,
)
from pytest_gpucluster.checks.nccl_logs import LogSet, read_logs
from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.fixtures import job_part
from pytest_gpucluster.harness import Part, PartRun
from pytest_gpucluster.inputs import read_texts
from pytest_gpucluster.plans.burnin_deadlines import work_deadline
from pytest_gpucluster.plans.startup import expected_startup_s
from pytest_gpucluster.session import GpuClusterSession, get_session
from pytest_gpucluster.workloads.nccl_probe import DEBUG_ENV

PROBE = "pytest_gpucluster.workloads.nccl_probe:probe"
pytestmark = pytest.mark.quick  # NCCL init: in the quick tier on one node (nccl_probe)
PROBE_TIMEOUT_S = 300.0
"""The fixed timeout the probe had; its derived deadline is never shorter."""
PROBE_WORK_S = 60.0
"""The probe's work as its deadline counts it (deliberately slow)."""
PROBE_EXPECTED_WORK_S = 5.0
"""What the plan counts for the probe's work beyond its start-up: one NCCL communicator (0.2-1.2 s
in the recorded NCCL INFO logs' ``Init timings``, tests/data/nccl_logs) and one short all_reduce."""


@dataclass(frozen=True)
class NcclRun:
    """The logs under test and where they came from (shown in every failure)."""

    logs: LogSet
    origin: str
    nodes: int | None = None  # nodes the probe ran on; None for --nccl-log


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nccl_source" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    if session.settings.nccl_log:
        source = pytest.param("recorded", id="nccl-log")
    else:
        source = pytest.param("launched", id="launched", marks=pytest.mark.gpucluster(needs=["nccl"]))
    metafunc.parametrize("nccl_source", [source], scope="module")
    if "expectation" in metafunc.fixturenames:
        profile = session.profile.model
        reason = (
            f"profile {profile.name} has no nccl: section, so there is nothing to compare the NCCL log with"
            if profile.nccl is None
            else f"profile {profile.name}'s nccl: section sets no expectation"
        )
        skip = pytest.param(None, id="nothing-expected", marks=pytest.mark.skip(reason=reason))
        metafunc.parametrize("expectation", list(expectations_of(profile.nccl)) or [skip])


@job_part
def nccl_probe(session: GpuClusterSession, params: Mapping[str, Any]) -> Part | None:
    """A short NCCL all_reduce on the profile's nodes, every rank's NCCL log in the job directory
    (None with --nccl-log: the logs are given)."""
    if params.get("nccl_source") != "launched":
        return None
    nodes = max(1, min(session.profile.model.cluster.nodes, session.available_nodes))
    if session.tier is not None and session.tier.tier == "quick":
        nodes = 1  # the quick tier sends nothing between nodes: NCCL's start on one node

    # Its work, at least the 300 s it had, plus the rendezvous allowance for its nodes (as sweeps)
    deadline = work_deadline(
        PROBE_WORK_S, "an NCCL init and one short all_reduce", PROBE_TIMEOUT_S, nodes, session.settings
    )
    return Part(
        "nccl-probe", PROBE, {"timeout_s": deadline.seconds}, nodes=nodes, env=DEBUG_ENV,
        timeout_s=deadline.seconds, deadline=deadline.text,
        estimate_s=PROBE_EXPECTED_WORK_S + expected_startup_s(nodes, session.backend),
        startup_s=expected_startup_s(nodes, session.backend),
        init_process_group=False,  # the probe sets NCCL_DEBUG_FILE before NCCL starts
    )  # fmt: skip


@pytest.fixture
def nccl_run(nccl_source: str, nccl_probe: PartRun | None, gpucluster_session: Any, request: Any) -> NcclRun:
    """The logs of the probe, or of --nccl-log, parsed as one job."""
    try:
        if nccl_probe is None:
            patterns = gpucluster_session.settings.nccl_log
            named = read_texts("--nccl-log", patterns, Path(request.config.invocation_params.dir))
            origin, nodes = f"--nccl-log {' '.join(patterns)}", None
        else:
            named, nodes = _probe_logs(nccl_probe), nccl_probe.part.nodes
            origin = f"NCCL probe, {len(named)} ranks on {nodes} node(s), job dir {nccl_probe.job_dir}"
        return NcclRun(read_logs(named), origin, nodes)
    except GpuClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


def _probe_logs(probe: PartRun) -> list[tuple[str, str]]:
    named = []
    for rank, value in enumerate(probe.values):
        path = Path(value["nccl_log"])
        if not path.is_file():
            pytest.fail(
                f"rank {rank} on {value.get('host')} wrote no NCCL log at {path}; the results directory must be "
                "on a filesystem every node sees",
                pytrace=False,
            )
        named.append((os.path.relpath(path), path.read_text(encoding="utf-8", errors="replace")))
    return named


def test_nccl_expectation(nccl_run: NcclRun, expectation: str, hw: Any, results: Any) -> None:
    """One key of the profile's nccl: section against what NCCL said it used."""
    findings = check_expectation(nccl_run.logs.log, hw.nccl, expectation, nccl_run.logs.quote)
    results.check_all(finding_checks(findings, hw.name, nccl_run.origin, nccl_run.nodes))


def test_ranks_agree(nccl_run: NcclRun, results: Any) -> None:
    """Every rank loaded the same NCCL, plugin and network: a plugin on only some nodes hangs or crawls."""
    ranks = len(nccl_run.logs.sources)
    if ranks < 2:
        pytest.skip(f"the logs ({nccl_run.origin}) name {ranks} rank(s): nothing to compare")
    results.check_all([agreement_check(check_agreement(nccl_run.logs), ranks, nccl_run.origin)])


def test_nccl_reported_no_errors(nccl_run: NcclRun, results: Any) -> None:
    """NCCL printed no failure. A failing WARN (verbs call, closed connection, network not found, proxy or
    socket failure, timeout) or a failed-call line fails, quoting the line; benign WARNs do not
    (the rule: ``pytest_gpucluster.parsers.nccl_log.severity``)."""
    results.check_all([error_check(nccl_run.logs, nccl_run.origin)])
