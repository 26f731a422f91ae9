"""Stage 3 of the session's start: the profile, from ``--hw`` or, with ``--hw=auto``, from the GPUs
the per-node probe found on the nodes (never the login node's), shaped to the nodes' GPU count.

Plain values in and out; imports nothing else of `session/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.plans.tiers import TierDurations, run_tier, tier_durations
from pytest_gpucluster.profiles.detect import MachineInfo, choose_profile, shape_to_nodes
from pytest_gpucluster.profiles.loader import LoadedProfile, known_profiles, load_profile

if TYPE_CHECKING:
    from pytest_gpucluster.options import Settings

__all__ = ["Choice", "as_machine", "choose", "gpu_models"]


@dataclass(frozen=True, slots=True)
class Choice:
    """The session's profile and why it was chosen (the header and results.json say it)."""

    profile: LoadedProfile
    reason: str
    tier: TierDurations | None = None
    """The run's tier (``-m quick|standard|burnin``) with this profile's durations (`plans.tiers`)."""


def gpu_models(extra_dirs: list[Path]) -> list[tuple[str, str | None]]:
    models = []
    for name, path in known_profiles(extra_dirs).items():
        try:
            models.append((name, load_profile(str(path), extra_dirs).model.cluster.gpu_model))
        except ProfileError:
            continue  # a broken profile only matters when it is selected
    return models


def as_machine(facts: ClusterFacts | None, machine: MachineInfo) -> MachineInfo:
    """What ``--hw=auto`` chooses on: the GPUs the nodes list (all of them, so mixed parts are
    refused), not the controller's; the controller itself when nothing was probed."""
    if facts is None:
        return machine
    names = tuple(name for node in facts.nodes for name in node.gpu_names)
    why = "; ".join(
        f"node {n.host}: {n.error or n.gpu_problem or 'lists no GPU'}" for n in facts.nodes if not n.gpus
    )
    hosts = ", ".join(n.host for n in facts.nodes)
    return MachineInfo(
        hostname=hosts or machine.hostname,
        cuda_available=bool(names),
        gpu_names=names,
        reasons={"cuda": f"no GPU on the nodes ({why or 'none answered the probe'})"},
    )


def choose(
    settings: Settings, machine: MachineInfo, probed: ClusterFacts | None, markexpr: str = ""
) -> Choice:
    """``--hw=<name>`` as given; ``--hw=auto``: the part profile of the GPUs ``probed`` lists (this
    ``machine``'s when nothing was probed), shaped to the nodes' GPU count; with the durations of
    the tier ``-m markexpr`` selects."""
    extra_dirs = [settings.thresholds_dir] if settings.thresholds_dir else []
    auto = settings.hw == "auto"
    if auto:
        name, reason = choose_profile(as_machine(probed, machine), gpu_models(extra_dirs))
    else:
        name, reason = settings.hw, f"--hw={settings.hw} from {settings.source('hw')}"
    profile = load_profile(name, extra_dirs)
    if auto:
        counts = [n.gpu_count for n in probed.nodes] if probed is not None else [machine.gpu_count]
        profile, shaped = shape_to_nodes(profile, counts)
        reason = f"{reason}; {shaped}" if shaped else reason
    return Choice(profile, reason, tier_durations(profile.model, run_tier(markexpr)))
