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

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.launch.result import JobSkipped
from pytest_gpucluster.nccl_checks import (
    Finding,
    LogSet,
    check_agreement,
    check_errors,
    check_expectation,
    expectations_of,
    read_logs,
)
from pytest_gpucluster.plugin import get_session
from pytest_gpucluster.workloads.nccl_probe import DEBUG_ENV

PROBE = "pytest_gpucluster.workloads.nccl_probe:probe"
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class NcclRun:
    """The logs under test and where they came from (shown in every failure)."""

    logs: LogSet
    origin: str
    nodes: int | None = None  # nodes the probe ran on; None for --nccl-log


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nccl_run" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    if session.settings["gpucluster_nccl_log"]:
        source = pytest.param("recorded", id="nccl-log")
    else:
        source = pytest.param("launched", id="launched", marks=pytest.mark.gpucluster(needs=["nccl"]))
    metafunc.parametrize("nccl_run", [source], indirect=True, scope="module")
    if "expectation" in metafunc.fixturenames:
        profile = session.profile.model
        names = expectations_of(profile.nccl)
        reason = (
            f"profile {profile.name} has no nccl: section, so there is nothing to compare the NCCL log with"
            if profile.nccl is None
            else f"profile {profile.name}'s nccl: section sets no expectation"
        )
        params = list(names) or [
            pytest.param(None, id="nothing-expected", marks=pytest.mark.skip(reason=reason))
        ]
        metafunc.parametrize("expectation", params)


@pytest.fixture(scope="module")
def nccl_run(request: pytest.FixtureRequest, gpucluster_session, hw) -> NcclRun:
    if request.param == "recorded":
        patterns = gpucluster_session.settings["gpucluster_nccl_log"]
        named = _read_files(patterns, Path(request.config.invocation_params.dir))
        origin, nodes = f"--nccl-log {' '.join(patterns)}", None
    else:
        named, origin, nodes = _launch_probe(request, gpucluster_session, hw)
    try:
        return NcclRun(read_logs(named), origin, nodes)
    except ParseError as exc:
        pytest.fail(f"{exc} (logs from {origin})", pytrace=False)


def _read_files(patterns: tuple[str, ...], root: Path) -> list[tuple[str, str]]:
    """Every file the patterns name, once each, in the order given; a pattern matching nothing fails."""
    named: dict[str, str] = {}
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            matches = sorted(glob.glob(pattern, root_dir=root, recursive=True))
            if not matches:
                pytest.fail(f"--nccl-log {pattern}: no file matches (looked from {root})", pytrace=False)
        else:
            matches = [pattern]
        for match in matches:
            path = root / match
            if not path.is_file():
                pytest.fail(f"--nccl-log {match}: no such file (looked from {root})", pytrace=False)
            named.setdefault(match, path.read_text(encoding="utf-8", errors="replace"))
    return list(named.items())


def _launch_probe(request: pytest.FixtureRequest, session, hw) -> tuple[list[tuple[str, str]], str, int]:
    cluster = request.getfixturevalue("cluster")
    nccl_env = request.getfixturevalue("nccl_env")
    nodes = max(1, min(hw.cluster.nodes, session.available_nodes))
    job = cluster.run(
        PROBE,
        nodes=nodes,
        env={**nccl_env, **DEBUG_ENV},
        timeout=PROBE_TIMEOUT_S,
        options={"timeout_s": PROBE_TIMEOUT_S},
        name="nccl-probe",
        init_process_group=False,  # the probe sets NCCL_DEBUG_FILE before NCCL starts
    )
    try:
        values = job.values  # raises JobFailed (with every rank's story) unless all ranks finished
    except JobSkipped as exc:
        pytest.skip(str(exc))
    named = []
    for rank, value in enumerate(values):
        path = Path(value["nccl_log"])
        if not path.is_file():
            pytest.fail(
                f"rank {rank} on {value.get('host')} wrote no NCCL log at {path}; the results directory must be "
                "on a filesystem every node sees",
                pytrace=False,
            )
        named.append((os.path.relpath(path), path.read_text(encoding="utf-8", errors="replace")))
    origin = f"NCCL probe, {len(values)} ranks on {nodes} node(s), job dir {job.job_dir}"
    return named, origin, nodes


def _context(finding: Finding, run: NcclRun) -> str:
    text = f"{finding.because[0].upper()}{finding.because[1:]} (logs from {run.origin})"
    if finding.hint:
        text += f". Next: {finding.hint}"
    if finding.found is None and run.nodes == 1:
        text += (
            "; the probe ran on 1 node, where NCCL may not need the network at all: pass --hostfile with "
            "2 or more hosts"
        )
    return text


def test_nccl_expectation(nccl_run: NcclRun, expectation: str, hw, results) -> None:
    """One key of the profile's nccl: section against what NCCL said it used."""
    for finding in check_expectation(nccl_run.logs.log, hw.nccl, expectation, nccl_run.logs.quote):
        results.check(
            finding.metric,
            float(finding.ok),
            1.0,
            unit="bool",
            comparison="==",
            labels={"expected": finding.expected, "found": finding.found or "not in the log"},
            source=f"profile {hw.name}: nccl.{finding.expectation}",
            context=_context(finding, nccl_run),
        )


def test_ranks_agree(nccl_run: NcclRun, results) -> None:
    """Every rank loaded the same NCCL, plugin and network: a plugin on only some nodes hangs or crawls."""
    ranks = len(nccl_run.logs.sources)
    if ranks < 2:
        pytest.skip(f"the logs ({nccl_run.origin}) name {ranks} rank(s): nothing to compare")
    findings = check_agreement(nccl_run.logs)
    results.check(
        "nccl.ranks_agree",
        float(not findings),
        1.0,
        unit="bool",
        comparison="==",
        labels={"ranks": ranks, "differ_on": ", ".join(f.expectation for f in findings) or "nothing"},
        context=" ".join(f"{f.message}." for f in findings) + f" (logs from {nccl_run.origin})",
    )


def test_nccl_reported_no_errors(nccl_run: NcclRun, results) -> None:
    """NCCL printed no failure. A failing WARN (verbs call, closed connection, network not found, proxy or
    socket failure, timeout) or a failed-call line fails, quoting the line; benign WARNs do not
    (the rule: ``pytest_gpucluster.parsers.nccl_log.severity``)."""
    finding = check_errors(nccl_run.logs)
    results.check(
        "nccl.errors",
        float(len(nccl_run.logs.log.errors)),
        0.0,
        unit="lines",
        comparison="<=",
        labels={"found": finding.found or "none"},
        context=f"{finding.message} (logs from {nccl_run.origin})",
    )
