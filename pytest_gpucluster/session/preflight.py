"""Stage 4 of the session's start: the profile and settings held against every probed node
(`cluster.preflight`), and how its findings are shown.

After the per-node probe, `run_preflight` holds the session's profile, NCCL environment and ranks
per node against every node's facts; `preflight_record` is what results.json's header keeps
(``preflight``); `preflight_lines` what the terminal shows at once (``gpucluster preflight: ...``;
``[dry run] preflight: ...`` in a dry run). Nothing stops here: what a finding does to its node is
the next stage's (`session.set_aside`). A session that launches nothing (``--train-log``,
``--nccl-log``: the logs come from elsewhere) and one whose nodes were not probed are not judged.

Plain values in and out (no pytest); imports nothing else of `session/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_gpucluster.checks.readiness import readiness_preflight
from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.cluster.preflight import PreflightFinding, preflight
from pytest_gpucluster.profiles.loader import LoadedProfile

if TYPE_CHECKING:
    from pytest_gpucluster.options import Settings

__all__ = ["preflight_lines", "preflight_record", "run_preflight"]


def _env_origins(profile: LoadedProfile, environ: Mapping[str, str]) -> dict[str, str]:
    model = profile.model
    origins = {name: f"profile {model.name}: nccl_env" for name in model.nccl_env}
    origins |= {name: "your environment" for name in environ if name.startswith("NCCL_")}
    return origins


def _ranks_origin(profile: LoadedProfile, settings: Settings) -> str:
    if settings.nproc_per_node:
        return f"--nproc-per-node from {settings.source('nproc_per_node')}"
    cluster = profile.model.cluster
    key = "cluster.ranks_per_node" if cluster.ranks_per_node is not None else "cluster.gpus_per_node"
    return f"profile {profile.name}: {key}"


def run_preflight(
    facts: ClusterFacts | None,
    profile: LoadedProfile,
    settings: Settings,
    *,
    nccl_env: Mapping[str, str],
    ranks_per_node: int,
) -> list[PreflightFinding] | None:
    """The findings on every probed node; None: not judged (no facts, or nothing to launch)."""
    if facts is None or settings.train_log or settings.nccl_log:
        return None
    findings = preflight(
        facts,
        profile.model,
        env=nccl_env,
        env_origin=_env_origins(profile, os.environ),
        ranks_per_node=ranks_per_node,
        ranks_origin=_ranks_origin(profile, settings),
    )
    # node readiness (checks/readiness.py): warnings naming the node and the fix; the inventory fails them
    return findings + readiness_preflight(facts, profile.model)


def preflight_record(facts: ClusterFacts, findings: list[PreflightFinding]) -> dict[str, Any]:
    """results.json's ``preflight``: the nodes judged and every finding."""
    return {
        "nodes": [n.host for n in facts.nodes if not n.error],
        "findings": [f.to_json() for f in findings],
    }


def preflight_lines(findings: list[PreflightFinding], *, dry_run: bool) -> list[str]:
    """What the terminal shows: every finding (what the next stage made of them: `set_aside.split_lines`)."""
    head = "[dry run] preflight" if dry_run else "gpucluster preflight"
    return [f"{head}: {f.severity.upper()} {f.message}" for f in findings]
