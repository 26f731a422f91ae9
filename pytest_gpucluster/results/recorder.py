"""The one place a measured value is asserted: `Recorder.check` records it, then passes or fails.

Every number a test looked at lands in ``results.json`` (pass or fail), and the file is rewritten
atomically after every check and every test, so a run cut short (Ctrl-C, a killed node, a
SIGKILL of pytest itself) keeps everything measured so far.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.model import (
    SCHEMA_VERSION,
    Comparison,
    Measurement,
    Spread,
    TestOutcome,
    compare,
)

__all__ = ["Recorder", "ThresholdFailure", "format_value"]


class ThresholdFailure(AssertionError):
    """A measured value missed its threshold (a performance failure, not a crash)."""


_SCALES = {
    "B/s": (1e9, "GB/s"),
    "s": (1.0, "s"),
    "B": (2**30, "GiB"),
    "FLOP/s": (1e12, "TFLOP/s"),
    "fraction": (0.01, "%"),
}


def format_value(value: float, unit: str) -> str:
    """Human units for canonical ones: 1.2e9 B/s -> '1.2 GB/s', 0.004 s -> '4 ms', 0.93 -> '93%'."""
    if value != value:  # NaN
        return "n/a"
    if unit == "bool":
        return "yes" if value else "no"
    if unit == "s":
        if abs(value) < 1e-3:
            return f"{value * 1e6:.4g} us"
        if abs(value) < 1:
            return f"{value * 1e3:.4g} ms"
        return f"{value:.4g} s"
    if unit in _SCALES:
        scale, shown = _SCALES[unit]
        return f"{value / scale:.4g}{'' if shown == '%' else ' '}{shown}"
    return f"{value:.4g} {unit}".rstrip()


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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __repr__(self) -> str:
        return f"<Recorder {self.path} ({len(self.measurements)} measurements)>"

    def check(
        self,
        metric: str,
        value: float,
        threshold: float | None,
        *,
        unit: str,
        comparison: Comparison = ">=",
        scope: str | None = None,
        labels: Mapping[str, Any] | None = None,
        spread: Spread | None = None,
        source: str | None = None,
        context: str = "",
    ) -> Measurement:
        """Record ``value``; if a threshold is given, fail unless ``value <comparison> threshold``.

        ``context`` is appended to the failure message: what to look at next.
        """
        __tracebackhide__ = True
        value = float(value)
        verdict = (
            "info" if threshold is None else ("pass" if compare(value, threshold, comparison) else "fail")
        )
        measurement = Measurement(
            test_id=self.current_test,
            metric=metric,
            value=value,
            unit=unit,
            threshold=None if threshold is None else float(threshold),
            comparison=comparison,
            verdict=verdict,
            scope=scope,
            labels=dict(labels or {}),
            spread=spread,
            source=source,
            time=time.time(),
        )
        with self._lock:
            self.measurements.append(measurement)
        if self.on_measurement is not None:
            self.on_measurement(measurement)
        self.flush()
        if verdict == "fail":
            raise ThresholdFailure(self.failure_message(measurement, context))
        return measurement

    def record(self, metric: str, value: float, *, unit: str, **kwargs: Any) -> Measurement:
        """Record a value with no threshold (shown in reports, compared against baselines)."""
        return self.check(metric, value, None, unit=unit, **kwargs)

    @staticmethod
    def failure_message(m: Measurement, context: str = "") -> str:
        where = f" [{m.scope}]" if m.scope else ""
        labels = ", ".join(f"{k}={v}" for k, v in m.labels.items())
        labels = f" ({labels})" if labels else ""
        noise = ""
        if m.spread is not None and m.spread.n > 1:
            noise = (
                f"; median of {m.spread.n}, range {format_value(m.spread.min, m.unit)}"
                f"..{format_value(m.spread.max, m.unit)}"
            )
        expected = "at least" if m.comparison == ">=" else "at most" if m.comparison == "<=" else "exactly"
        src = f" (threshold from {m.source})" if m.source else ""
        msg = (
            f"{m.metric}{where}{labels}: measured {format_value(m.value, m.unit)}, expected {expected} "
            f"{format_value(m.threshold or 0.0, m.unit)}{src}{noise}"
        )
        return f"{msg}. {context}".rstrip() if context else msg

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
    from dataclasses import asdict

    return asdict(outcome)
