"""Which charts a run gets: one per metric (and scope) across the fleet, never one per node or GPU.

- a metric whose values have a size-like label (``size_bytes``, ``nodes``...) with 2+ values is a
  **curve** per scope, one line per combination of its other point labels (dtype, op...); where
  the values also name nodes or GPUs, the fleet is drawn as its median and range, with a line
  only for the nodes that differ (``plots.py``);
- a metric whose values name a host, node, GPU, rank, port or pair is a **fleet** chart: every
  value of the metric, sorted, with the threshold line and the outliers labelled by who they are;
- a metric whose values are a time series (the soak) is a chart **over time** per point;
- any other metric with several values (SFT cases, scaling) is a **bars** chart across its labels;
- booleans, single values and ``NEVER_PLOTTED`` metrics are table cells (`uncharted_rows`).

So the number of charts is bounded by the number of metrics. Pure: no matplotlib.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.results.text import format_value

__all__ = ["ChartGroup", "group_measurements", "uncharted_rows", "who_of"]

X_LABELS = ("size_bytes", "nodes", "to_nodes", "world_size", "ranks", "gpus")
"""Labels that make a curve, in order of preference; size_bytes gets a log2 axis."""
WHO_LABELS = ("host", "node", "gpu", "rank", "device", "port", "pair")
"""Labels that say whose value it is: a fleet chart's points, never a chart of their own."""
LINE_LABELS = ("pair", "node", "host", "nodes")
"""Labels that name the line of a time series (who), not its chart."""
NEVER_PLOTTED = ("fabric.", "burnin.dcgm", "burnin.soak.busbw_cv")
"""Tables, not charts: per-port counters, per-GPU verdicts, and the soak's variation (one number per
series, whose samples the lowest-busbw chart already draws over time)."""
FAMILIES = ("collectives.", "nccl.", "nvlink.", "burnin.", "sft.", "scaling.")
"""Chart order in the report: communication first, then training."""


@dataclass(frozen=True, slots=True)
class ChartGroup:
    kind: str
    """``curve``, ``bars`` (who-labelled values across the fleet, or values across other labels)
    or ``series`` (over time)."""
    metric: str
    scope: str | None
    axis: str
    """The x label of a curve; the first who label of a fleet chart; "" for bars across labels."""
    fixed: str
    """The point labels that name a series chart."""
    members: tuple[Measurement, ...]


def numeric(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def label_text(labels: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def who_of(m: Measurement) -> str:
    """``node022/GPU 5``, ``node043/eth0``, ``rank 3``: whose value it is, short."""
    labels = m.labels
    parts = [str(labels[k]) for k in ("host", "node") if labels.get(k) not in (None, "")]
    if labels.get("gpu") not in (None, "", "all"):
        parts.append(f"GPU {labels['gpu']}")
    elif labels.get("rank") is not None:
        parts.append(f"rank {labels['rank']}")
    for k in ("device", "port", "pair"):
        if labels.get(k) not in (None, ""):
            parts.append(str(labels[k]))
    return "/".join(parts[:3])


def _charted(m: Measurement) -> bool:
    return not m.metric.startswith(NEVER_PLOTTED) and m.unit != "bool"


def group_measurements(measurements: Sequence[Measurement]) -> list[ChartGroup]:
    """Split measurements into charts, one per metric and scope (module docstring)."""
    by_metric: dict[tuple[str, str | None], list[Measurement]] = defaultdict(list)
    series: dict[tuple[str, str | None, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if not _charted(m):
            continue
        if m.spread is not None and m.spread.times:
            point = {k: v for k, v in m.labels.items() if k not in LINE_LABELS}
            series[(m.metric, m.scope, label_text(point))].append(m)
        else:
            by_metric[(m.metric, m.scope)].append(m)
    groups: list[ChartGroup] = []
    for (metric, scope), members in by_metric.items():
        group = _group(metric, scope, members)
        if group is not None:
            groups.append(group)
    for (metric, scope, fixed), members in series.items():
        groups.append(ChartGroup("series", metric, scope, "time_s", fixed, tuple(members)))
    groups.sort(key=lambda g: (_family(g.metric), g.metric, g.scope or "", g.kind, g.fixed))
    return groups


def _group(metric: str, scope: str | None, members: list[Measurement]) -> ChartGroup | None:
    for axis in X_LABELS:
        xs = {numeric(m.labels.get(axis)) for m in members}
        xs.discard(None)
        if len(xs) >= 2:
            on_axis = tuple(m for m in members if numeric(m.labels.get(axis)) is not None)
            return ChartGroup("curve", metric, scope, axis, "", on_axis)
    who = next((k for k in WHO_LABELS if any(k in m.labels for m in members)), None)
    if len(members) < 2:
        return None
    return ChartGroup("bars", metric, scope, who or "", "", tuple(members))


def _family(metric: str) -> int:
    return next((i for i, prefix in enumerate(FAMILIES) if metric.startswith(prefix)), len(FAMILIES))


def uncharted_rows(measurements: Sequence[Measurement]) -> list[tuple[str, str, str, str, str]]:
    """One row per metric and scope that no chart draws (booleans, single values, per-port
    counters): (metric, values, median or value, range, failed)."""
    charted = {(m.metric, m.scope) for g in group_measurements(measurements) for m in g.members}
    rest: dict[tuple[str, str | None], list[Measurement]] = defaultdict(list)
    for m in {m.key: m for m in measurements}.values():
        if (m.metric, m.scope) not in charted:
            rest[(m.metric, m.scope)].append(m)
    rows = []
    for (metric, scope), ms in sorted(
        rest.items(), key=lambda kv: (_family(kv[0][0]), kv[0][0], kv[0][1] or "")
    ):
        unit = ms[0].unit
        values = sorted(m.value for m in ms if math.isfinite(m.value))
        failed = [m for m in ms if m.failed]
        name = f"{metric} [{scope}]" if scope else metric
        if unit == "bool":
            middle = f"{sum(1 for v in values if v)} yes, {sum(1 for v in values if not v)} no"
            span = ""
        else:
            middle = format_value(statistics.median(values), unit) if values else "n/a"
            span = (
                f"{format_value(values[0], unit)}..{format_value(values[-1], unit)}"
                if len(values) > 1
                else ""
            )
        worst = ", ".join(who_of(m) or m.metric for m in failed[:3]) + (" ..." if len(failed) > 3 else "")
        rows.append((name, str(len(ms)), middle, span, f"{len(failed)}: {worst}" if failed else "0"))
    return rows
