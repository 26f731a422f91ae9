"""A measured value above the physical ceiling of its path is a broken measurement, never a pass.

A 1-rank broadcast through torch's in-place API is a no-op timed at launch cost: on the real H200
it "measured" 69,000-137,000 GB/s of busbw, and was gated and recorded as a pass. No link carries
that. `broken_above` marks every such value ``problem="broken measurement"`` (the check fails
whatever its threshold, `results.model.Check`) and says which ceiling it beat and its arithmetic:

- busbw of a collective: `profiles.links.busbw_ceiling` for the collective and scope (NVLink per
  direction inside a node, or PCIe where there is none, NVLink SHARP allowed where the part has
  it; NIC line rate x NICs across nodes), from the profile's ``cluster:`` figures or devices.yaml;
- device memory bandwidth: the datasheet's (``cluster.memory_bandwidth`` or devices.yaml).

A value is broken only above ``SLACK`` x the ceiling: datasheet figures are rounded ("4.8 TB/s")
and GB/GiB labels mix, while a broken timer is off by orders of magnitude. Where the ceiling is
unknown (a CPU profile, a part devices.yaml does not list) nothing is marked. Pure.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence

from pytest_gpucluster.profiles.links import Ceiling, busbw_ceiling
from pytest_gpucluster.profiles.peaks import peaks_for
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check

__all__ = ["SLACK", "broken_above", "collective_ceiling", "memory_ceiling"]

SLACK = 1.10


def collective_ceiling(
    model: ProfileModel, collective: str, scope: str, env: Mapping[str, str] | None = None
) -> Ceiling | None:
    """The busbw no healthy run of ``collective`` at ``scope`` can exceed; None where unknown."""
    ceiling = busbw_ceiling(
        collective, scope, model, peaks_for(model), dict(env) if env is not None else None
    )
    return ceiling if isinstance(ceiling, Ceiling) else None


def memory_ceiling(model: ProfileModel) -> Ceiling | None:
    """The device memory bandwidth of the profile's GPU (a copy counts bytes read + written)."""
    if model.cluster.device != "cuda":
        return None
    figure = peaks_for(model).memory_bandwidth
    if figure is None:
        return None
    return Ceiling(
        figure.value, f"the device memory bandwidth, {figure.value / 1e9:,.0f} GB/s ({figure.source})"
    )


def broken_above(checks: Sequence[Check], ceiling: Ceiling | None, metric: str) -> list[Check]:
    """``checks`` with every value of a metric matching ``metric`` (an fnmatch pattern) above
    ``SLACK`` x ``ceiling`` marked a broken measurement, the ceiling named in its hint."""
    if ceiling is None:
        return list(checks)
    out = []
    for check in checks:
        if (
            fnmatch.fnmatchcase(check.metric, metric)
            and check.problem is None
            and math.isfinite(check.value)
            and check.value > SLACK * ceiling.value
        ):
            note = (
                f"Broken measurement: {check.value / 1e9:,.1f} GB/s is above the physical ceiling of its "
                f"path, {ceiling.value / 1e9:,.1f} GB/s ({ceiling.arithmetic}). No link or memory moves "
                "that: the timer, the byte count or the operation is wrong (a 1-rank collective is a "
                "no-op timed at launch cost), so the value is neither a pass nor a figure for the baseline."
            )
            check = dataclasses.replace(
                check, problem="broken measurement", hint=f"{note} {check.hint}".strip()
            )
        out.append(check)
    return out
