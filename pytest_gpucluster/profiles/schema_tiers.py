"""Profile section of the tiers (``tiers:``): how long each tier's work runs.

A run's tier is the one its ``-m`` names (`plans.tiers.run_tier`): ``quick`` (per node, a few
minutes), ``standard`` (the default acceptance run) or ``burnin`` (hours of load and soak). The
tests each tier selects are fixed by their markers; what the profile sets here is how long the
selected work runs in that tier. A key left unset keeps what the rest of the profile says (the
``collectives.sweep`` grid, the health load's default, ``numerics.duration``, no soak).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pytest_gpucluster.profiles.fields import Duration, Section

__all__ = ["TierSettings", "TiersSection"]


class TierSettings(Section):
    """The durations of one tier's work."""

    sweep: Literal["grid", "checked"] | None = Field(
        None,
        description="What the collective sweeps visit: 'grid', the whole collectives.sweep grid (every "
        "size recorded, the curve drawn); 'checked', only the sizes collectives.checks gate (every check "
        "still judged, in a fraction of the time on a GPU node whose grid reaches gigabytes). Unset: "
        "'checked' in the quick tier, 'grid' in the others.",
    )
    load: Duration | None = Field(
        None,
        gt=0,
        description="How long the health job keeps each GPU under matmul load while NVML is sampled "
        "(unset: the workload's default, 5 s).",
    )
    numerics: Duration | None = Field(
        None, gt=0, description="numerics.duration in this tier (unset: numerics.duration itself)."
    )
    soak: Duration | None = Field(
        None,
        gt=0,
        description="Soak the gated collectives this long in this tier without --gpucluster-soak "
        "(which, when given, wins). Unset: no soak unless asked.",
    )
    source: str | None = Field(None, description="Where these durations come from.")


class TiersSection(Section):
    """Each tier's durations. Unset, the quick tier sweeps the checked sizes only, the standard tier
    is the acceptance run the rest of the profile describes, and the burn-in tier runs that with
    what the profile sets for it here."""

    quick: TierSettings = Field(default_factory=TierSettings)
    standard: TierSettings = Field(default_factory=TierSettings)
    burnin: TierSettings = Field(default_factory=TierSettings)
