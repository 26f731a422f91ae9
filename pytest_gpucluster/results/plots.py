"""The report's charts as PNGs, drawn from the groups of ``chart_groups.py`` (one chart per metric
and scope across the fleet):

- a curve: one line per point series; where the values of a series name nodes or GPUs, the
  fleet's median line and min..max band, plus a line for each member that missed a threshold
  (at most `OUTLIER_LINES`);
- a fleet chart: every value of the metric, sorted worst first (bars up to `BAR_LIMIT` values, a
  strip beyond), the threshold dashed, failing values red and the outliers labelled by host/GPU;
- bars across labels (SFT cases, scaling);
- a time series (the soak): one line per node or pair, at most `OUTLIER_LINES` of them (the
  lowest), the floor dashed and the samples below it marked.

matplotlib is imported lazily and only through ``Figure`` + Agg (no pyplot, no global backend);
``unavailable()`` says why there are no plots when it is missing.
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.results.baseline import direction_of
from pytest_gpucluster.results.chart_groups import (
    LINE_LABELS,
    WHO_LABELS,
    ChartGroup,
    group_measurements,
    label_text,
    who_of,
)
from pytest_gpucluster.results.model import Measurement

__all__ = ["MAX_PLOTS", "Plot", "group_measurements", "render_plots", "unavailable"]

MAX_PLOTS = 60
"""A guard only: the charts are one per metric and scope, so a run has as many as it has metrics."""
BAR_LIMIT = 40
"""Up to this many values a fleet chart is bars with every name; beyond, a sorted strip."""
OUTLIER_LINES = 6
LABELLED = 6
"""Outliers named on a fleet chart: the failures first, then the farthest from the median."""

_SCALES = {"B/s": (1e9, "GB/s"), "FLOP/s": (1e12, "TFLOP/s"), "fraction": (0.01, "%"), "B": (2**30, "GiB")}
_Group = ChartGroup
_label_text = label_text


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


def _title(g: _Group) -> str:
    parts = [
        f"{g.metric} over time" if g.kind == "series" else g.metric,
        f"[{g.scope}]" if g.scope else "",
        f"({g.fixed})" if g.fixed else "",
    ]
    return " ".join(p for p in parts if p)


def _curve_line(ax: Any, xs: list[float], ms: list[Measurement], factor: float, name: str, **kw: Any) -> Any:
    (line,) = ax.plot(xs, [m.value / factor for m in ms], marker="o", markersize=3, label=name, **kw)
    spread = [(x, m.spread) for x, m in zip(xs, ms, strict=True) if m.spread is not None and m.spread.n > 1]
    if spread:
        ax.fill_between(
            [x for x, _ in spread],
            [s.min / factor for _, s in spread],
            [s.max / factor for _, s in spread],
            alpha=0.2,
            color=line.get_color(),
        )
    return line


def _draw_curve(ax: Any, g: _Group, factor: float, baseline: Mapping[str, float | None]) -> str:
    """One line per point series; a series over many nodes/GPUs is its median and range, with a
    line only for the members that missed a threshold."""
    series: dict[str, list[Measurement]] = defaultdict(list)
    for m in g.members:
        series[label_text({k: v for k, v in m.labels.items() if k != g.axis and k not in WHO_LABELS})].append(
            m
        )
    failed = 0
    fleets = 0
    for name, ms in sorted(series.items()):
        whos = defaultdict(list)
        for m in ms:
            whos[who_of(m)].append(m)
        if len(whos) > OUTLIER_LINES:
            fleets += 1
            at: dict[float, list[float]] = defaultdict(list)
            for m in ms:
                at[float(m.labels[g.axis])].append(m.value / factor)
            xs = sorted(at)
            (line,) = ax.plot(
                xs,
                [statistics.median(at[x]) for x in xs],
                marker="o",
                markersize=3,
                label=f"{name or g.metric}: median of {len(whos)}",
            )
            ax.fill_between(
                xs, [min(at[x]) for x in xs], [max(at[x]) for x in xs], alpha=0.2, color=line.get_color()
            )
            shown = [w for w, wm in whos.items() if any(m.failed for m in wm)][:OUTLIER_LINES]
            for who in shown:
                wm = sorted(whos[who], key=lambda m: float(m.labels[g.axis]))
                ax.plot(
                    [float(m.labels[g.axis]) for m in wm],
                    [m.value / factor for m in wm],
                    linewidth=1,
                    label=who,
                )
            members = ms
        else:
            for who, wm in sorted(whos.items()):
                wm.sort(key=lambda m: float(m.labels[g.axis]))
                xs_ = [float(m.labels[g.axis]) for m in wm]
                label = ", ".join(p for p in (name, who) if p) or g.metric
                line = _curve_line(ax, xs_, wm, factor, label)
                old = [(x, baseline.get(m.key)) for x, m in zip(xs_, wm, strict=True)]
                old = [(x, v) for x, v in old if v is not None]
                if old:
                    ax.plot(
                        [x for x, _ in old],
                        [v / factor for _, v in old],  # type: ignore[operator]
                        linestyle=":",
                        color="grey",
                        label=f"baseline {label}".rstrip(),
                    )
            members = ms
        gated: dict[float, float] = {}
        for m in members:
            if m.threshold is not None:
                gated.setdefault(float(m.labels[g.axis]), m.threshold)
        if gated:
            xs = sorted(gated)
            ax.plot(
                xs,
                [gated[x] / factor for x in xs],
                linestyle="--",
                marker="_",
                markersize=10,
                color=line.get_color(),
                alpha=0.8,
                label=f"threshold ({members[0].comparison}) {name}".rstrip(),
            )
        bad = [m for m in members if m.verdict == "fail"]
        failed += len(bad)
        if bad:
            ax.scatter(
                [float(m.labels[g.axis]) for m in bad],
                [m.value / factor for m in bad],
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
    text = f"{n} points in {len(series)} series"
    if fleets:
        text += " (a series over many nodes/GPUs: its median line and min..max band, failing members drawn)"
    return text + (f"; {failed} below threshold (red x)" if failed else "")


def _ordered(ms: list[Measurement]) -> tuple[list[Measurement], str | None]:
    """Worst first: ascending where higher is better, descending where lower is."""
    direction, _ = direction_of(ms[0])
    finite = [m for m in ms if math.isfinite(m.value)]
    finite.sort(key=lambda m: m.value, reverse=direction == "lower")
    return finite + [m for m in ms if not math.isfinite(m.value)], direction


def _outliers(ms: list[Measurement]) -> list[int]:
    """Indices to label: the failures, then the values farthest from the median of their point (the
    same labels but who: one SFT case, one size) by more than 3 median absolute deviations."""
    failing = [i for i, m in enumerate(ms) if m.failed]
    points: dict[str, list[int]] = defaultdict(list)
    for i, m in enumerate(ms):
        if math.isfinite(m.value) and not m.failed:
            points[label_text({k: v for k, v in m.labels.items() if k not in WHO_LABELS})].append(i)
    far: list[tuple[float, int]] = []
    for members in points.values():
        if len(members) < 5:
            continue
        values = [ms[i].value for i in members]
        median = statistics.median(values)
        mad = statistics.median(abs(v - median) for v in values)
        if mad <= 0:
            continue
        far += [(abs(ms[i].value - median) / mad, i) for i in members if abs(ms[i].value - median) / mad > 3]
    far.sort(reverse=True)
    return (failing + [i for _, i in far])[:LABELLED]


def _draw_bars(ax: Any, g: _Group, factor: float) -> str:
    """Every value of the metric across the fleet, worst first, the threshold dashed, failures red,
    outliers named (bars with every name up to `BAR_LIMIT` values, a sorted strip beyond)."""
    ms, direction = _ordered(list(g.members))
    names = [
        ", ".join(
            p
            for p in (who_of(m), label_text({k: v for k, v in m.labels.items() if k not in WHO_LABELS}))
            if p
        )
        or m.test_id.rsplit("::", 1)[-1]
        for m in ms
    ]
    values = [m.value / factor for m in ms]
    colors = ["tab:red" if m.failed else "tab:blue" for m in ms]
    positions = list(range(len(ms)))
    labelled = _outliers(ms)
    if len(ms) <= BAR_LIMIT:
        ax.bar(positions, values, width=0.6, color=colors)
        if len(ms) < 4:
            ax.set_xlim(-1.5, len(ms) + 0.5)
        ax.set_xticks(positions)
        ax.set_xticklabels(
            names, rotation=45 if len(ms) > 6 or max(map(len, names)) > 12 else 0, ha="right", fontsize=7
        )
    else:
        ax.scatter(positions, values, c=colors, s=[30 if m.failed else 4 for m in ms])
        ax.set_xlabel(f"{len(ms)} values, sorted worst first")
        for n, i in enumerate(labelled):
            step = 12 * (n + 1)  # stagger the names: outliers often sit side by side
            ax.annotate(
                names[i],
                (i, values[i]),
                xytext=(8, -step if direction == "higher" else step),
                textcoords="offset points",
                fontsize=7,
                color="tab:red" if ms[i].failed else "black",
                arrowprops={"arrowstyle": "-", "lw": 0.5},
            )
    thresholds = {m.threshold for m in ms if m.threshold is not None}
    if len(thresholds) == 1:
        t = thresholds.pop()
        ax.axhline(
            t / factor, color="black", linestyle="--", linewidth=1, label=f"threshold ({ms[0].comparison})"
        )
        ax.legend(fontsize=7, loc="best")
    failed = sum(m.failed for m in ms)
    caption = f"{len(ms)} values" + (f", {failed} failing (red)" if failed else "")
    if labelled:
        caption += "; outliers: " + "; ".join(f"{names[i]} {values[i]:.4g}" for i in labelled)
    if direction is not None:
        caption += f" ({direction} is better)"
    return caption


def _draw_series(ax: Any, g: _Group, factor: float) -> str:
    """One line per node, pair or group over the window (the lowest `OUTLIER_LINES`); samples below
    the threshold marked."""
    below = 0
    members = sorted(g.members, key=lambda m: min(m.spread.values) if m.spread and m.spread.values else 0.0)
    for m in members[:OUTLIER_LINES]:
        assert m.spread is not None
        who = {k: v for k, v in m.labels.items() if k in LINE_LABELS}
        name = label_text(who) or m.metric
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
    shown = "" if lines <= OUTLIER_LINES else f" (the {OUTLIER_LINES} lowest drawn)"
    return f"{lines} series over time{shown}" + (
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
