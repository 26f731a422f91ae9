"""The regression gate's rule: which values it judges, against what, and how far is too far.

Two places apply it and must agree: `Recorder.check_all` judges each value as a test records it
(``results/regression.py``), and `compare_runs` (``results/baseline.py``) judges two results files
— the report at the end of a run and ``gpucluster compare OLD NEW``. Both call `judge_groups`.

**What is judged.** A value with a floor (``>=``) or a ceiling (``<=``), and a value whose check
asks for it (``Check.baseline_gate``: the curve summaries such as peak busbw). Every other value
(each point of an info sweep, equality checks, a count whose ceiling is zero) is compared and
shown, never failed on.

**The rule: beyond the metric's own measured spread.** Each value carries the range of its repeats
(``Spread.min``..``Spread.max``; for a fleet baseline, the range over the fleet's runs), in the
baseline and in this run. Load on a machine only ever slows a repeat, so the best repeat is what
the machine can do and a real regression slows every repeat. The gate's distance (``margin``) is
from the baseline's *worse* end to this run's *best* repeat: for a higher-is-better value
``(low_old - high_new) / low_old``, for lower-is-better ``(low_new - high_old) / high_old``. A value
regresses when its margin exceeds its tolerance: every repeat of this run is worse than every
repeat of the baseline by more than the tolerance, which noise inside either run cannot do. The
healthy *spread* of the metric is the wider relative range of the two runs' repeats (``(max -
min) / min``); a metric that did not regress and whose spread exceeds its tolerance is ``not
gateable`` here: its repeats on this cluster vary more than the change the tolerance asks to see,
so it is shown with its spread instead of being held to a number it cannot keep, and never failed
on at random (issue 35: a healthy rerun's 1 KiB all_reduce latency ran 0.23-1.5 ms, and the median
of such repeats against the baseline's range failed the gate). Between runs a metric may move more
than inside one (the machine loaded by others for the whole of a test): a profile rule's measured
``healthy_spread`` (how far healthy reruns on this cluster went past the baseline's noise,
``benchmarks/gate_noise.py``) raises the bar to it, and a value inside it is ``not gateable``. The
change the tables show is between the medians. The same rule the other way round says *improved*.

**Hosts.** Values labelled with a machine (``host``, ``rank``, ``pair``, ``node``, ``gpu``) are
compared per host. A value that names its host (``host`` or ``node``) is matched by it — and its
GPU, pair or port, never by its rank, which shifts when the host list does — so after one node of
eight is swapped the seven unchanged nodes are still compared host by host and GPU by GPU
(``basis`` ``per host``); the new node's values are compared with the baseline's median over its
hosts (``new host vs baseline median``) and the removed node's values are listed as missing. A
value known only by its rank is compared per rank when both runs ran on the same hosts, else the
median over each run's hosts is compared (``median over hosts``). Every row says which (``basis``).

Pure: no pytest, no I/O, nothing from profiles/ (the session turns the profile's ``regression:``
section into `Tolerances`).
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_gpucluster.results.model import Check, Measurement, Spread

__all__ = [
    "HOST_LABELS",
    "MetricChange",
    "ToleranceRule",
    "Tolerances",
    "direction_of",
    "gated",
    "interval",
    "judge_groups",
    "latest_by_key",
]

Direction = Literal["higher", "lower"]
Status = Literal["regression", "improved", "ok", "info", "no value", "not gateable"]

HOST_LABELS = frozenset({"host", "rank", "pair", "node", "gpu"})
"""Labels that name a machine or a place on one: they differ between allocations."""
_LOWER_UNITS = frozenset({"s", "ms", "us", "B", "bytes"})
_HIGHER_UNITS = frozenset({"fraction", "%", "x"})
_SLACK = 1e-9
"""So that a change of exactly the tolerance (5.000000001% from float noise) passes."""


def direction_of(m: Check) -> tuple[Direction | None, str]:
    """Which way is better, and why: the threshold's comparison first, else the unit."""
    if m.threshold is not None and m.comparison == ">=":
        return "higher", "floor (>=)"
    if m.threshold is not None and m.comparison == "<=":
        return "lower", "ceiling (<=)"
    if m.unit.endswith("/s") or m.unit in _HIGHER_UNITS:
        return "higher", f"unit {m.unit}"
    if m.unit in _LOWER_UNITS:
        return "lower", f"unit {m.unit}"
    return None, f"no direction for unit {m.unit or '(none)'}"


