"""The regression gate: compare this run's measurements with an earlier results.json.

Pure logic, no pytest: ``read_results`` loads a results file, ``compare_runs`` matches
measurements on ``Measurement.key`` (metric, scope, labels), decides for each which way is
better, flags changes beyond the tolerance and diffs the environment fingerprints so a report
can say *what* changed ("NCCL 2.21.5 -> 2.23.4"). ``comparison_lines`` renders the table that
both the pytest summary and ``gpucluster compare`` print.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.model import READABLE_VERSIONS, SCHEMA_VERSION, Measurement, TestOutcome
from pytest_gpucluster.results.text import format_value

__all__ = [
    "BaselineComparison",
    "MetricChange",
    "ResultsFileError",
    "RunResults",
    "compare_runs",
    "comparison_lines",
    "direction_of",
    "read_results",
]

Direction = Literal["higher", "lower"]
Status = Literal["regression", "improved", "ok", "ungated", "no value"]

_STATUS_ORDER: dict[str, int] = {"regression": 0, "no value": 1, "improved": 2, "ok": 3, "ungated": 4}
_LOWER_UNITS = frozenset({"s", "ms", "us", "B", "bytes"})
_HIGHER_UNITS = frozenset({"fraction", "%", "x"})
_VERSION_NAMES = {"nccl": "NCCL", "cuda": "CUDA", "driver": "driver", "python": "Python"}


class ResultsFileError(GpuClusterError):
    """A results.json cannot be read, is not one, or was written by a newer plugin."""


@dataclass(frozen=True, slots=True)
class RunResults:
    """One results.json, parsed: what the report and the gate need from it."""

    source: str
    measurements: tuple[Measurement, ...]
    outcomes: tuple[TestOutcome, ...]
    fingerprint: dict[str, Any] = field(default_factory=dict)
    nccl_env: dict[str, str] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    baseline: dict[str, Any] | None = None
    """The comparison stored by a run made with ``--baseline`` (``BaselineComparison.to_json``)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str) -> RunResults:
        if not isinstance(data, Mapping) or "measurements" not in data:
            raise ResultsFileError(
                f"{source} is not a pytest-gpucluster results.json (no 'measurements' key)"
            )
        version = data.get("schema_version")
        if not isinstance(version, int) or version not in READABLE_VERSIONS:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise ResultsFileError(
                f"{source} has schema_version {version!r}; this pytest-gpucluster reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
                + (" (upgrade the plugin to read it)" if newer else "")
            )
        try:
            measurements = tuple(Measurement.from_json(m) for m in data.get("measurements") or ())
            outcome_fields = TestOutcome.__dataclass_fields__
            outcomes = tuple(
                TestOutcome(**{k: v for k, v in o.items() if k in outcome_fields})
                for o in data.get("outcomes") or ()
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ResultsFileError(f"{source}: a measurement or outcome is malformed: {exc}") from None
        return cls(
            source=source,
            measurements=measurements,
            outcomes=outcomes,
            fingerprint=dict(data.get("fingerprint") or {}),
            nccl_env=dict(data.get("nccl_env") or {}),
            profile=dict(data.get("profile") or {}),
            started_at=data.get("started_at"),
            baseline=data.get("baseline"),
        )


def read_results(path: Path) -> RunResults:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultsFileError(f"cannot read results file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    return RunResults.from_json(data, str(path))


def direction_of(m: Measurement) -> tuple[Direction | None, str]:
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


@dataclass(frozen=True, slots=True)
class MetricChange:
    key: str
    metric: str
    scope: str | None
    labels: dict[str, Any]
    unit: str
    old: float | None
    new: float | None
    change: float | None
    """(new - old) / |old|; None when either value is missing."""
    direction: Direction | None
    why: str
    tolerance: float
    status: Status

    @property
    def subject(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        parts = [self.metric, f"[{self.scope}]" if self.scope else "", f"({labels})" if labels else ""]
        return " ".join(p for p in parts if p)

    def sentence(self) -> str:
        """'metric [scope] (labels): 20 GB/s -> 10 GB/s (-50.0%, allowed -5%)'."""
        sign = "-" if self.direction == "higher" else "+"
        return (
            f"{self.subject}: {fmt_value(self.old, self.unit)} -> {fmt_value(self.new, self.unit)} "
            f"({fmt_change(self.change)}, allowed {sign}{self.tolerance * 100:g}%)"
        )


@dataclass(frozen=True, slots=True)
class EnvChange:
    what: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.what} {self.old} -> {self.new}"


@dataclass(frozen=True, slots=True)
class BaselineComparison:
    baseline: str
    current: str
    tolerance: float
    changes: tuple[MetricChange, ...]
    only_in_baseline: tuple[str, ...]
    only_in_current: tuple[str, ...]
    environment: tuple[EnvChange, ...]
    machine_changed: tuple[str, ...]
    """Non-empty when GPU model, GPU count or hosts differ: regressions then warn, not fail."""

    @property
    def regressions(self) -> tuple[MetricChange, ...]:
        return tuple(c for c in self.changes if c.status == "regression")

    @property
    def fails(self) -> bool:
        return bool(self.regressions) and not self.machine_changed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BaselineComparison:
        return cls(
            baseline=data["baseline"],
            current=data["current"],
            tolerance=float(data["tolerance"]),
            changes=tuple(MetricChange(**c) for c in data.get("changes", ())),
            only_in_baseline=tuple(data.get("only_in_baseline", ())),
            only_in_current=tuple(data.get("only_in_current", ())),
            environment=tuple(EnvChange(**e) for e in data.get("environment", ())),
            machine_changed=tuple(data.get("machine_changed", ())),
        )

    def failure_message(self) -> str:
        """First line names the worst offenders (it is what one-line summaries show), then all."""
        regs = self.regressions
        more = f"; and {len(regs) - 3} more" if len(regs) > 3 else ""
        lines = [
            f"{len(regs)} measurement(s) regressed more than {self.tolerance * 100:g}% against baseline "
            f"{self.baseline}: " + "; ".join(c.sentence() for c in regs[:3]) + more
        ]
        lines += [f"  {c.sentence()}" for c in regs]
        if self.environment:
            lines.append("  what changed: " + "; ".join(str(e) for e in self.environment))
        return "\n".join(lines)


def _latest_by_key(measurements: tuple[Measurement, ...]) -> dict[str, Measurement]:
    """The last value recorded per key (a re-run of a point supersedes the earlier one)."""
    return {m.key: m for m in measurements}


def _tolerance_for(metric: str, default: float, overrides: Mapping[str, float]) -> float:
    for pattern, tolerance in overrides.items():
        if fnmatch.fnmatchcase(metric, pattern):
            return tolerance
    return default


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _change(old: Measurement, new: Measurement, tolerance: float) -> MetricChange:
    # The threshold of the current run says which way is better; the old one stands in when the
    # new run recorded the value as info only.
    direction, why = direction_of(new)
    if direction is None:
        direction, why = direction_of(old)
    o, n = _finite(old.value), _finite(new.value)
    rel: float | None = None
    if o is not None and n is not None:
        rel = 0.0 if n == o else (n - o) / abs(o) if o != 0 else math.copysign(math.inf, n)
    status: Status
    if rel is None:
        status = "no value"
    elif direction is None:
        status = "ungated"
    else:
        worse = -rel if direction == "higher" else rel
        # A hair of slack so that exactly the tolerance (5.000000001% from float noise) passes.
        status = "regression" if worse > tolerance + 1e-9 else "improved" if -worse > tolerance else "ok"
    return MetricChange(
        key=new.key,
        metric=new.metric,
        scope=new.scope,
        labels=dict(new.labels),
        unit=new.unit,
        old=o,
        new=n,
        change=rel,
        direction=direction,
        why=why,
        tolerance=tolerance,
        status=status,
    )


def _order(c: MetricChange) -> tuple[Any, ...]:
    """Regressions first; within a metric and scope, numeric labels (sizes) in numeric order."""
    labels = [
        (k, (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v)))
        for k, v in sorted(c.labels.items())
    ]
    return (_STATUS_ORDER[c.status], c.metric, c.scope or "", labels)


def compare_runs(
    baseline: RunResults,
    current: RunResults,
    max_regression: float,
    overrides: Mapping[str, float] | None = None,
) -> BaselineComparison:
    """Compare every measurement present in both runs; ``overrides`` maps metric globs to tolerances."""
    old = _latest_by_key(baseline.measurements)
    new = _latest_by_key(current.measurements)
    changes = [
        _change(old[key], new[key], _tolerance_for(new[key].metric, max_regression, overrides or {}))
        for key in new
        if key in old
    ]
    changes.sort(key=_order)
    return BaselineComparison(
        baseline=baseline.source,
        current=current.source,
        tolerance=max_regression,
        changes=tuple(changes),
        only_in_baseline=tuple(sorted(k for k in old if k not in new)),
        only_in_current=tuple(sorted(k for k in new if k not in old)),
        environment=tuple(environment_diff(baseline, current)),
        machine_changed=tuple(machine_diff(baseline, current)),
    )


def _show(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "(none)"
    return str(value)


def machine_diff(baseline: RunResults, current: RunResults) -> list[str]:
    """What makes the two runs different machines (then a slower number is no regression verdict)."""
    a, b = baseline.fingerprint, current.fingerprint
    found = []
    for key, what in (("gpu_model", "GPU model"), ("gpu_count", "GPU count")):
        if a.get(key) != b.get(key):
            found.append(f"{what} {_show(a.get(key))} -> {_show(b.get(key))}")
    if sorted(a.get("hosts") or []) != sorted(b.get("hosts") or []):
        found.append(f"hosts {_show(sorted(a.get('hosts') or []))} -> {_show(sorted(b.get('hosts') or []))}")
    return found


def environment_diff(baseline: RunResults, current: RunResults) -> list[EnvChange]:
    """Software versions, GPU, hosts, kernel, profile and NCCL environment that differ."""
    a, b = baseline.fingerprint, current.fingerprint
    pairs: list[tuple[str, Any, Any]] = [
        ("GPU model", a.get("gpu_model"), b.get("gpu_model")),
        ("GPU count", a.get("gpu_count"), b.get("gpu_count")),
        ("hosts", sorted(a.get("hosts") or []), sorted(b.get("hosts") or [])),
        ("platform", a.get("platform"), b.get("platform")),
    ]
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    for name in sorted(set(va) | set(vb)):
        if name != "error":
            pairs.append((_VERSION_NAMES.get(name, name), va.get(name), vb.get(name)))
    pa, pb = baseline.profile, current.profile
    pairs.append(("profile", pa.get("name"), pb.get("name")))
    if pa.get("name") == pb.get("name"):
        pairs.append(("profile sha256", (pa.get("sha256") or "")[:12], (pb.get("sha256") or "")[:12]))
    ea = {**(a.get("environment") or {}), **baseline.nccl_env}
    eb = {**(b.get("environment") or {}), **current.nccl_env}
    for name in sorted(set(ea) | set(eb)):
        pairs.append((name, ea.get(name, "(unset)"), eb.get(name, "(unset)")))
    return [EnvChange(what, _show(x), _show(y)) for what, x, y in pairs if _show(x) != _show(y)]


def fmt_value(value: float | None, unit: str) -> str:
    return "n/a" if value is None else format_value(value, unit)


def fmt_change(change: float | None) -> str:
    if change is None:
        return "n/a"
    if math.isinf(change):
        return "+inf%" if change > 0 else "-inf%"
    return f"{change:+.1%}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]


COMPARISON_HEADER = ("STATUS", "METRIC", "BASELINE", "NOW", "CHANGE", "DIRECTION")


def comparison_row(ch: MetricChange) -> tuple[str, ...]:
    return (
        ch.status.upper() if ch.status == "regression" else ch.status,
        ch.subject,
        fmt_value(ch.old, ch.unit),
        fmt_value(ch.new, ch.unit),
        fmt_change(ch.change),
        f"{ch.direction} is better ({ch.why})" if ch.direction else ch.why,
    )


def comparison_head(c: BaselineComparison) -> list[str]:
    return [
        f"baseline {c.baseline}",
        f"current  {c.current}",
        f"tolerance {c.tolerance * 100:g}% (max regression)",
    ]


def comparison_notes(c: BaselineComparison) -> list[str]:
    """What is missing on either side, what changed in the environment, and the verdict."""
    lines = []
    if not c.changes:
        lines.append("no measurement is present in both runs")
    if c.only_in_baseline:
        lines.append(f"missing from this run ({len(c.only_in_baseline)}): " + "; ".join(c.only_in_baseline))
    if c.only_in_current:
        lines.append(f"not in the baseline ({len(c.only_in_current)}): " + "; ".join(c.only_in_current))
    if c.environment:
        lines.append("what changed: " + "; ".join(str(e) for e in c.environment))
    else:
        lines.append("what changed: nothing in the environment fingerprint")
    n = len(c.regressions)
    tolerance = f"{c.tolerance * 100:g}%"
    if c.machine_changed and n:
        lines.append(
            f"WARNING: {n} regression(s) beyond {tolerance}, not failing: the machine changed "
            f"({'; '.join(c.machine_changed)})"
        )
    elif n:
        lines.append(f"FAILED: {n} measurement(s) regressed more than {tolerance}")
    else:
        if c.machine_changed:
            lines.append(f"note: the machine changed ({'; '.join(c.machine_changed)})")
        lines.append(f"no regression beyond {tolerance} in {len(c.changes)} compared measurement(s)")
    return lines


def comparison_lines(
    comparison: BaselineComparison, *, show_ok: bool = True, limit: int | None = None
) -> list[str]:
    """The comparison as a terminal table: regressions first, then what is missing and what changed.

    ``show_ok=False`` folds the rows within tolerance into a count; ``limit`` caps the rows shown.
    """
    c = comparison
    lines = comparison_head(c)
    shown = [ch for ch in c.changes if show_ok or ch.status != "ok"][:limit]
    if shown:
        lines += _table(COMPARISON_HEADER, [comparison_row(ch) for ch in shown])
    hidden_ok = 0 if show_ok else sum(ch.status == "ok" for ch in c.changes)
    cut = len(c.changes) - hidden_ok - len(shown)
    if cut:
        lines.append(f"... and {cut} more rows outside tolerance (see the report)")
    if hidden_ok:
        lines.append(f"{hidden_ok} more within tolerance")
    return lines + comparison_notes(c)
