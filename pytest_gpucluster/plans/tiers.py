"""The three tiers of a run and what each sets: which tier ``-m`` asks for, and its durations.

- ``quick``: per node, no traffic between nodes beyond the launcher's rendezvous, a few minutes:
  inventory, preflight, NCCL init, short GPU health and numerics, a short intra-node all_reduce.
  What a Slurm ``HealthCheckProgram`` or a prolog runs (``gpucluster health-check``).
- ``standard``: today's acceptance run, every test but the slow burn-in parts (the default).
- ``burnin``: long load, soak, pairwise localization, DCGM level 3 (``-m burnin``).

A test's tier is its marker (``@pytest.mark.quick``; ``@pytest.mark.burnin(slow=True)``; every
other acceptance test is ``standard``, and the quick ones are in the standard run too). The run's
tier (:func:`run_tier`) chooses the durations (:func:`tier_durations`, from the profile's
``tiers:`` section). Pure: no pytest, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["TIERS", "Tier", "TierDurations", "run_tier", "tier_durations"]

Tier = Literal["quick", "standard", "burnin"]
TIERS: tuple[Tier, ...] = ("quick", "standard", "burnin")
"""Shortest first: a run whose ``-m`` names several takes the longest one's durations."""

_NAMED = re.compile(r"(\bnot\s+)?\b(quick|standard|burnin)\b")


def run_tier(markexpr: str | None) -> Tier:
    """The tier ``-m markexpr`` asks for: the longest tier it names (not negated), ``standard``
    when it names none (``pytest acceptance/`` alone, or ``-m "not burnin"``)."""
    named = {match.group(2) for match in _NAMED.finditer(markexpr or "") if not match.group(1)}
    for tier in reversed(TIERS):
        if tier in named:
            return tier
    return "standard"


@dataclass(frozen=True, slots=True)
class TierDurations:
    """What a tier's work runs for, resolved from the profile (None: the profile's own value)."""

    tier: Tier
    sweep: Literal["grid", "checked"]
    load_s: float | None
    numerics_s: float | None
    soak_s: float | None
    source: str

    def describe(self) -> str:
        """One line for the report header."""
        parts = [f"sweeps: {'checked sizes only' if self.sweep == 'checked' else 'the whole grid'}"]
        if self.load_s is not None:
            parts.append(f"health load {self.load_s:g} s")
        if self.numerics_s is not None:
            parts.append(f"numerics {self.numerics_s:g} s")
        if self.soak_s is not None:
            parts.append(f"soak {self.soak_s:g} s")
        return f"tier {self.tier}: {', '.join(parts)} ({self.source})"


def tier_durations(profile: ProfileModel, tier: Tier) -> TierDurations:
    """The profile's ``tiers.<tier>`` with its defaults filled in."""
    settings = getattr(profile.tiers, tier)
    sweep = settings.sweep or ("checked" if tier == "quick" else "grid")
    given = settings.model_fields_set - {"source"}
    source = f"profile {profile.name}: tiers.{tier}" if given else "built-in defaults"
    if settings.source:
        source += f"; {settings.source}"
    return TierDurations(tier, sweep, settings.load, settings.numerics, settings.soak, source)
