"""The data a run leaves behind: checks, measurements, test outcomes, and the results.json layout.

One type judges a value: `Check` — the measured value and its unit, the threshold and how it
compares, where the threshold comes from (`ThresholdRef`, a profile key as data, never a
sentence), the labels that say which point it is, the spread of repeated runs and the hint for
a failure. `checks/` builds them, ``Recorder.check_all`` records and asserts them. A
`Measurement` is a `Check` as results.json keeps it: the same fields plus the test that judged
it and when.

Pure data and (de)serialisation; no pytest, no I/O. ``results.json`` is the baseline of the
next regression gate, so its layout is versioned (``schema_version``): version 2 stores the
threshold's profile key as ``ref: {"profile", "key_path"}`` and the failure hint; version-1
files (a free-text ``source`` in place of ``ref``) are still read — their ``source`` was prose
for people and is dropped, so such measurements carry no ``ref``. Two optional keys of version
2 are written only when they say something: ``baseline_gate`` (a check's own word on whether the
regression gate judges it) and ``attempt`` (2 for the confirmation of a suspected regression,
recorded after the first measurement of the same key, which it supersedes); a reader that
ignores them still takes the last measurement of a key as its value.

Version 3 adds ``problem`` (written only when set): a check that could not be judged —
``"not measured"`` (the profile sets a threshold the run produced no value for) or ``"broken
measurement"`` (a value the measurement path cannot physically produce, e.g. above its ceiling).
Such a check always fails, whatever its value. Older files carry no ``problem``; a value of
``null`` with a threshold reads as ``"not measured"``, as it always meant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "PREFLIGHT_TEST_ID",
    "PROBLEMS",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "SET_ASIDE_METRIC",
    "SET_ASIDE_TEST_ID",
    "Check",
    "Comparison",
    "Measurement",
    "Problem",
    "Spread",
    "TestOutcome",
    "ThresholdRef",
    "compare",
]

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Every results.json layout this version reads (1: free-text ``source``; 2: ``ref`` and ``hint``;
3: ``problem``)."""

Comparison = Literal[">=", "<=", "=="]
Verdict = Literal["pass", "fail", "info"]
Problem = Literal["not measured", "broken measurement"]
"""Why a check could not be judged: the run produced no value for a threshold the profile sets; or
the value is one its measurement path cannot produce (above the physical ceiling of the path)."""
PROBLEMS: tuple[Problem, ...] = ("not measured", "broken measurement")
Category = Literal["pass", "performance", "not measured", "infrastructure", "failure", "skipped"]
"""How a test ended: passed; a measured value missed its threshold; a threshold could not be judged
(not measured, or a broken measurement); the job could not run or a rank crashed/hung; any other
failure (a bug, a wrong result); skipped. Never conflated in the summary."""

_COMPARISONS = (">=", "<=", "==")


@dataclass(frozen=True, slots=True)
class Spread:
    """Repeated measurements of one point: the median is gated, the rest shows the noise."""

    median: float
    min: float
    max: float
    mad: float
    n: int
    values: tuple[float, ...] = ()
    times: tuple[float, ...] = ()
    """When each value was taken, in seconds from the first (a soak's time series, which the report
    draws over time); empty for repeats whose moment does not matter."""

    @classmethod
    def of(cls, values: Iterable[float], times: Iterable[float] = ()) -> Spread:
        """Median, range and median absolute deviation of ``values`` (kept, in their order), and
        ``times`` when the values are a time series (one per value)."""
        data = tuple(float(v) for v in values)
        if not data:
            raise ValueError("a spread needs at least one value")
        at = tuple(float(t) for t in times)
        if at and len(at) != len(data):
            raise ValueError(f"a time series needs one time per value: {len(at)} times, {len(data)} values")
        median = statistics.median(data)
        mad = statistics.median(abs(v - median) for v in data)
        return cls(median=median, min=min(data), max=max(data), mad=mad, n=len(data), values=data, times=at)


