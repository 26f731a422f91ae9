"""The session's start, as one straight line of stages, each a function of the previous one's value:

    settings --spec--> NodeList --probe--> ClusterFacts --choose--> Choice (profile)
             --preflight--> findings --set_aside--> NodeSplit --plan--> SessionPlan

`start_session` (pytest_configure) lists the nodes, probes them first where ``--hw=auto`` needs
their GPUs to choose, chooses the profile and builds the `GpuClusterSession`; `judge_nodes`
(pytest_sessionstart) probes the nodes with the session's cluster where that was not done yet,
holds the profile against them (preflight) and splits the usable nodes from the rest (set
aside). The plan (`session.plan`) follows once the tests are collected. No stage calls back up:
each stage module imports only the stages before it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_gpucluster.cluster import probe as cluster_probe
from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.cluster.probe import probe_options
from pytest_gpucluster.options import Settings
from pytest_gpucluster.profiles.detect import detect_machine
from pytest_gpucluster.results.model import SET_ASIDE_TEST_ID
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.session import header
from pytest_gpucluster.session.choose import choose
from pytest_gpucluster.session.core import GpuClusterSession
from pytest_gpucluster.session.preflight import preflight_lines, preflight_record, run_preflight
from pytest_gpucluster.session.probe import all_local, probe_commands, probe_for_auto
from pytest_gpucluster.session.set_aside import set_aside_checks, set_aside_outcome, split_lines, split_nodes
from pytest_gpucluster.session.spec import node_list

__all__ = ["RESULTS_DIR_ENV", "judge_nodes", "probe_nodes", "start_session"]

RESULTS_DIR_ENV = "_GPUCLUSTER_SESSION_RESULTS_DIR"
"""Set by the controlling process so pytest-xdist workers write into the same results directory."""


def start_session(config: pytest.Config, settings: Settings) -> GpuClusterSession:
    """The session of this pytest process: its nodes, its profile, its recorder (module docstring)."""
    machine = detect_machine()
    results_dir = _results_dir(settings)
    # xdist workers and the ranks of a world_size(n) test report to a parent that owns results.json
    worker = hasattr(config, "workerinput") or os.environ.get("GPUCLUSTER_RANK_SIDE") == "1"
    tag = _session_tag(config)
    nodes = node_list(settings, machine.hostname)
    probed = probe_for_auto(settings, nodes, results_dir, worker, tag) if settings.hw == "auto" else None
    choice = choose(settings, machine, probed, config.getoption("markexpr", "") or "")
    session = GpuClusterSession(
        settings=settings,
        machine=machine,
        profile=choice.profile,
        profile_reason=choice.reason,
        results_dir=results_dir,
        recorder=Recorder(path=results_dir / "results.json", persist=not worker),
        nodes=nodes,
        is_xdist_worker=worker,
        session_tag=tag,
        probed=probed,
        tier=choice.tier,
    )
    session.recorder.header = header.header_record(session)
    if probed is not None:
        session.keep_facts(probed)
    return session


def probe_nodes(gc: GpuClusterSession) -> ClusterFacts | None:
    """Probe every node once (controller only; workers read the controller's ``probe.json``).

    Every host this machine: read here, no launch. A dry run: the probe's commands are printed,
    nothing is launched, and node requirements are not judged. Else one job per node, all at once,
    each with its own deadline (`cluster.probe.probe_each`); a failed build of the cluster (a bad hostfile) leaves the facts empty and
    the tests that use the cluster fail on it.
    """
    if gc.probed is not None or gc.is_xdist_worker:
        return gc.node_facts
    options = probe_options(gc.forward_patterns)
    cuda = gc.profile.model.cluster.device == "cuda"
    if gc.settings.dry_run and cuda and not gc.machine.cuda_available and all_local(gc.hosts):
        gc.not_probed = f"this machine has no GPU to probe for profile {gc.profile.name}"
        return None
    if all_local(gc.hosts):
        facts = cluster_probe.probe_here(options)
    elif gc.cluster_error() is not None:
        return None
    elif gc.settings.dry_run:
        gc.not_probed = "a dry run probes no node, so GPU counts and capabilities are not judged"
        for command in probe_commands(gc.cluster, options) if gc.verbose else ():
            (gc.progress or print)(f"[dry run] probe: {command.host}: {command.shell_line()}")
        return None
    else:
        facts = cluster_probe.probe_each(gc.cluster, options, timeout_s=gc.probe_deadline)
    gc.keep_facts(facts)
    return facts


def judge_nodes(gc: GpuClusterSession) -> None:
    """The preflight on the probed nodes, then the usable nodes split from the rest and the
    session narrowed to them (`GpuClusterSession.split`). The controller records and prints what
    it found; an xdist worker judges the controller's facts alike, quietly, to launch on the same
    nodes."""
    facts = gc.node_facts
    findings = run_preflight(
        facts, gc.profile, gc.settings, nccl_env=gc.nccl_env, ranks_per_node=gc.ranks_per_node
    )
    gc.preflight = findings
    if facts is None or findings is None:
        return
    cuda = gc.profile.model.cluster.device == "cuda"
    split = split_nodes(
        gc.usable_hosts,
        facts,
        findings,
        cuda=cuda,
        strict=gc.settings.strict_nodes,
        excluded=gc.nodes.excluded,
    )
    gc.narrow_to_usable(split)
    gc.recorder.header["preflight"] = preflight_record(facts, findings)
    if split.line():
        gc.recorder.header["nodes_used"] = split.to_json()
    if gc.is_xdist_worker:
        return
    outcome = set_aside_outcome(split)
    if outcome is not None and not gc.settings.dry_run:
        gc.recorder.record_checks(set_aside_checks(split), test_id=SET_ASIDE_TEST_ID)
        gc.recorder.add_outcome(outcome)
    write = gc.progress or print
    for line in preflight_lines(findings, dry_run=gc.settings.dry_run) + split_lines(
        split, findings, dry_run=gc.settings.dry_run
    ):
        write(line)


def _session_tag(config: pytest.Config) -> str:
    """This run's owner: the xdist controller for a worker, the job's session on a rank."""
    from pytest_gpucluster.launch.leftovers import SessionTag
    from pytest_gpucluster.workloads._runtime import SESSION_ENV

    if os.environ.get("GPUCLUSTER_RANK_SIDE") == "1" and os.environ.get(SESSION_ENV):
        return os.environ[SESSION_ENV]
    if hasattr(config, "workerinput"):
        try:
            return str(SessionTag.of_process(os.getppid()))
        except ProcessLookupError:
            pass  # the controller is gone already; this worker is on its own
    return str(SessionTag.of_process())


def _results_dir(settings: Settings) -> Path:
    explicit = settings.results_dir
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get(RESULTS_DIR_ENV):
        path = Path(os.environ[RESULTS_DIR_ENV])
    else:
        path = Path("gpucluster-results") / time.strftime("%Y%m%d-%H%M%S")
    path = path.resolve()
    os.environ[RESULTS_DIR_ENV] = str(path)
    return path
