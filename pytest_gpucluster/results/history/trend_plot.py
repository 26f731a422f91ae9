"""``gpucluster history trend METRIC --plot FILE.png``: one metric across runs, as one chart.

Like the report's fleet charts, nothing grows per node but the few lines worth a look: the
fleet's median per run with its min..max band across nodes, and a line for each of the
`OUTLIER_LINES` nodes farthest below (or, for a lower-is-better unit, above) the median over the
runs. The x axis is the stored runs in order (``#id``). matplotlib through ``Figure`` + Agg only.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Mapping, Sequence

from pytest_gpucluster.results.history.store import StoredRun
from pytest_gpucluster.results.plots import OUTLIER_LINES

__all__ = ["trend_png"]

_LOWER_IS_BETTER = frozenset({"s", "ms", "us", "B", "bytes"})


def _outliers(series: Mapping[str, Mapping[int, tuple[float, int]]], unit: str) -> list[str]:
    """The nodes whose values sit farthest on the worse side of the fleet's median, worst first."""
    per_run: dict[int, list[float]] = {}
    for points in series.values():
        for run_id, (value, _) in points.items():
            per_run.setdefault(run_id, []).append(value)
    median = {run_id: statistics.median(vs) for run_id, vs in per_run.items()}
    sign = 1.0 if unit in _LOWER_IS_BETTER else -1.0

    def worse(host: str) -> float:
        gaps = [sign * (v - median[r]) / abs(median[r]) for r, (v, _) in series[host].items() if median[r]]
        return statistics.median(gaps) if gaps else 0.0

    ranked = sorted(series, key=worse, reverse=True)
    return [h for h in ranked if worse(h) > 0][:OUTLIER_LINES]


def trend_png(
    metric: str, unit: str, runs: Sequence[StoredRun], series: Mapping[str, Mapping[int, tuple[float, int]]]
) -> bytes:
    """The chart (module docstring) as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = list(range(len(runs)))
    per_run = [[s[r.id][0] for s in series.values() if r.id in s] for r in runs]
    kept = [(x, vs) for x, vs in zip(xs, per_run, strict=True) if vs]
    ax.fill_between([x for x, _ in kept], [min(vs) for _, vs in kept], [max(vs) for _, vs in kept],
                    alpha=0.2, label=f"min..max over {len(series)} node(s)")  # fmt: skip
    ax.plot([x for x, _ in kept], [statistics.median(vs) for _, vs in kept], color="black", label="median")
    for host in _outliers(series, unit):
        points = [(x, series[host][r.id][0]) for x, r in zip(xs, runs, strict=True) if r.id in series[host]]
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o", linewidth=1, label=host)
    ax.set_xticks(xs, [f"#{r.id}" for r in runs], rotation=45 if len(runs) > 12 else 0)
    ax.set_xlabel("stored run")
    ax.set_ylabel(unit)
    ax.set_title(f"{metric} across runs")
    ax.legend(fontsize="small")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()
