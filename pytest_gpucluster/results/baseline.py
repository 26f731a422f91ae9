"""Two results files side by side: this run's measurements against an earlier results.json.

Pure logic, no pytest: ``read_results`` loads a results file; ``compare_runs`` matches the
measurements of two runs on ``Measurement.key`` (metric, scope, labels) and judges each pair
with the gate's rule (``results/gate.py``: the same code the in-run gate uses, so a run made
with ``--baseline`` and ``gpucluster compare`` on its two files agree), and diffs the
environment fingerprints so a report can say *what* changed ("NCCL 2.21.5 -> 2.23.4").
``results/comparison_text.py`` renders the table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.gate import (
    MetricChange,
    Tolerances,
    direction_of,
    judge_groups,
    latest_by_key,
)
from pytest_gpucluster.results.model import READABLE_VERSIONS, SCHEMA_VERSION, Measurement, TestOutcome
from pytest_gpucluster.results.node_diff import node_changes

__all__ = [
    "BaselineComparison",
    "EnvChange",
    "GateMode",
    "MetricChange",
    "ResultsFileError",
    "RunResults",
    "compare_runs",
    "direction_of",
    "environment_diff",
    "hosts_of",
    "read_results",
]

GateMode = Literal["fail", "warn"]
_STATUS_ORDER: dict[str, int] = {
    "regression": 0,
    "no value": 1,
    "not gateable": 2,
    "improved": 3,
    "ok": 4,
    "info": 5,
}
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
    nodes: tuple[dict[str, Any], ...] = ()
    """The per-node probe's facts (``nodes.nodes`` in results.json), for `environment_diff`."""
    regression: dict[str, Any] | None = None
    """The gate's settings the run was made with (tolerances, mode), so that ``gpucluster
    compare`` judges its two files as the run itself did."""
    fleet: dict[str, Any] | None = None
    """For a fleet baseline (``gpucluster baseline merge``): the runs it is the median of."""
    nodes_used: dict[str, Any] | None = None
    """The nodes measured, set aside (each with its reason and action) and excluded, and the one
    line that says so (``session/set_aside.py: NodeSplit.to_json``); None when every node was measured."""
    retest: dict[str, Any] | None = None
    """With ``--gpucluster-retest-suspects``: the suspects, both measurements, who was confirmed
    (``results/retest.py: retest_record``)."""
    history: dict[str, Any] | None = None
    """With ``--gpucluster-history``: each node's failures in the last runs of the store before
    this one (``results/history/column.py``), for the report's node matrix."""
    tier: dict[str, Any] | None = None
    """The run's tier and its durations (``session.header``)."""
    jobs: tuple[dict[str, Any], ...] = ()
    """Each job's parts, nodes x ranks, estimate and real time (``harness.job_timing``): what a
    later dry run calibrates its plan with (``plans/calibration.py``)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings the run was made with, each ``{"value", "source"}`` (re-judging reads soak mode)."""
    plan: dict[str, Any] | None = None
    """The session's plan (``plans/session_plan.py``): its estimated total, per tier and per job."""

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
            regression=data.get("regression"),
            fleet=data.get("fleet"),
            retest=data.get("retest"),
            nodes_used=data.get("nodes_used"),
            history=data.get("history"),
            tier=data.get("tier") if isinstance(data.get("tier"), Mapping) else None,
            jobs=tuple(dict(j) for j in data.get("jobs") or () if isinstance(j, Mapping)),
            plan=dict(data["plan"]) if isinstance(data.get("plan"), Mapping) else None,
            settings=dict(data["settings"]) if isinstance(data.get("settings"), Mapping) else {},
            nodes=tuple(
                dict(n) for n in (data.get("nodes") or {}).get("nodes") or () if isinstance(n, Mapping)
            ),
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
    tolerances: Tolerances
    changes: tuple[MetricChange, ...]
    only_in_baseline: tuple[str, ...]
    only_in_current: tuple[str, ...]
    environment: tuple[EnvChange, ...]
    machine_changed: tuple[str, ...]
    """GPU model, GPU count or hosts that differ: said in the notes; the gate stays on."""
    hosts_match: bool = True
    mode: GateMode = "fail"
    """``warn`` (``--regression-gate warn``): regressions are reported, the run does not fail."""
    load: tuple[float | None, float | None] = (None, None)
    """The 1-minute load average at the start of the baseline and of this run."""

    @property
    def tolerance(self) -> float:
        """The default tolerance (``--max-regression``)."""
        return self.tolerances.default

    @property
    def regressions(self) -> tuple[MetricChange, ...]:
        return tuple(c for c in self.changes if c.status == "regression")

    @property
    def fails(self) -> bool:
        return bool(self.regressions) and self.mode == "fail"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tolerances"] = self.tolerances.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BaselineComparison:
        """A comparison a run stored (``results.json: baseline``), of this version or an older one."""
        tolerances = (
            Tolerances.from_json(data["tolerances"])
            if "tolerances" in data
            else Tolerances(float(data.get("tolerance", 0.05)))
        )
        known = set(MetricChange.__dataclass_fields__)
        changes = []
        for c in data.get("changes", ()):
            row = {k: v for k, v in c.items() if k in known}
            row["status"] = "info" if row.get("status") == "ungated" else row.get("status")
            row["members"] = tuple(row.get("members") or ())
            changes.append(MetricChange(**row))
        return cls(
            baseline=data["baseline"],
            current=data["current"],
            tolerances=tolerances,
            changes=tuple(changes),
            only_in_baseline=tuple(data.get("only_in_baseline", ())),
            only_in_current=tuple(data.get("only_in_current", ())),
            environment=tuple(EnvChange(**e) for e in data.get("environment", ())),
            machine_changed=tuple(data.get("machine_changed", ())),
            hosts_match=bool(data.get("hosts_match", True)),
            mode="warn" if data.get("mode") == "warn" else "fail",
            load=tuple(data.get("load") or (None, None)),  # type: ignore[arg-type]
        )


