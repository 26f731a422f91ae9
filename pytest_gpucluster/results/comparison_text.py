"""How a comparison with the baseline reads: the table and notes that the pytest summary, the
report and ``gpucluster compare`` print, and the sentence a confirmed regression fails with.

Pure: no pytest, no I/O.
"""

from __future__ import annotations

import math

from pytest_gpucluster.results.baseline import BaselineComparison
from pytest_gpucluster.results.gate import MetricChange, Tolerances
from pytest_gpucluster.results.text import format_value

__all__ = [
    "COMPARISON_HEADER",
    "comparison_head",
    "comparison_lines",
    "comparison_notes",
    "comparison_row",
    "fmt_change",
    "fmt_value",
    "regression_sentence",
]

COMPARISON_HEADER = (
    "STATUS",
    "METRIC",
    "BASELINE",
    "FIRST",
    "NOW",
    "CHANGE",
    "PAST NOISE",
    "ALLOWED",
    "COMPARED",
)
"""BASELINE: its median [the interval of its repeats or runs]; FIRST: the measurement a
confirmation replaced; NOW: the value that counts; CHANGE: between the medians; PAST NOISE: how far
NOW lies beyond the baseline interval's worse end (what the tolerance is held against)."""


def fmt_value(value: float | None, unit: str) -> str:
    return "n/a" if value is None else format_value(value, unit)


def fmt_change(change: float | None) -> str:
    if change is None:
        return "n/a"
    if math.isinf(change):
        return "+inf%" if change > 0 else "-inf%"
    return f"{change:+.1%}"


def _baseline(c: MetricChange) -> str:
    text = fmt_value(c.old, c.unit)
    if c.old_low is not None and c.old_high is not None and c.old_low != c.old_high:
        text += f" [{fmt_value(c.old_low, c.unit)}..{fmt_value(c.old_high, c.unit)}]"
    return text


def _past_noise(c: MetricChange) -> str:
    """The margin, signed the way the value moved: -27% below a floor's low end, +40% above a
    ceiling's high end; 'within' inside the baseline's interval."""
    if c.margin is None:
        return "-"
    if c.margin <= 0:
        return "within"
    return fmt_change(-c.margin if c.direction == "higher" else c.margin)


def _allowed(c: MetricChange) -> str:
    if c.status == "not gateable" and c.tolerance is not None and c.spread is not None:
        return f"not gateable here: healthy spread {c.spread * 100:.0f}% > {c.tolerance * 100:g}%"
    if c.status == "info" or c.tolerance is None or c.direction is None:
        return "not gated"
    return f"{'-' if c.direction == 'higher' else '+'}{c.tolerance * 100:g}%"


def comparison_row(c: MetricChange) -> tuple[str, ...]:
    return (
        c.status.upper() if c.status == "regression" else c.status,
        c.subject,
        _baseline(c),
        "-" if c.first is None else fmt_value(c.first, c.unit),
        fmt_value(c.new, c.unit),
        fmt_change(c.change),
        _past_noise(c),
        _allowed(c),
        c.basis,
    )


def _tolerance_line(t: Tolerances) -> str:
    rules = "; ".join(
        f"{r.pattern} {'off' if r.tolerance is None else f'{r.tolerance * 100:g}%'} ({r.source})"
        for r in t.rules
    )
    default = f"default {t.default * 100:g}% ({t.source})"
    return f"tolerances: {rules}; {default}" if rules else f"tolerance: {default}"


def comparison_head(c: BaselineComparison) -> list[str]:
    return [f"baseline {c.baseline}", f"current  {c.current}", _tolerance_line(c.tolerances)]


def regression_sentence(c: MetricChange) -> str:
    """``metric [scope] (labels): baseline X [lo..hi] (n repeats), first Y, confirmed Z: 27% below
    the baseline's low end, allowed 10% (tolerance from ...); compared per host.``"""
    end = "low end" if c.direction == "higher" else "high end"
    side = "below" if c.direction == "higher" else "above"
    noise = f"{_baseline(c)} ({c.old_n} repeat(s) or run(s))"
    tried = (
        f"first {fmt_value(c.first, c.unit)}, confirmed {fmt_value(c.new, c.unit)}"
        if c.first is not None
        else f"measured {fmt_value(c.new, c.unit)}"
    )
    margin = "n/a" if c.margin is None else ("inf" if math.isinf(c.margin) else f"{c.margin * 100:.1f}%")
    allowed = "n/a" if c.tolerance is None else f"{c.tolerance * 100:g}%"
    basis = c.basis + (f" ({c.basis_note})" if c.basis_note else "")
    return (
        f"{c.subject}: baseline {noise}, {tried}: {margin} {side} the baseline's {end} "
        f"(median change {fmt_change(c.change)}), allowed {allowed} (tolerance from {c.tolerance_source}); "
        f"compared {basis}"
    )


