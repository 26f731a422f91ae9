"""Charts for the report, generic over measurements: curves where a size-like label varies, bars
where a rank/host label does.

- a measurement with a numeric ``size_bytes`` (or ``nodes``, ``world_size``...) label joins a curve
  of its metric and scope, one line per combination of its other labels (dtype, op...); sizes on a
  log2 axis; thresholds drawn dashed, points that missed theirs marked;
- a measurement with a ``rank``, ``host`` or ``node`` label joins a bar chart of its metric, scope
  and other labels, the worst bar highlighted;
- what remains of ``sft.*`` and ``scaling.*`` (step time, throughput, efficiency per case) and any
  other metric with several values becomes a bar chart across its labels;
- a measurement whose spread is a time series (``Spread.times``: the soak) joins a chart over time
  of its metric, scope and point, one line per node, node pair or group, the threshold dashed and
  the samples below it marked;
- per-port counters, per-GPU verdicts and the soak's variation (``NEVER_PLOTTED``) are tables only.

matplotlib is imported lazily and only through ``Figure`` + Agg (no pyplot, no global backend);
``unavailable()`` says why there are no plots when it is missing.
"""

from __future__ import annotations

import io
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.results.baseline import direction_of
from pytest_gpucluster.results.model import Measurement

__all__ = ["MAX_PLOTS", "Plot", "render_plots", "unavailable"]

X_LABELS = ("size_bytes", "nodes", "to_nodes", "world_size", "ranks", "gpus")
"""Labels that make a curve, in order of preference; size_bytes gets a log2 axis."""
BAR_LABELS = ("rank", "host", "node", "gpu", "pair")
LINE_LABELS = ("pair", "node", "host", "nodes")
"""Labels that name the line of a time series (who), not its chart."""
NEVER_PLOTTED = ("fabric.", "burnin.dcgm", "burnin.soak.busbw_cv")
"""Tables, not charts: per-port counters, per-GPU verdicts, and the soak's variation (one number per
series, whose samples the lowest-busbw chart already draws over time)."""
ALWAYS_PLOTTED = ("sft.", "scaling.")
FAMILIES = ("collectives.", "nccl.", "nvlink.", "burnin.", "sft.", "scaling.")
"""Chart order in the report: communication first, then training."""
MAX_PLOTS = 60

_SCALES = {"B/s": (1e9, "GB/s"), "FLOP/s": (1e12, "TFLOP/s"), "fraction": (0.01, "%"), "B": (2**30, "GiB")}


@dataclass(frozen=True, slots=True)
class Plot:
    title: str
    filename: str
    png: bytes
    caption: str