def gated(m: Check) -> bool:
    """Whether the gate may fail on ``m`` (a floor or ceiling, or the check asks for it)."""
    if m.baseline_gate is False or not m.judged:
        return False
    if m.baseline_gate:
        return direction_of(m)[0] is not None
    if m.threshold == 0 and m.comparison == "<=":
        # "None allowed" (stragglers, errors): the threshold is the whole rule, and a relative
        # change from a baseline of 0 is infinite whatever it is, so gating would only repeat it.
        return False
    return m.threshold is not None and m.comparison in (">=", "<=")


def interval(m: Check) -> tuple[float, float]:
    """The low and high end of ``m``'s noise: its repeats' range (the value alone without one)."""
    if m.spread is None:
        return m.value, m.value
    return min(m.spread.min, m.value), max(m.spread.max, m.value)


def latest_by_key(measurements: Iterable[Measurement]) -> dict[str, Measurement]:
    """The last value recorded per key: a confirmation supersedes the measurement it confirms."""
    return {m.key: m for m in measurements}


# ----------------------------------------------------------------------------------- tolerances


@dataclass(frozen=True, slots=True)
class ToleranceRule:
    """Metrics matching ``pattern`` (an fnmatch glob) regress beyond ``tolerance`` (None: never)."""

    pattern: str
    tolerance: float | None
    source: str
    """Where it comes from: ``profile cpu-local: regression.tolerances[0]``."""
    healthy_spread: float | None = None
    """How far healthy reruns on this cluster went past the baseline's noise (measured); above the
    tolerance, a value regresses only beyond it and is ``not gateable`` inside it."""