def _hosts_note(c: BaselineComparison) -> str:
    if c.hosts_match:
        return "compared: the same hosts in both runs, so values of one host are compared per host"
    return (
        "compared: the hosts differ; values that name their host are compared per host where the host is in "
        "both runs (rows 'per host'), a new host's with the baseline's median over its hosts (rows 'new host vs "
        "baseline median'), a removed host's are listed as missing; values known only by rank are compared as "
        "the median over each run's hosts (rows 'median over hosts')"
    )


def comparison_notes(c: BaselineComparison) -> list[str]:
    """Which comparison was made, what is missing on either side, what changed, and the verdict."""
    lines = [_hosts_note(c)]
    noted: dict[tuple[str, str], list[MetricChange]] = {}
    for ch in c.changes:
        if ch.basis_note and ch.status != "info":
            noted.setdefault((ch.metric, ch.basis_note), []).append(ch)
    for (metric, note), rows in noted.items():
        lines.append(f"  {rows[0].subject if len(rows) == 1 else f'{metric} ({len(rows)} rows)'}: {note}")
    if not c.changes:
        lines.append("no measurement is present in both runs")
    if c.only_in_baseline:
        lines.append(f"missing from this run ({len(c.only_in_baseline)}): " + "; ".join(c.only_in_baseline))
    if c.only_in_current:
        lines.append(f"not in the baseline ({len(c.only_in_current)}): " + "; ".join(c.only_in_current))
    if c.machine_changed:
        lines.append(f"note: the machine changed ({'; '.join(c.machine_changed)}); the gate stays on")
    if c.environment:
        lines.append("what changed: " + "; ".join(str(e) for e in c.environment))
    else:
        lines.append("what changed: nothing in the environment fingerprint")
    if c.load[0] is not None and c.load[1] is not None:
        lines.append(f"load average at the start (1 min): baseline {c.load[0]:g}, this run {c.load[1]:g}")
    regs = c.regressions
    judged = [ch for ch in c.changes if ch.status not in ("info", "no value")]
    noisy = [ch for ch in c.changes if ch.status == "not gateable"]
    confirmed = sum(ch.confirmed for ch in regs)
    if regs and c.mode == "warn":
        lines.append(f"WARNING: {len(regs)} regression(s), not failing (--regression-gate warn)")
    elif regs:
        lines.append(
            f"FAILED: {len(regs)} measurement(s) regressed beyond their tolerance and the baseline's noise"
            f" ({confirmed} confirmed by a second measurement)"
        )
    else:
        shown = len(c.changes) - len(judged)
        lines.append(
            f"no regression in {len(judged)} gated measurement(s); {shown} more compared and shown, not gated"
        )
    if noisy:
        worst = max(noisy, key=lambda ch: ch.spread or 0.0)
        lines.append(
            f"not gateable here ({len(noisy)}): their healthy spread (the range of their repeats) exceeds "
            f"their tolerance, so a change inside it is noise, not a regression; widest: {worst.subject} "
            f"{(worst.spread or 0.0) * 100:.0f}% against {(worst.tolerance or 0.0) * 100:g}%"
        )
    return lines


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]


def comparison_lines(
    comparison: BaselineComparison, *, show_ok: bool = True, limit: int | None = None
) -> list[str]:
    """The comparison as a terminal table: regressions first, then what is missing and what changed.

    ``show_ok=False`` keeps the rows a reader acts on (regressions, missing values, improvements)
    and folds the rest into a count; ``limit`` caps the rows shown.
    """
    c = comparison
    lines = comparison_head(c)
    # not gateable rows are summed up above (their count, the widest spread); the report lists each
    wanted = [ch for ch in c.changes if show_ok or ch.status in ("regression", "no value", "improved")]
    shown = wanted[:limit]
    if shown:
        lines += _table(COMPARISON_HEADER, [comparison_row(ch) for ch in shown])
    if len(wanted) > len(shown):
        lines.append(f"... and {len(wanted) - len(shown)} more rows (see the report)")
    folded = len(c.changes) - len(wanted)
    if folded:
        gated = sum(ch.status in ("ok", "not gateable") for ch in c.changes)
        lines.append(f"{gated} more gated within tolerance, {folded - gated} more shown only (not gated)")
    return lines + comparison_notes(c)
