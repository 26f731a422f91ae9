"""The one place a measured value is asserted: `Recorder.check_all` records every `Check`, then fails
once, listing all that failed — each threshold missed and, with ``--baseline``, each regression
the gate confirmed (``results/regression.py``: a suspect is re-measured once before it fails).

Every number a test looked at lands in ``results.json`` (pass or fail), and the file is rewritten
atomically after every check and every test, so a run cut short (Ctrl-C, a killed node, a
SIGKILL of pytest itself) keeps everything measured so far.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterWarning
from pytest_gpucluster.results.model import SCHEMA_VERSION, Check, Measurement, TestOutcome
from pytest_gpucluster.results.regression import RegressionGate, Remeasure
from pytest_gpucluster.results.text import failure_message

__all__ = ["NotMeasured", "Recorder", "RegressionFailure", "ThresholdFailure"]


class ThresholdFailure(AssertionError):
    """A measured value missed its threshold (a performance failure, not a crash)."""


class RegressionFailure(ThresholdFailure):
    """A value regressed against the baseline, and its re-measurement too (a performance failure)."""


class NotMeasured(AssertionError):
    """A threshold the profile sets could not be judged: the run measured nothing for it (a set-up
    gap, not a slow cluster) or its value is a broken measurement (``Check.problem``)."""


@dataclass(repr=False)
class Recorder:
    """Collects measurements and outcomes and keeps ``results.json`` current on disk."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    """Fingerprint, profile, settings: written as they are into results.json."""
    measurements: list[Measurement] = field(default_factory=list)
    outcomes: list[TestOutcome] = field(default_factory=list)
    current_test: str = ""
    on_measurement: Callable[[Measurement], None] | None = None
    started_at: float = field(default_factory=time.time)
    persist: bool = True
    """False in pytest-xdist workers: the controller alone owns results.json (measurements reach it
    on the test reports), so a worker never overwrites the file with its partial view."""
    gate: RegressionGate | None = None
    """The regression gate when the run has a ``--baseline``."""
    attempt: int = 1
    """The ``attempt`` of the values recorded now (3 while suspects are retested, ``results/retest.py``)."""
    explain: Callable[[Measurement], str | None] | None = None
    """A failed value's likely cause from the nodes' readiness (`checks.readiness.explainer`):
    appended to its failure line, so an NVLink or busbw miss on a node without Fabric Manager or
    nvidia_peermem says so."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __repr__(self) -> str:
        return f"<Recorder {self.path} ({len(self.measurements)} measurements)>"

    def check_all(
        self, checks: Iterable[Check], *, footer: str = "", remeasure: Remeasure | None = None
    ) -> list[Measurement]:
        """Record every check, then fail once, listing every check that failed (not just the first).

        A failed check that could not be judged (``Check.problem``: the profile sets a threshold the
        run produced no value for, or a broken measurement) is listed after the misses; when it is
        the only kind of failure the error is a `NotMeasured` (a set-up gap or a broken
        measurement path, not a slow cluster), otherwise a `ThresholdFailure`. ``footer`` is said once after
        the failures (a table they share).

        With a baseline, each gated value is judged against it as it is recorded; a suspected
        regression is measured again through ``remeasure`` (given the suspect checks, it returns
        fresh ones), the confirmation is recorded too, and the test fails (`RegressionFailure`)
        only when the confirmation regresses as well. Returns the first measurements.
        """
        __tracebackhide__ = True
        recorded = self._record(checks)
        regression_lines: tuple[str, ...] = ()
        confirmations: tuple[Measurement, ...] = ()
        if self.gate is not None:
            review = self.gate.review(recorded, remeasure, test_id=self.current_test)
            confirmations = review.confirmations
            self._record(confirmations)
            regression_lines = review.lines
        judged = [*recorded, *confirmations]
        missed = [self._explained(m) for m in judged if m.failed and m.judged]
        unmeasured = [failure_message(m) for m in judged if m.failed and not m.judged]
        lines = [*missed, *unmeasured]
        if lines and footer:
            lines.append(footer)
        if regression_lines and self.gate is not None and self.gate.mode == "warn":
            warnings.warn(GpuClusterWarning("\n".join(regression_lines)), stacklevel=2)
            regression_lines = ()
        if regression_lines:
            raise RegressionFailure("\n".join([*regression_lines, *lines]))
        if missed:
            raise ThresholdFailure("\n".join(lines))
        if unmeasured:
            raise NotMeasured("\n".join(lines))
        return recorded

    def _explained(self, m: Measurement) -> str:
        text = failure_message(m)
        cause = self.explain(m) if self.explain is not None else None
        return f"{text} Likely cause: {cause}." if cause else text

    def _record(self, checks: Iterable[Check | Measurement]) -> list[Measurement]:
        now = time.time()
        recorded = [
            c
            if isinstance(c, Measurement)
            else Measurement.of(c, test_id=self.current_test, time=now, attempt=self.attempt)
            for c in checks
        ]
        if not recorded:
            return recorded
        with self._lock:
            self.measurements.extend(recorded)
        if self.on_measurement is not None:
            for measurement in recorded:
                self.on_measurement(measurement)
        self.flush()
        return recorded

    def record_checks(self, checks: Iterable[Check], *, test_id: str) -> list[Measurement]:
        """Record checks judged outside any test (the session's fail-closed verdict) under
        ``test_id``, without raising: the caller adds the failed outcome they belong to."""
        now = time.time()
        return self._record(Measurement.of(c, test_id=test_id, time=now) for c in checks)

    def check(
        self, metric: str, value: float, threshold: float | None, *, unit: str, **kwargs: Any
    ) -> Measurement:
        """One value in a test of one's own: ``results.check("demo.busbw", 2e9, 1e9, unit="B/s")``
        is ``check_all([Check(...)])`` (keywords: those of `Check`)."""
        __tracebackhide__ = True
        return self.check_all([Check(metric, value, unit, threshold, **kwargs)])[0]

    def record(self, metric: str, value: float, *, unit: str, **kwargs: Any) -> Measurement:
        """Record a value with no threshold (shown in reports, compared against baselines)."""
        return self.check_all([Check(metric, value, unit, **kwargs)])[0]

    def add_outcome(self, outcome: TestOutcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)
        self.flush()

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "schema_version": SCHEMA_VERSION,
                "started_at": self.started_at,
                "updated_at": time.time(),
                **self.header,
                "measurements": [m.to_json() for m in self.measurements],
                "outcomes": [vars_of(o) for o in self.outcomes],
            }

    def flush(self) -> None:
        """Rewrite results.json atomically (write a temp file, fsync, rename)."""
        if not self.persist:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.to_json(), indent=1, default=str)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


def vars_of(outcome: TestOutcome) -> dict[str, Any]:
    return asdict(outcome)
