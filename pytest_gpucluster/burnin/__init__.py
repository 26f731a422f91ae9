"""Burn-in: find the bad node, GPU or link.

Parent-side judging of what the rank-side ``workloads/health.py`` measured; no torch, no pytest:

- `stragglers`  median-relative detection of slow ranks, nodes or node pairs (pure)
- `health`      per-rank and per-GPU health values against the profile's ``burnin:`` section
- `pairwise`    localization of a slow node or link in two rounds of node-pair tests (pure)
- `runner`      runs a round of pair tests through a `Cluster`, disjoint pairs at once
- `drift`       version pins/bounds and cross-node agreement of per-node fingerprints (pure)
- `drain`       the `Suspect` record, ``suspects.json`` and the ``scontrol`` drain argv lists
"""

from __future__ import annotations

from pytest_gpucluster.errors import GpuClusterError

__all__ = ["BurninError"]


class BurninError(GpuClusterError):
    """Burn-in input that cannot be judged: a bad version spec, node name or measurement set."""