def _order(c: MetricChange) -> tuple[Any, ...]:
    """Regressions first; within a metric and scope, numeric labels (sizes) in numeric order."""
    labels = [
        (k, (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v)))
        for k, v in sorted(c.labels.items())
    ]
    return (_STATUS_ORDER[c.status], c.metric, c.scope or "", labels)


def hosts_of(run: RunResults) -> list[str]:
    return sorted(str(h) for h in run.fingerprint.get("hosts") or [])


def superseded(measurements: tuple[Measurement, ...]) -> dict[str, Measurement]:
    """Per key, the first measurement where a confirmation (``attempt`` 2) came after it."""
    firsts: dict[str, Measurement] = {}
    confirmed: set[str] = set()
    for m in measurements:
        if m.attempt > 1:
            confirmed.add(m.key)
        else:
            firsts.setdefault(m.key, m)
    return {k: m for k, m in firsts.items() if k in confirmed}


def settings_of(run: RunResults, default: float = 0.05) -> tuple[Tolerances, GateMode]:
    """The tolerances and mode ``run`` was gated with (``default`` when it stored none)."""
    stored = run.regression or {}
    tolerances = Tolerances.from_json(stored["tolerances"]) if "tolerances" in stored else Tolerances(default)
    return tolerances, "warn" if stored.get("mode") == "warn" else "fail"


def compare_runs(
    baseline: RunResults,
    current: RunResults,
    tolerances: Tolerances | float,
    *,
    mode: GateMode = "fail",
) -> BaselineComparison:
    """Judge every value of ``current`` present in ``baseline`` (the last value per key counts:
    a confirmation supersedes its first try, which the row keeps as ``first``)."""
    if not isinstance(tolerances, Tolerances):
        tolerances = Tolerances(float(tolerances))
    old = latest_by_key(baseline.measurements)
    new = latest_by_key(current.measurements)
    hosts_match = hosts_of(baseline) == hosts_of(current)
    grouped = judge_groups(
        old, list(new.values()), tolerances, hosts_match=hosts_match, first=superseded(current.measurements)
    )
    return BaselineComparison(
        baseline=baseline.source,
        current=current.source,
        tolerances=tolerances,
        changes=tuple(sorted(grouped.changes, key=_order)),
        only_in_baseline=tuple(sorted(grouped.only_in_baseline)),
        only_in_current=tuple(sorted(grouped.only_in_current)),
        environment=tuple(environment_diff(baseline, current)),
        machine_changed=tuple(machine_diff(baseline, current)),
        hosts_match=hosts_match,
        mode=mode,
        load=(load_of(baseline), load_of(current)),
    )


def load_of(run: RunResults) -> float | None:
    value = run.fingerprint.get("load_average")
    return float(value) if isinstance(value, (int, float)) else None


def _show(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "(none)"
    return str(value)


def machine_diff(baseline: RunResults, current: RunResults) -> list[str]:
    """What makes the two runs different machines: GPU model, GPU count, hosts."""
    a, b = baseline.fingerprint, current.fingerprint
    found = []
    for key, what in (("gpu_model", "GPU model"), ("gpu_count", "GPU count")):
        if a.get(key) != b.get(key):
            found.append(f"{what} {_show(a.get(key))} -> {_show(b.get(key))}")
    if sorted(a.get("hosts") or []) != sorted(b.get("hosts") or []):
        found.append(f"hosts {_show(sorted(a.get('hosts') or []))} -> {_show(sorted(b.get('hosts') or []))}")
    return found


def environment_diff(baseline: RunResults, current: RunResults) -> list[EnvChange]:
    """Software versions, GPU, hosts, kernel, profile, NCCL environment, and the nodes' links and
    fabric ports (`node_diff`) that differ."""
    a, b = baseline.fingerprint, current.fingerprint
    pairs: list[tuple[str, Any, Any]] = [
        ("GPU model", a.get("gpu_model"), b.get("gpu_model")),
        ("GPU count", a.get("gpu_count"), b.get("gpu_count")),
        ("hosts", sorted(a.get("hosts") or []), sorted(b.get("hosts") or [])),
        ("platform", a.get("platform"), b.get("platform")),
        ("rank CPU quota", a.get("rank_cpu_quota"), b.get("rank_cpu_quota")),
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
    pairs += node_changes(baseline.nodes, current.nodes)
    return [EnvChange(what, _show(x), _show(y)) for what, x, y in pairs if _show(x) != _show(y)]
