"""A results.json turned into the history store's rows: the run, each measurement with the node
and component it names, each test outcome, each finding.

The node of a measurement is its ``host`` label (``node`` in the fabric and DCGM checks); its
component, the finest place on that node the labels name: a GPU (``gpu``; ``all`` names the
node), a fabric port (``device`` and ``port``), else a rank. A value without a host label (a
cluster-wide busbw) belongs to no node: stored, never counted against one.

Pure: no I/O, no sqlite.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.results.baseline import RunResults, hosts_of
from pytest_gpucluster.results.findings import Finding, findings_of, host_of
from pytest_gpucluster.results.model import SCHEMA_VERSION, Measurement

__all__ = [
    "RunRows",
    "component_of",
    "finding_component",
    "finding_row",
    "host_of",
    "run_key",
    "run_rows",
]

HEADER_KEYS = ("started_at", "profile", "fingerprint", "nccl_env", "regression", "fleet", "tier", "jobs")
"""What of a results.json's header the store keeps (with the nodes' facts), to rebuild the run
for the regression gate, and its job times for a later dry run's calibration (``plans/calibration.py``)."""


def component_of(labels: Mapping[str, Any]) -> str | None:
    """The place on the node: ``GPU 3``, ``port mlx5_0/1``, ``rank 5``; None for the node itself."""
    gpu = labels.get("gpu")
    if gpu not in (None, "", "all"):
        text = str(gpu)
        return text if text.upper().startswith("GPU") else f"GPU {text}"
    device = labels.get("device")
    if device not in (None, ""):
        port = labels.get("port")
        return f"port {device}/{port}" if port not in (None, "") else f"port {device}"
    rank = labels.get("rank")
    if rank not in (None, "") and not isinstance(rank, bool):
        return f"rank {rank}"
    return None


def run_key(run: RunResults) -> str:
    """Identity of a run across appends: its start time, the machine that ran pytest, its hosts
    and profile. The session's own append and a later ``gpucluster history add`` of the same
    results.json agree on it, so the run is stored once."""
    fingerprint = run.fingerprint
    parts = {
        "started_at": run.started_at,
        "hostname": fingerprint.get("hostname"),
        "hosts": hosts_of(run),
        "profile": run.profile.get("name"),
    }
    if run.started_at is None:  # a hand-merged file: its content is its identity
        parts["measurements"] = [m.to_json() for m in run.measurements]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RunRows:
    run_key: str
    run: tuple[Any, ...]
    measurements: tuple[tuple[Any, ...], ...]
    outcomes: tuple[tuple[Any, ...], ...]
    findings: tuple[tuple[Any, ...], ...]


def _measurement_row(m: Measurement) -> tuple[Any, ...]:
    value = m.value if math.isfinite(m.value) else None
    data = json.dumps(m.to_json(), default=str)
    return (
        m.key, m.metric, host_of(m.labels), component_of(m.labels), value, m.unit, m.threshold,
        m.verdict, m.test_id, m.attempt, data,
    )  # fmt: skip


def finding_component(finding: Finding) -> str | None:
    """The component a finding names, named as `component_of` names a measurement's."""
    if finding.gpu:
        return component_of({"gpu": finding.gpu})
    if finding.port:
        return f"port {finding.port}"
    return component_of({k: v for k, v in finding.labels.items() if k == "rank"})


def finding_row(finding: Finding) -> tuple[Any, ...]:
    """One finding (``results/findings.py``): its node, component, metric, reason class and next
    action as columns, the whole finding as JSON."""
    return (
        finding.host,
        finding_component(finding),
        finding.metric,
        finding.reason,
        finding.action,
        json.dumps(finding.to_json(), default=str),
    )


def run_rows(run: RunResults, *, added_at: float | None = None) -> RunRows:
    """The rows of one run. Its findings are built from its measurements and outcomes
    (`findings_of`, as ``gpucluster report`` does), so a results.json of any version has them."""
    header: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    for name in HEADER_KEYS:
        value = getattr(run, name)
        if value not in (None, {}, ()):
            header[name] = value
    if run.nodes:
        header["nodes"] = {"nodes": list(run.nodes)}
    measurements = tuple(_measurement_row(m) for m in run.measurements)
    failed_tests = sum(1 for o in run.outcomes if o.outcome in ("failed", "error"))
    failed_checks = sum(1 for m in _latest(run.measurements) if m.failed)
    hosts = hosts_of(run) or sorted({h for m in run.measurements if (h := host_of(m.labels))})
    version = SCHEMA_VERSION  # what the measurements are written as, whatever the file was
    row = (
        run_key(run), run.source, run.started_at, time.time() if added_at is None else added_at,
        run.profile.get("name"), json.dumps(hosts), failed_tests, len(run.outcomes), failed_checks,
        version, json.dumps(header, default=str),
    )  # fmt: skip
    outcomes = tuple(
        (o.test_id, o.outcome, o.category, float(o.duration_s), o.message or "") for o in run.outcomes
    )
    findings = findings_of(run.measurements, run.outcomes, hosts)
    return RunRows(row[0], row, measurements, outcomes, tuple(finding_row(f) for f in findings))


def _latest(measurements: Sequence[Measurement]) -> list[Measurement]:
    """The value that counts per key: a confirmation supersedes its first try."""
    return list({m.key: m for m in measurements}.values())