@dataclass(frozen=True, slots=True)
class Tolerances:
    """The profile's rules, first match wins; ``default`` (``--max-regression``) for the rest."""

    default: float
    source: str = "--max-regression"
    rules: tuple[ToleranceRule, ...] = ()

    def lookup(self, metric: str) -> tuple[float | None, str]:
        for rule in self.rules:
            if fnmatch.fnmatchcase(metric, rule.pattern):
                return rule.tolerance, rule.source
        return self.default, self.source

    def healthy_spread(self, metric: str) -> float | None:
        """The measured healthy spread of the rule ``metric`` matches (None: not measured)."""
        for rule in self.rules:
            if fnmatch.fnmatchcase(metric, rule.pattern):
                return rule.healthy_spread
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "source": self.source,
            "rules": [
                {"pattern": r.pattern, "tolerance": r.tolerance, "source": r.source}
                | ({} if r.healthy_spread is None else {"healthy_spread": r.healthy_spread})
                for r in self.rules
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tolerances:
        rules = tuple(
            ToleranceRule(
                str(r["pattern"]),
                None if r.get("tolerance") is None else float(r["tolerance"]),
                str(r["source"]),
                None if r.get("healthy_spread") is None else float(r["healthy_spread"]),
            )
            for r in data.get("rules") or ()
        )
        return cls(float(data["default"]), str(data.get("source") or "--max-regression"), rules)


# ----------------------------------------------------------------------------------- one row


@dataclass(frozen=True, slots=True)
class MetricChange:
    """One compared value: the baseline with its interval, the first try, the value that counts."""

    key: str
    metric: str
    scope: str | None
    labels: dict[str, Any]
    unit: str
    old: float | None
    new: float | None
    change: float | None
    """(new - old) / |old| of the medians; None when either value is missing."""
    direction: Direction | None
    why: str
    tolerance: float | None
    status: Status
    old_low: float | None = None
    old_high: float | None = None
    old_n: int = 1
    """Repeats (or fleet runs) behind the baseline value."""
    first: float | None = None
    """The first measurement when a confirmation superseded it (``new`` is the confirmation)."""
    margin: float | None = None
    """How far ``new`` lies beyond the baseline's worse end, as a fraction of it (> tolerance: regression)."""
    tolerance_source: str = ""
    basis: str = "same point"
    """Which comparison was made: ``same point``, ``per host`` or ``median over hosts``."""
    basis_note: str = ""
    """For a median over hosts: why, and which hosts on either side."""
    members: tuple[str, ...] = ()
    """The keys of this run behind the row (several for a median over hosts)."""
    new_low: float | None = None
    new_high: float | None = None
    """This run's repeats' range (the margin is measured from its best end)."""
    spread: float | None = None
    """The metric's healthy spread: the wider relative range ((max - min) / min) of the baseline's
    repeats and this run's; above the tolerance (and no regression) the row is ``not gateable``."""

    @property
    def subject(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        parts = [self.metric, f"[{self.scope}]" if self.scope else "", f"({labels})" if labels else ""]
        return " ".join(p for p in parts if p)

    @property
    def confirmed(self) -> bool:
        return self.first is not None


def _rel(new: float, old: float) -> float:
    if new == old:
        return 0.0
    return (new - old) / abs(old) if old != 0 else math.copysign(math.inf, new - old)


def _beyond(end: float, distance: float) -> float:
    """``distance`` past ``end`` as a fraction of it (a zero end: any distance is infinite)."""
    if end == 0:
        return 0.0 if distance <= 0 else math.inf
    return distance / abs(end)


def _width(low: float, high: float) -> float:
    """The relative range of a value's repeats: ``(high - low) / low`` (0 for a single value)."""
    if high <= low:
        return 0.0
    return math.inf if low <= 0 else (high - low) / low


def _status(
    old: tuple[float, float],
    new: tuple[float, float],
    direction: Direction | None,
    tolerance: float | None,
    is_gated: bool,
    healthy: float | None = None,
) -> tuple[Status, float | None, float]:
    """The verdict, the margin (how far this run's best repeat lies past the baseline's worse end)
    and the healthy spread (module docstring: the rule); ``healthy``: the profile's measured spread
    between healthy reruns on this cluster."""
    (low, high), (new_low, new_high) = old, new
    spread = max(_width(low, high), _width(new_low, new_high), healthy or 0.0)
    if direction is None:
        return "info", None, spread
    if direction == "higher":
        margin, gain = _beyond(low, low - new_high), _beyond(high, new_low - high)
    else:
        margin, gain = _beyond(high, new_low - high), _beyond(low, low - new_high)
    if not is_gated or tolerance is None:
        return "info", margin, spread
    if margin > max(tolerance, healthy or 0.0) + _SLACK:
        return "regression", margin, spread
    if gain > tolerance + _SLACK:
        return "improved", margin, spread
    return ("not gateable" if spread > tolerance + _SLACK else "ok"), margin, spread


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def compare_pair(
    old: Measurement,
    new: Measurement,
    tolerances: Tolerances,
    *,
    first: Measurement | None = None,
    basis: str = "same point",
    basis_note: str = "",
    members: Sequence[str] = (),
) -> MetricChange:
    """The row for one value (or one median over hosts) in both runs. The current run's check
    says whether it is gated (its profile may have dropped a threshold the baseline had)."""
    # The current run's threshold says which way is better; the old one stands in when the new
    # run recorded the value as info only.
    direction, why = direction_of(new)
    if direction is None:
        direction, why = direction_of(old)
    tolerance, source = tolerances.lookup(new.metric)
    # A check that could not be judged (not measured, broken measurement) has no value to compare.
    o = _finite(old.value) if old.judged else None
    n = _finite(new.value) if new.judged else None
    low, high = interval(old)
    new_low, new_high = interval(new)
    status: Status
    margin = spread = None
    if o is None or n is None:
        status = "no value"
    else:
        status, margin, spread = _status(
            (low, high),
            (new_low, new_high),
            direction,
            tolerance,
            gated(new),
            tolerances.healthy_spread(new.metric),
        )
    return MetricChange(
        key=new.key,
        metric=new.metric,
        scope=new.scope,
        labels=dict(new.labels),
        unit=new.unit,
        old=o,
        new=n,
        change=None if o is None or n is None else _rel(n, o),
        direction=direction,
        why=why,
        tolerance=tolerance,
        status=status,
        old_low=_finite(low),
        old_high=_finite(high),
        old_n=old.spread.n if old.spread is not None else 1,
        first=None if first is None else _finite(first.value),
        margin=margin,
        tolerance_source=source,
        basis=basis,
        basis_note=basis_note,
        members=tuple(members) or (new.key,),
        new_low=_finite(new_low),
        new_high=_finite(new_high),
        spread=None if spread is None else _finite(spread),
    )


# ----------------------------------------------------------------------------------- groups


def group_key(m: Check) -> str:
    """The key without the labels that name a machine: what a median over hosts is keyed by."""
    labels = ",".join(f"{k}={m.labels[k]}" for k in sorted(m.labels) if k not in HOST_LABELS)
    return f"{m.metric}|{m.scope or ''}|{labels}"


def _median_over_hosts(group: Sequence[Measurement]) -> Measurement:
    """One value for a group of per-host values: the median, its interval the median of theirs."""
    first = group[0]
    values = [m.value for m in group if m.judged and math.isfinite(m.value)]
    ends = [interval(m) for m in group if m.judged and math.isfinite(m.value)]
    labels = {k: v for k, v in first.labels.items() if k not in HOST_LABELS}
    if not values:
        return Measurement.of(_with(first, math.nan, labels, None), test_id=first.test_id, time=first.time)
    median = statistics.median(values)
    spread = Spread(
        median=median,
        min=statistics.median(lo for lo, _ in ends),
        max=statistics.median(hi for _, hi in ends),
        mad=statistics.median(abs(v - median) for v in values),
        n=len(values),
        values=tuple(values),
    )
    return Measurement.of(_with(first, median, labels, spread), test_id=first.test_id, time=first.time)


def _with(m: Measurement, value: float, labels: dict[str, Any], spread: Spread | None) -> Check:
    return Check(
        m.metric,
        value,
        m.unit,
        m.threshold,
        m.comparison,
        m.ref,
        m.scope,
        labels,
        spread,
        m.hint,
        m.baseline_gate,
    )


def _named(m: Measurement) -> bool:
    """Whether the value names its machine (``host`` or ``node``), not only a rank."""
    return "host" in m.labels or "node" in m.labels


def machine_key(m: Measurement) -> str:
    """The key a value is matched by across runs when it names its machine: its key without the
    rank (a host's rank shifts when a node is added, removed or swapped; its name does not)."""
    labels = ",".join(f"{k}={m.labels[k]}" for k in sorted(m.labels) if k not in ("rank", "local_rank"))
    return f"{m.metric}|{m.scope or ''}|{labels}"


def _shared_machines(olds: Sequence[Measurement], group: Sequence[Measurement]) -> bool:
    """Whether every value of both runs names its machine and at least one is in both runs (one
    node swapped out of eight); with no machine in common (another allocation) the group is
    compared as a median over hosts."""
    if not olds or not all(_named(m) for m in (*olds, *group)):
        return False
    return bool({machine_key(m) for m in olds} & {machine_key(m) for m in group})


def _fleet(olds: Sequence[Measurement]) -> Measurement:
    """The baseline fleet a new host is compared with: the median over its hosts, its interval the
    range of their values (a new host regresses only past every baseline host's noise)."""
    median = _median_over_hosts(olds)
    ends = [interval(m) for m in olds if m.judged and math.isfinite(m.value)]
    if not ends or median.spread is None:
        return median
    spread = Spread(
        median=median.spread.median,
        min=min(lo for lo, _ in ends),
        max=max(hi for _, hi in ends),
        mad=median.spread.mad,
        n=median.spread.n,
        values=median.spread.values,
    )
    return Measurement.of(
        _with(median, median.value, dict(median.labels), spread), test_id=median.test_id, time=median.time
    )


def _by_host(
    out: GroupedComparison,
    olds: Sequence[Measurement],
    group: Sequence[Measurement],
    tolerances: Tolerances,
    first: Mapping[str, Measurement],
) -> None:
    """One group of values that name their machine: matched host by host (GPU by GPU); a host
    only in this run is compared with the baseline's median over its hosts; a host only in the
    baseline is listed as missing."""
    old_by = {machine_key(m): m for m in olds}
    fleet: Measurement | None = None
    seen: set[str] = set()
    for m in group:
        twin = old_by.get(machine_key(m))
        seen.add(machine_key(m))
        if twin is not None:
            out.changes.append(compare_pair(twin, m, tolerances, first=first.get(m.key), basis="per host"))
            continue
        fleet = fleet or _fleet(olds)
        host = m.labels.get("host", m.labels.get("node"))
        note = (
            f"{host} is not in the baseline: compared with the baseline's {len(olds)} value(s) on "
            f"{','.join(_hosts(olds))} (their median, and their range as the noise)"
        )
        out.changes.append(
            compare_pair(
                fleet,
                m,
                tolerances,
                first=first.get(m.key),
                basis="new host vs baseline median",
                basis_note=note,
            )
        )
    out.only_in_baseline.extend(o.key for o in olds if machine_key(o) not in seen)


def _hosts(group: Sequence[Measurement]) -> list[str]:
    return sorted({str(m.labels["host"]) for m in group if "host" in m.labels}) or sorted(
        {str(m.labels.get("rank", m.labels.get("node", "?"))) for m in group}
    )


@dataclass(frozen=True, slots=True)
class GroupedComparison:
    changes: list[MetricChange]
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)


def judge_groups(
    old: Mapping[str, Measurement],
    new: Sequence[Measurement],
    tolerances: Tolerances,
    *,
    hosts_match: bool,
    first: Mapping[str, Measurement] | None = None,
) -> GroupedComparison:
    """Every row of ``new`` (one value per key) against ``old`` (the baseline, latest by key).

    Values with machine labels are compared key by key when ``hosts_match`` and the two runs hold
    the same keys of that group; otherwise each run's median over its hosts is compared.
    ``first``: the superseded first measurement per key, where a confirmation replaced it.
    """
    first = first or {}
    old_groups: dict[str, list[Measurement]] = {}
    for m in old.values():
        old_groups.setdefault(group_key(m), []).append(m)
    new_groups: dict[str, list[Measurement]] = {}
    for m in new:
        new_groups.setdefault(group_key(m), []).append(m)
    out = GroupedComparison([])
    used_old: set[str] = set()
    for gkey, group in new_groups.items():
        per_host = any(HOST_LABELS & set(m.labels) for m in group)
        olds = old_groups.get(gkey, [])
        same_keys = {m.key for m in group} == {m.key for m in olds}
        if per_host and _shared_machines(olds, group):
            used_old.update(m.key for m in olds)
            _by_host(out, olds, group, tolerances, first)
            continue
        if not per_host or (hosts_match and same_keys):
            for m in group:
                if m.key not in old:
                    out.only_in_current.append(m.key)
                    continue
                used_old.add(m.key)
                basis = "per host" if per_host else "same point"
                out.changes.append(
                    compare_pair(old[m.key], m, tolerances, first=first.get(m.key), basis=basis)
                )
            continue
        if not olds:
            out.only_in_current.extend(m.key for m in group)
            continue
        used_old.update(m.key for m in olds)
        why = "the hosts differ" if not hosts_match else "the runs hold different hosts or ranks"
        note = (
            f"{why}: {len(group)} value(s) on {','.join(_hosts(group))}, "
            f"baseline {len(olds)} on {','.join(_hosts(olds))}"
        )
        confirmed = [first[m.key] for m in group if m.key in first]
        earlier = _median_over_hosts([first.get(m.key, m) for m in group]) if confirmed else None
        row = compare_pair(
            _median_over_hosts(olds),
            _median_over_hosts(group),
            tolerances,
            first=earlier,
            basis="median over hosts",
            basis_note=note,
            members=[m.key for m in group],
        )
        out.changes.append(row)
    out.only_in_baseline.extend(k for k in old if k not in used_old and group_key(old[k]) not in new_groups)
    return out
