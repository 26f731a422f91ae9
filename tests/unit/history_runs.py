"""Real runs for the history tests: cpu-local results.json files recorded in tests/data/history
(see its SOURCES.md), and `fan_out`, which lays several real single-node runs side by side as the
nodes of one multi-node run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.baseline import RunResults, read_results
from pytest_gpucluster.results.model import Measurement

DATA = Path(__file__).resolve().parents[1] / "data" / "history"
HEALTHY = ("healthy_1", "healthy_2", "healthy_3", "healthy_4")
"""Real cpu-local runs of the inventory and burn-in tests that passed."""
SLOW_RANK = ("slow_rank1_1", "slow_rank1_2")
"""Real runs whose health job's rank 1 was slowed (slow_rank_plugin.py): rank 1 fails its floors."""
LOADED = "loaded_both_ranks"
"""A real run on the shared machine while other work loaded it: both ranks missed the matmul floor."""


def real_run(name: str) -> RunResults:
    return read_results(DATA / f"{name}.json")


def _relabel(m: Measurement, host: str, index: int, ranks_per_node: int) -> Measurement:
    labels: dict[str, Any] = dict(m.labels)
    for key in ("host", "node"):
        if key in labels:
            labels[key] = host
    if "rank" in labels and isinstance(labels["rank"], int) and not isinstance(labels["rank"], bool):
        local = labels["rank"]
        labels["rank"] = index * ranks_per_node + local
        labels.setdefault("gpu", f"GPU {local}")  # one rank per GPU, named as checks/burnin/gpu.py does
    return dataclasses.replace(m, labels=labels)


def fan_out(nodes: Mapping[str, RunResults], started_at: float, ranks_per_node: int = 2) -> RunResults:
    """One run on ``nodes`` (name -> the real single-node run that node's values come from): each
    node's host-labelled values are its run's, renamed to the node, its ranks numbered after the
    nodes before it; values that name no node come from the first node's run."""
    names: Sequence[str] = list(nodes)
    first = nodes[names[0]]
    measurements: list[Measurement] = []
    for index, name in enumerate(names):
        for m in nodes[name].measurements:
            named = any(k in m.labels for k in ("host", "node"))
            if named:
                measurements.append(_relabel(m, name, index, ranks_per_node))
            elif index == 0:
                measurements.append(m)
    outcomes = {}
    for run in nodes.values():
        for outcome in run.outcomes:  # a test failed on the cluster when it failed on any node
            if outcome.test_id not in outcomes or outcome.outcome in ("failed", "error"):
                outcomes[outcome.test_id] = outcome
    fingerprint = {**first.fingerprint, "hosts": list(names), "hostname": "login"}
    return dataclasses.replace(
        first,
        source=f"fan-out of {', '.join(f'{n}={r.source}' for n, r in nodes.items())}",
        measurements=tuple(measurements),
        outcomes=tuple(outcomes.values()),
        fingerprint=fingerprint,
        started_at=started_at,
        nodes=(),
    )
