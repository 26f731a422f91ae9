"""A fleet baseline: several healthy runs merged into one results file the gate compares against.

``gpucluster baseline merge a.json b.json c.json --out fleet.json``. Per measurement key (the
last value of each run, so a confirmation counts), the fleet's value is the **median over the
runs**, and its noise interval runs from the **lowest low end to the highest high end** of the
runs' own intervals (their repeats' ranges): the gate's rule (``results/gate.py``) then needs a
new value to fall below everything the fleet ever measured by more than the tolerance. The
spread's ``values`` are the runs' values and ``n`` how many runs had the key.

The file is an ordinary results.json (schema version 2, no outcomes) with a ``fleet`` entry
listing the runs; fingerprint fields on which the runs agree are kept, the others read
``mixed: a | b``, and ``hosts`` is the union (so a run on one allocation is compared with the
fleet as medians over hosts; ``results/gate.py``).

Pure but for `write_fleet`; no pytest.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_gpucluster.atomic import write_atomic
from pytest_gpucluster.results.baseline import RunResults, hosts_of
from pytest_gpucluster.results.gate import interval, latest_by_key
from pytest_gpucluster.results.model import SCHEMA_VERSION, Measurement, Spread

__all__ = ["Fleet", "merge_runs", "write_fleet"]


@dataclass(frozen=True, slots=True)
class Fleet:
    measurements: tuple[Measurement, ...]
    runs: tuple[RunResults, ...]
    fingerprint: dict[str, Any]
    profile: dict[str, Any]
    nccl_env: dict[str, str]

    def summary(self) -> str:
        partial = sum(1 for m in self.measurements if m.spread is not None and m.spread.n < len(self.runs))
        return f"fleet baseline of {len(self.runs)} runs, {len(self.measurements)} measurements" + (
            f" ({partial} present in only some of the runs)" if partial else ""
        )

    def to_json(self) -> dict[str, Any]:
        started = [r.started_at for r in self.runs if r.started_at]
        return {
            "schema_version": SCHEMA_VERSION,
            "started_at": max(started) if started else None,
            "updated_at": time.time(),
            "fleet": {
                "method": "per key: the median over the runs; noise: the lowest low end to the highest high "
                "end of the runs' intervals",
                "runs": [
                    {
                        "source": r.source,
                        "started_at": r.started_at,
                        "hosts": hosts_of(r),
                        "measurements": len(r.measurements),
                    }
                    for r in self.runs
                ],
            },
            "profile": self.profile,
            "fingerprint": self.fingerprint,
            "nccl_env": self.nccl_env,
            "measurements": [m.to_json() for m in self.measurements],
            "outcomes": [],
        }


def _merge_key(ms: Sequence[Measurement]) -> Measurement:
    """One fleet measurement from each run's measurement of the same key."""
    latest = ms[-1]
    finite = [m for m in ms if math.isfinite(m.value)]
    if not finite:
        return replace(latest, spread=None, attempt=1)
    values = [m.value for m in finite]
    median = statistics.median(values)
    ends = [interval(m) for m in finite]
    spread = Spread(
        median=median,
        min=min(lo for lo, _ in ends),
        max=max(hi for _, hi in ends),
        mad=statistics.median(abs(v - median) for v in values),
        n=len(values),
        values=tuple(values),
    )
    return replace(latest, value=median, spread=spread, attempt=1)


def _agreed(values: Sequence[Any]) -> Any:
    """The value every run has, or ``mixed: a | b`` (nested mappings merged key by key)."""
    if all(isinstance(v, Mapping) for v in values if v is not None) and any(
        isinstance(v, Mapping) for v in values
    ):
        names = sorted({k for v in values if isinstance(v, Mapping) for k in v})
        return {k: _agreed([v.get(k) if isinstance(v, Mapping) else None for v in values]) for k in names}
    shown = list(dict.fromkeys(json.dumps(v, sort_keys=True, default=str) for v in values))
    if len(shown) == 1:
        return values[0]
    return "mixed: " + " | ".join(str(json.loads(s)) for s in shown)


def merge_runs(runs: Sequence[RunResults]) -> Fleet:
    """The fleet baseline of ``runs`` (module docstring)."""
    per_key: dict[str, list[Measurement]] = {}
    for run in runs:
        for key, m in latest_by_key(run.measurements).items():
            per_key.setdefault(key, []).append(m)
    fingerprint = _agreed([r.fingerprint for r in runs])
    fingerprint["hosts"] = sorted({h for r in runs for h in hosts_of(r)})
    names = {r.profile.get("name") for r in runs}
    profile = dict(runs[-1].profile) if len(names) == 1 else {"name": "mixed: " + " | ".join(map(str, names))}
    return Fleet(
        measurements=tuple(_merge_key(ms) for ms in per_key.values()),
        runs=tuple(runs),
        fingerprint=fingerprint,
        profile=profile,
        nccl_env=_agreed([r.nccl_env for r in runs]) or {},
    )


def write_fleet(fleet: Fleet, path: Path) -> None:
    """Write the fleet baseline atomically (a temp file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(fleet.to_json(), indent=1, default=str))