@dataclass(frozen=True, slots=True)
class ThresholdRef:
    """The profile key a threshold was read from: ``ThresholdRef("cpu-local", ("collectives",
    "checks", 0, "min_busbw"))``. `profiles.derive` maps a measurement back to its key with it."""

    profile: str
    key_path: tuple[str | int, ...]
    """Section, then keys and list indices: ``("sft", "cases", 1, "max_step_time")``."""

    def __post_init__(self) -> None:
        path = tuple(self.key_path)
        if not path or not isinstance(path[0], str):
            raise ValueError(f"a threshold key path starts with a section name, got {self.key_path!r}")
        for part in path:
            if isinstance(part, bool) or not isinstance(part, (str, int)):
                raise ValueError(f"a threshold key path holds names and list indices, got {part!r}")
        object.__setattr__(self, "key_path", path)

    @property
    def key(self) -> str:
        """``collectives.checks[0].min_busbw``, as the profile file is read."""
        text = ""
        for part in self.key_path:
            text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
        return text

    def __str__(self) -> str:
        return f"profile {self.profile}: {self.key}"

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "key_path": list(self.key_path)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ThresholdRef:
        return cls(str(data["profile"]), tuple(data["key_path"]))


@dataclass(frozen=True, slots=True)
class Check:
    """One measured value and what it is judged against (no threshold: recorded as information)."""

    metric: str
    """Stable name across runs, e.g. ``collectives.all_reduce.busbw``; the baseline gate matches on
    (metric, scope, labels)."""
    value: float
    unit: str
    threshold: float | None = None
    comparison: Comparison = ">="
    ref: ThresholdRef | None = None
    """The profile key of the threshold; None for a threshold that is a rule of the check itself
    (zero wrong elements, a finite loss), which the hint explains."""
    scope: str | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)
    """Which point: size, collective, host, rank, case..."""
    spread: Spread | None = None
    hint: str = ""
    """Said after a failure: where the number comes from and what to look at next."""
    baseline_gate: bool | None = None
    """Whether the regression gate (``--baseline``) judges this value: None (the default) judges
    it when it has a floor or a ceiling; True also without one (a curve summary such as peak
    busbw); False never (shown in the comparison, never failed on: a value relative to its
    peers, whose own threshold already judges it)."""
    problem: Problem | None = None
    """Why the check could not be judged (`Problem`); set, the check fails whatever its value, and
    the hint says the reason. A threshold with a NaN value is ``"not measured"`` without saying so."""

    def __post_init__(self) -> None:
        if self.comparison not in _COMPARISONS:
            raise ValueError(f"{self.metric}: comparison must be one of {', '.join(_COMPARISONS)}")
        if self.problem is not None and self.problem not in PROBLEMS:
            raise ValueError(
                f"{self.metric}: problem must be one of {', '.join(PROBLEMS)}, got {self.problem!r}"
            )
        object.__setattr__(self, "value", float(self.value))
        if self.threshold is not None:
            object.__setattr__(self, "threshold", float(self.threshold))
            if self.problem is None and math.isnan(self.value):
                object.__setattr__(self, "problem", "not measured")
        object.__setattr__(self, "labels", dict(self.labels))

    @property
    def verdict(self) -> Verdict:
        if self.problem is not None:
            return "fail"
        if self.threshold is None:
            return "info"
        return "pass" if compare(self.value, self.threshold, self.comparison) else "fail"

    @property
    def verdict_label(self) -> str:
        """``PASS``, ``FAIL``, ``INFO``, ``NOT MEASURED`` or ``BROKEN MEASUREMENT``, as tables show it."""
        return (self.problem or self.verdict).upper()

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    @property
    def measured(self) -> bool:
        """False for a threshold the run had no value for (``problem`` "not measured", or a NaN):
        a set-up gap, not a slow cluster. A broken measurement was measured (wrongly)."""
        return self.problem != "not measured" and not math.isnan(self.value)

    @property
    def judged(self) -> bool:
        """Whether the value could be judged at all (no `problem`): the only values a baseline or
        a regression gate may compare."""
        return self.problem is None

    @property
    def key(self) -> str:
        """Identity across runs: metric, scope and labels (not the test id, which may be renamed)."""
        labels = ",".join(f"{k}={self.labels[k]}" for k in sorted(self.labels))
        return f"{self.metric}|{self.scope or ''}|{labels}"