def unavailable() -> str | None:
    """None when plots can be drawn, else the reason (for the report to say)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        return "matplotlib is not installed (pip install 'pytest-gpucluster[report]')"
    except ImportError as exc:  # installed but broken (e.g. numpy re-imported in one process)
        return f"matplotlib cannot be imported: {exc}"
    return None


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _label_text(labels: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80]


def _scale(unit: str, values: Iterable[float]) -> tuple[float, str]:
    if unit == "s":
        top = max((abs(v) for v in values), default=0.0)
        return (1e-3, "ms") if top < 1 else (1.0, "s")
    return _SCALES.get(unit, (1.0, unit))


def _human_bytes(value: float, _pos: Any = None) -> str:
    for factor, suffix in ((2**40, "T"), (2**30, "G"), (2**20, "M"), (2**10, "K")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class _Group:
    kind: str  # "curve", "bars" or "series"
    metric: str
    scope: str | None
    axis: str  # the x label (curve, bars) or "" for bars across label combinations
    fixed: str  # the other labels that name this chart
    members: tuple[Measurement, ...]


def group_measurements(measurements: Sequence[Measurement]) -> list[_Group]:
    """Split measurements into charts (the pure part: tested without matplotlib)."""
    curves: dict[tuple[Any, ...], list[Measurement]] = defaultdict(list)
    bars: dict[tuple[Any, ...], list[Measurement]] = defaultdict(list)
    rest: dict[tuple[Any, ...], list[Measurement]] = defaultdict(list)
    series: dict[tuple[Any, ...], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.metric.startswith(NEVER_PLOTTED):
            continue
        if m.spread is not None and m.spread.times:
            point = {k: v for k, v in m.labels.items() if k not in LINE_LABELS}
            series[(m.metric, m.scope, "time_s", _label_text(point))].append(m)
            continue
        bar_label = next((k for k in BAR_LABELS if k in m.labels), None)
        x_label = next((k for k in X_LABELS if _numeric(m.labels.get(k)) is not None), None)
        if bar_label is not None:
            others = {k: v for k, v in m.labels.items() if k != bar_label}
            bars[(m.metric, m.scope, bar_label, _label_text(others))].append(m)
        elif x_label is not None:
            # The other labels (dtype, op...) become series of one chart per metric and scope.
            curves[(m.metric, m.scope, x_label, "")].append(m)
        else:
            rest[(m.metric, m.scope, "", "")].append(m)
    groups: list[_Group] = []
    for (metric, scope, axis, fixed), members in curves.items():
        if len({m.labels[axis] for m in members}) >= 2:
            groups.append(_Group("curve", metric, scope, axis, fixed, tuple(members)))
        else:
            rest[(metric, scope, "", "")].extend(members)
    for (metric, scope, axis, fixed), members in bars.items():
        groups.append(_Group("bars", metric, scope, axis, fixed, tuple(members)))
    for (metric, scope, axis, fixed), members in series.items():
        groups.append(_Group("series", metric, scope, axis, fixed, tuple(members)))
    for (metric, scope, _, _), members in rest.items():
        if len(members) >= 2 or metric.startswith(ALWAYS_PLOTTED):
            groups.append(_Group("bars", metric, scope, "", "", tuple(members)))
    groups.sort(key=lambda g: (_family(g.metric), g.metric, g.scope or "", g.kind, g.fixed))
    return groups


def _family(metric: str) -> int:
    return next((i for i, prefix in enumerate(FAMILIES) if metric.startswith(prefix)), len(FAMILIES))


def _title(g: _Group) -> str:
    parts = [
        f"{g.metric} over time" if g.kind == "series" else g.metric,
        f"[{g.scope}]" if g.scope else "",
        f"({g.fixed})" if g.fixed else "",
    ]
    return " ".join(p for p in parts if p)


def _draw_curve(ax: Any, g: _Group, factor: float, baseline: Mapping[str, float | None]) -> str:
    series: dict[str, list[Measurement]] = defaultdict(list)
    for m in g.members:
        series[_label_text({k: v for k, v in m.labels.items() if k != g.axis})].append(m)
    failed = 0
    for name, ms in sorted(series.items()):
        ms.sort(key=lambda m: float(m.labels[g.axis]))
        xs = [float(m.labels[g.axis]) for m in ms]
        (line,) = ax.plot(
            xs, [m.value / factor for m in ms], marker="o", markersize=3, label=name or g.metric
        )
        spread = [
            (x, m.spread) for x, m in zip(xs, ms, strict=True) if m.spread is not None and m.spread.n > 1
        ]
        if spread:
            ax.fill_between(
                [x for x, _ in spread],
                [s.min / factor for _, s in spread],
                [s.max / factor for _, s in spread],
                alpha=0.2,
                color=line.get_color(),
            )
        old = [(x, baseline.get(m.key)) for x, m in zip(xs, ms, strict=True)]
        old = [(x, v) for x, v in old if v is not None]
        if old:
            ax.plot(
                [x for x, _ in old],
                [v / factor for _, v in old],  # type: ignore[operator]
                linestyle=":",
                color="grey",
                label=f"baseline {name}".rstrip(),
            )
        gated = [(x, m) for x, m in zip(xs, ms, strict=True) if m.threshold is not None]
        if gated:
            ax.plot(
                [x for x, _ in gated],
                [m.threshold / factor for _, m in gated],  # type: ignore[operator]
                linestyle="--",
                marker="_",
                markersize=10,
                color=line.get_color(),
                alpha=0.8,
                label=f"threshold ({gated[0][1].comparison}) {name}".rstrip(),
            )
        bad = [(x, m) for x, m in zip(xs, ms, strict=True) if m.verdict == "fail"]
        failed += len(bad)
        if bad:
            ax.scatter(
                [x for x, _ in bad],
                [m.value / factor for _, m in bad],
                color="red",
                marker="x",
                s=60,
                zorder=5,
            )
    if g.axis == "size_bytes":
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_human_bytes))
        ax.set_xlabel("message size (bytes)")
    else:
        ax.set_xlabel(g.axis)
    ax.legend(fontsize=7, loc="best")
    n = len(g.members)
    return f"{n} points in {len(series)} series" + (f"; {failed} below threshold (red x)" if failed else "")


def _draw_bars(ax: Any, g: _Group, factor: float) -> str:
    if g.axis:
        ms = sorted(g.members, key=lambda m: (str(type(m.labels[g.axis])), m.labels[g.axis]))
        names = [str(m.labels[g.axis]) for m in ms]
        ax.set_xlabel(g.axis)
    else:
        ms = list(g.members)
        names = [_label_text(m.labels) or m.test_id.rsplit("::", 1)[-1] for m in ms]
    values = [m.value / factor for m in ms]
    direction, _ = direction_of(ms[0])
    finite = [(v, i) for i, v in enumerate(values) if math.isfinite(v)]
    worst = None
    if direction is not None and len(finite) > 1:
        worst = (min(finite) if direction == "higher" else max(finite))[1]
    colors = ["tab:red" if m.verdict == "fail" else "tab:blue" for m in ms]
    if worst is not None and colors[worst] != "tab:red":
        colors[worst] = "tab:orange"
    positions = list(range(len(ms)))
    errors = None
    if any(m.spread is not None and m.spread.n > 1 for m in ms):
        errors = [
            [max(0.0, (m.value - m.spread.min) / factor) if m.spread else 0.0 for m in ms],
            [max(0.0, (m.spread.max - m.value) / factor) if m.spread else 0.0 for m in ms],
        ]
    ax.bar(positions, values, width=0.6, color=colors, yerr=errors, capsize=3)
    if len(ms) < 4:
        ax.set_xlim(-1.5, len(ms) + 0.5)
    if worst is not None and math.isfinite(values[worst]):
        ax.annotate("slowest", (worst, values[worst]), ha="center", va="bottom", fontsize=8, color="tab:red")
    ax.set_xticks(positions)
    ax.set_xticklabels(
        names, rotation=45 if len(ms) > 6 or max(map(len, names)) > 12 else 0, ha="right", fontsize=7
    )
    thresholds = {m.threshold for m in ms if m.threshold is not None}
    if len(thresholds) == 1:
        t = thresholds.pop()
        ax.axhline(
            t / factor, color="black", linestyle="--", linewidth=1, label=f"threshold ({ms[0].comparison})"
        )
        ax.legend(fontsize=7, loc="best")
    caption = f"{len(ms)} values"
    if worst is not None:
        better = "higher" if direction == "higher" else "lower"
        caption += f"; slowest (orange/red): {names[worst]} ({better} is better)"
    return caption


def _draw_series(ax: Any, g: _Group, factor: float) -> str:
    """One line per node, pair or group over the window; samples below the threshold marked."""
    below = 0
    for m in sorted(g.members, key=lambda m: _label_text(m.labels)):
        assert m.spread is not None
        who = {k: v for k, v in m.labels.items() if k in LINE_LABELS}
        name = _label_text(who) or m.metric
        (line,) = ax.plot(m.spread.times, [v / factor for v in m.spread.values], linewidth=1, label=name)
        if m.threshold is not None and m.comparison == ">=":
            low = [(t, v) for t, v in zip(m.spread.times, m.spread.values, strict=True) if v < m.threshold]
            below += len(low)
            ax.axhline(m.threshold / factor, color=line.get_color(), linestyle="--", linewidth=1, alpha=0.8)
            if low:
                ax.scatter(
                    [t for t, _ in low], [v / factor for _, v in low], color="red", marker="x", s=30, zorder=5
                )
    ax.set_xlabel("seconds into the soak")
    ax.legend(fontsize=7, loc="best")
    lines = len(g.members)
    return f"{lines} series over time" + (
        f"; {below} samples below the floor (red x, floor dashed)" if below else ""
    )


def render_plots(
    measurements: Sequence[Measurement],
    baseline: Mapping[str, float | None] | None = None,
    limit: int = MAX_PLOTS,
) -> list[Plot]:
    """PNG charts of the measurements (empty when matplotlib is missing: see ``unavailable``).

    ``baseline`` maps ``Measurement.key`` to the baseline run's value: curves draw it dotted grey.
    """
    if unavailable() is not None:
        return []
    from matplotlib.figure import Figure

    plots: list[Plot] = []
    for index, g in enumerate(group_measurements(measurements)[:limit]):
        fig = Figure(figsize=(7.5, 3.8), dpi=90, layout="constrained")
        ax = fig.add_subplot()
        unit = g.members[0].unit
        factor, shown = _scale(unit, [m.value for m in g.members if math.isfinite(m.value)])
        if g.kind == "series":
            values = [v for m in g.members if m.spread for v in m.spread.values if math.isfinite(v)]
            factor, shown = _scale(unit, values)
            caption = _draw_series(ax, g, factor)
        elif g.kind == "curve":
            caption = _draw_curve(ax, g, factor, baseline or {})
        else:
            caption = _draw_bars(ax, g, factor)
        title = _title(g)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(shown)
        ax.grid(True, alpha=0.3)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plots.append(Plot(title, f"{index + 1:02d}-{_slug(title)}.png", buffer.getvalue(), caption))
    return plots
