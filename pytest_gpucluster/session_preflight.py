"""The session's side of the preflight (`cluster.preflight`): what it is given, where its findings go.

After the per-node probe, `run_preflight` holds the session's profile, NCCL environment and ranks
per node against every node's facts. The findings go into results.json's header (``preflight``),
are printed at once (``gpucluster preflight: ...``; ``[dry run] preflight: ...`` in a dry run), and,
when one is an error, `stop_outcome` is the failed outcome the plugin records in place of the
tests before any job is launched. A session that launches nothing (``--train-log``,
``--nccl-log``: the logs come from elsewhere) and one whose nodes were not probed are not judged.

No pytest (`plugin.py` calls these with the session object).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pytest_gpucluster.checks.readiness import readiness_preflight
from pytest_gpucluster.cluster.preflight import PreflightFinding, preflight
from pytest_gpucluster.results.model import TestOutcome

if TYPE_CHECKING:
    from pytest_gpucluster.session import GpuClusterSession

__all__ = ["PREFLIGHT_TEST_ID", "preflight_lines", "run_preflight", "stop_outcome"]

PREFLIGHT_TEST_ID = "gpucluster::preflight"
"""The outcome a stopping preflight records in results.json, in place of the tests it did not run."""


def _env_origins(session: GpuClusterSession) -> dict[str, str]:
    profile = session.profile.model
    origins = {name: f"profile {profile.name}: nccl_env" for name in profile.nccl_env}
    origins |= {name: "your environment" for name in os.environ if name.startswith("NCCL_")}
    return origins


def _ranks_origin(session: GpuClusterSession) -> str:
    settings = session.settings
    if settings.nproc_per_node:
        return f"--nproc-per-node from {settings.source('nproc_per_node')}"
    cluster = session.profile.model.cluster
    key = "cluster.ranks_per_node" if cluster.ranks_per_node is not None else "cluster.gpus_per_node"
    return f"profile {session.profile.name}: {key}"


def run_preflight(session: GpuClusterSession) -> list[PreflightFinding] | None:
    """The findings on every probed node (None: not judged), recorded in results.json's header."""
    settings = session.settings
    facts = session.node_facts
    if facts is None or settings.train_log or settings.nccl_log:
        return None
    findings = preflight(
        facts,
        session.profile.model,
        env=session.nccl_env,
        env_origin=_env_origins(session),
        ranks_per_node=session.ranks_per_node,
        ranks_origin=_ranks_origin(session),
    )
    findings += readiness_preflight(facts, session.profile.model)  # node readiness: warnings with their fix
    session.recorder.header["preflight"] = {
        "nodes": [n.host for n in facts.nodes if not n.error],
        "findings": [f.to_json() for f in findings],
    }
    return findings


def preflight_lines(findings: list[PreflightFinding], *, dry_run: bool) -> list[str]:
    """What the terminal shows: every finding, then whether the session stops on them."""
    head = "[dry run] preflight" if dry_run else "gpucluster preflight"
    errors = [f for f in findings if f.severity == "error"]
    lines = [f"{head}: {f.severity.upper()} {f.message}" for f in findings]
    if errors:
        hosts = sorted({f.host for f in errors})
        what = "a run would stop here" if dry_run else "stopping before any job is launched"
        lines.append(
            f"{head}: {len(errors)} finding(s) on {len(hosts)} node(s) ({', '.join(hosts)}): {what}. "
            "Fix the profile or the settings each finding names, or choose the profile of this "
            "hardware (--hw=auto picks the part profile of the GPUs found)."
        )
    return lines


def stop_outcome(findings: list[PreflightFinding]) -> TestOutcome | None:
    """The failed outcome standing for the tests a stopping preflight does not run; None when no
    finding is an error."""
    errors = [f.message for f in findings if f.severity == "error"]
    if not errors:
        return None
    message = f"preflight: {len(errors)} finding(s), nothing launched: " + "; ".join(errors)
    return TestOutcome(PREFLIGHT_TEST_ID, "failed", "infrastructure", 0.0, message[:2000])