@dataclass(frozen=True, slots=True)
class Measurement(Check):
    """A `Check` as recorded in results.json: also which test judged it, and when."""

    test_id: str = ""
    time: float = 0.0
    attempt: int = 1
    """2 for the confirmation the regression gate measured after a suspected regression; 3 for the
    retest of a suspect node (``--gpucluster-retest-suspects``, ``results/retest.py``)."""

    @classmethod
    def of(cls, check: Check, *, test_id: str, time: float, attempt: int = 1) -> Measurement:
        values = {f.name: getattr(check, f.name) for f in fields(Check)}
        return cls(**values, test_id=test_id, time=time, attempt=attempt)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "test_id": self.test_id,
            "metric": self.metric,
            "value": self.value if math.isfinite(self.value) else None,
            "unit": self.unit,
            "threshold": self.threshold,
            "comparison": self.comparison,
            "verdict": self.verdict,
            "scope": self.scope,
            "labels": dict(self.labels),
            "spread": None if self.spread is None else _spread_json(self.spread),
            "ref": None if self.ref is None else self.ref.to_json(),
            "time": self.time,
        }
        if self.hint:
            data["hint"] = self.hint
        if self.baseline_gate is not None:
            data["baseline_gate"] = self.baseline_gate
        if self.attempt != 1:
            data["attempt"] = self.attempt
        if self.problem is not None:
            data["problem"] = self.problem
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        """Read a measurement of any readable schema version (a version-1 ``source`` is dropped)."""
        spread = data.get("spread")
        ref = data.get("ref")
        value = data.get("value")
        threshold = data.get("threshold")
        return cls(
            metric=str(data["metric"]),
            value=float("nan") if value is None else float(value),
            unit=str(data["unit"]),
            threshold=None if threshold is None else float(threshold),
            comparison=data.get("comparison", ">="),
            ref=None if ref is None else ThresholdRef.from_json(ref),
            scope=data.get("scope"),
            labels=dict(data.get("labels") or {}),
            spread=None
            if spread is None
            else Spread(
                **{
                    **spread,
                    "values": tuple(spread.get("values", ())),
                    "times": tuple(spread.get("times", ())),
                }
            ),
            hint=str(data.get("hint") or ""),
            baseline_gate=_optional_bool(data.get("baseline_gate")),
            problem=_problem(data.get("problem")),
            test_id=str(data.get("test_id", "")),
            time=float(data.get("time") or 0.0),
            attempt=int(data.get("attempt") or 1),
        )


def _optional_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"baseline_gate must be true, false or null, got {value!r}")


def _problem(value: Any) -> Problem | None:
    if value is None or value in PROBLEMS:
        return value
    raise ValueError(f"problem must be one of {', '.join(PROBLEMS)} or null, got {value!r}")


def _spread_json(spread: Spread) -> dict[str, Any]:
    return {
        "median": spread.median,
        "min": spread.min,
        "max": spread.max,
        "mad": spread.mad,
        "n": spread.n,
        "values": list(spread.values),
        **({"times": list(spread.times)} if spread.times else {}),
    }


PREFLIGHT_TEST_ID = "gpucluster::preflight"
"""The outcome a session that stops before launch records in results.json, in place of the tests
it did not run (`session.set_aside`); the findings read it (`results.findings`)."""
SET_ASIDE_TEST_ID = "gpucluster::set-aside"
"""The outcome, and the checks, of the nodes a session set aside before its first job."""
SET_ASIDE_METRIC = "inventory.node_usable"
"""A set-aside node's inventory failure (0 of 1); its ``action`` and ``reason`` labels say what the
set-aside stage found, and the findings take the action from there."""


@dataclass(frozen=True, slots=True)
class TestOutcome:
    test_id: str
    outcome: Literal["passed", "failed", "skipped", "error"]
    category: Category
    duration_s: float
    message: str = ""


def compare(value: float, threshold: float, comparison: Comparison) -> bool:
    if math.isnan(value):
        return False
    if comparison == ">=":
        return value >= threshold
    if comparison == "<=":
        return value <= threshold
    return value == threshold
