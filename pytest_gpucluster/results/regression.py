"""The regression gate inside a run: each value is judged against the baseline as it is recorded.

`RegressionGate` holds the baseline (``--baseline``: one earlier results.json, or a fleet
baseline from ``gpucluster baseline merge``), the tolerances and whether the hosts match. For
the values one ``check_all`` records, `RegressionGate.review`:

1. judges them with the rule of ``results/gate.py`` (the same call `compare_runs` makes);
2. re-measures the suspects once, through the ``remeasure`` callback the test gave (only the
   suspect's collective sizes, or its SFT case: a new job part, not the whole run), and records
   the confirmations (``attempt`` 2) after the first measurements, which they supersede;
3. judges again with the confirmations in place: a value fails only when its confirmation
   regresses too. A test that gives no callback fails on the first measurement, and says so.

The outcome (`Review`) carries the rows and the sentences; the recorder raises. Every pytest
process (xdist workers included) holds its own gate over the same baseline file.

No pytest, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.results.baseline import (
    EnvChange,
    GateMode,
    RunResults,
    environment_diff,
    hosts_of,
    load_of,
)
from pytest_gpucluster.results.comparison_text import regression_sentence
from pytest_gpucluster.results.gate import MetricChange, Tolerances, judge_groups, latest_by_key
from pytest_gpucluster.results.model import SCHEMA_VERSION, Check, Measurement

__all__ = ["RegressionGate", "Remeasure", "Review"]

Remeasure = Callable[[Sequence[Check]], Iterable[Check]]
"""Given the suspect checks, measure them again and return fresh checks (others are ignored)."""


@dataclass(frozen=True, slots=True)
class Review:
    """What the gate made of one ``check_all``: the confirmations to record and the verdict."""

    confirmations: tuple[Measurement, ...] = ()
    regressions: tuple[MetricChange, ...] = ()
    """Confirmed (or, with no way to re-measure, unconfirmed) regressions."""
    notes: tuple[str, ...] = ()
    """Why a suspect could not be re-measured, where it could not."""
    cleared: tuple[MetricChange, ...] = ()
    """Suspects whose confirmation came back within tolerance."""
    lines: tuple[str, ...] = field(default=())
    """The failure message, one line per regression, then what changed."""


@dataclass
class RegressionGate:
    baseline: RunResults
    tolerances: Tolerances
    hosts_match: bool
    environment: tuple[EnvChange, ...] = ()
    mode: GateMode = "fail"
    load: tuple[float | None, float | None] = (None, None)
    _old: dict[str, Measurement] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._old = latest_by_key(self.baseline.measurements)

    @classmethod
    def start(
        cls, baseline: RunResults, header: Mapping[str, Any], tolerances: Tolerances, mode: GateMode
    ) -> RegressionGate:
        """The gate of a run whose results.json header is ``header`` (fingerprint, profile, NCCL env)."""
        current = RunResults.from_json(
            {**header, "schema_version": SCHEMA_VERSION, "measurements": []}, "this run"
        )
        return cls(
            baseline,
            tolerances,
            hosts_match=hosts_of(baseline) == hosts_of(current),
            environment=tuple(environment_diff(baseline, current)),
            mode=mode,
            load=(load_of(baseline), load_of(current)),
        )

    def judge(
        self, measurements: Sequence[Measurement], first: Mapping[str, Measurement] | None = None
    ) -> list[MetricChange]:
        latest = list(latest_by_key(measurements).values())
        return judge_groups(
            self._old, latest, self.tolerances, hosts_match=self.hosts_match, first=first
        ).changes

    def review(self, recorded: Sequence[Measurement], remeasure: Remeasure | None, *, test_id: str) -> Review:
        """Judge ``recorded``; re-measure and judge again what regressed (module docstring)."""
        suspects = [row for row in self.judge(recorded) if row.status == "regression"]
        if not suspects:
            return Review()
        by_key = {m.key: m for m in recorded}
        wanted = [by_key[k] for row in suspects for k in row.members if k in by_key]
        fresh, notes = _measure_again(wanted, remeasure)
        now = time.time()
        confirmations = tuple(
            Measurement.of(fresh[m.key], test_id=test_id, time=now, attempt=2)
            for m in wanted
            if m.key in fresh
        )
        missing = [m.key for m in wanted if m.key not in fresh]
        if remeasure is not None and missing and not notes:
            notes.append(f"the re-measurement returned no value for: {'; '.join(missing)}")
        first = {c.key: by_key[c.key] for c in confirmations}
        rows = self.judge([*recorded, *confirmations], first)
        suspect_keys = {row.key for row in suspects}
        regressions = tuple(r for r in rows if r.status == "regression")
        cleared = tuple(r for r in rows if r.key in suspect_keys and r.status != "regression")
        hints = {m.key: m.hint for m in [*recorded, *confirmations] if m.hint}
        lines = self._lines(regressions, notes, hints)
        return Review(confirmations, regressions, tuple(notes), cleared, lines)

    def _lines(
        self, regressions: Sequence[MetricChange], notes: Sequence[str], hints: Mapping[str, str]
    ) -> tuple[str, ...]:
        """One line per regression (its check's hint after it: which size, rank, job), then what changed."""
        if not regressions:
            return ()
        lines = []
        for row in regressions:
            hint = next((hints[k] for k in row.members if k in hints), "")
            lines.append(f"REGRESSION {regression_sentence(row)}" + (f". {hint}" if hint else ""))
        lines += [f"  not confirmed: {note}" for note in notes]
        changed = "; ".join(str(e) for e in self.environment) or "nothing in the environment fingerprint"
        if self.load[0] is not None and self.load[1] is not None:
            changed += f" (load average at the start: {self.load[0]:g} then, {self.load[1]:g} now)"
        lines.append(f"  baseline {self.baseline.source}; what changed since: {changed}")
        return tuple(lines)


def _measure_again(
    wanted: Sequence[Measurement], remeasure: Remeasure | None
) -> tuple[dict[str, Check], list[str]]:
    """The fresh checks by key, and why there are none where there are none."""
    if remeasure is None:
        return {}, [
            "this test cannot re-measure (check_all was given no remeasure), so the first measurement counts"
        ]
    suspects = [_as_check(m) for m in wanted]
    try:
        fresh = list(remeasure(suspects))
    except Exception as exc:  # a failed confirmation job must not hide the regression it was for
        return {}, [
            f"the re-measurement failed ({type(exc).__name__}: {exc}), so the first measurement counts"
        ]
    return {c.key: c for c in fresh}, []


def _as_check(m: Measurement) -> Check:
    """The `Check` part of a measurement (what a remeasure callback is given)."""
    return Check(
        m.metric, m.value, m.unit, m.threshold, m.comparison, m.ref, m.scope, m.labels, m.spread, m.hint,
        m.baseline_gate,
    )  # fmt: skip
