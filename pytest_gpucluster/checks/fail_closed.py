"""Fail closed, per node and per GPU: every threshold the profile sets is judged where it must be,
or the run says why it could not be.

A gate that silently passes when its measurement is missing is worse than no gate (NVIDIA's
cluster-readiness engine shipped a bandwidth gate that did exactly that). At the end of a session
each threshold the profile sets (`profile_thresholds`; which keys, who judges them, where and
needing what: `checks/fail_closed_owners.py`) is looked up among the run's measurements by its
profile key (``Check.ref``; a measurement under a key covers it, e.g.
``nccl.net_plugin.min_version`` covers ``nccl.net_plugin``), on every node and GPU of the
inventory its grain asks for (`checks/fail_closed_inventory.py`). One that no measurement covers
somewhere is:

- **excused** when the cluster lacks a capability its tests need, named by the profile or the
  probe (a CPU profile has no GPUs, one node has no inter-node link); never by a skip alone;
- **not run** when no owner ran in this session (deselected by ``-m``/``-k``, or not collected):
  listed, not failed — a quick tier does not fail for the burn-in's thresholds;
- **not measured** otherwise, *where* it is missing: a failing `Check` with ``problem="not
  measured"`` for the whole key when nothing measured it anywhere, else one per node (and GPU)
  that lacks it, labelled with that host and GPU, its hint naming the tests that ran or skipped.

Pure: the profile model, the inventory, measurements and outcomes in; checks and sentences out.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.checks.fail_closed_inventory import Inventory, gpu_id
from pytest_gpucluster.checks.fail_closed_owners import (
    NOT_THRESHOLDS,
    ONLY_WHERE_WRITTEN,
    OWNERS,
    WHOLE,
    Grain,
    KeyPath,
    Owner,
    Rule,
    nccl_owners,
)
from pytest_gpucluster.checks.nccl import expectations_of
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, Measurement, TestOutcome, ThresholdRef

__all__ = [
    "FAIL_CLOSED_TEST_ID",
    "NOT_THRESHOLDS",
    "OWNERS",
    "Coverage",
    "Inventory",
    "Owner",
    "ProfileThreshold",
    "coverage",
    "profile_thresholds",
]

FAIL_CLOSED_TEST_ID = "gpucluster::every-threshold-measured"
"""The outcome a session's unmeasured thresholds fail under (no test of the suite is named so)."""


@dataclass(frozen=True, slots=True)
class ProfileThreshold:
    """One threshold the profile sets, where it is in the file, which tests judge it, where it must
    be measured and what those tests need of the cluster."""

    ref: ThresholdRef
    value: Any
    unit: str
    comparison: str
    owners: tuple[Owner, ...]
    grain: Grain = "cluster"
    needs: tuple[str, ...] = ()


def _pattern(path: KeyPath) -> str:
    text = ""
    for part in path:
        text += "[]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _unit(model: Any, name: str) -> str:
    """The canonical unit a field's value is in, from its annotation (``Bandwidth`` -> ``B/s``)."""
    from pytest_gpucluster.profiles import fields as f

    info = type(model).model_fields[name]
    units = {
        f.parse_bandwidth: "B/s",
        f.parse_bytes: "B",
        f.parse_duration: "s",
        f.parse_fraction: "fraction",
        f.parse_flops: "FLOP/s",
    }
    metadata = [*info.metadata]
    for arg in (info.annotation, *typing.get_args(info.annotation)):
        metadata += getattr(arg, "__metadata__", ())
    for meta in metadata:
        unit = units.get(getattr(meta, "func", None))
        if unit:
            return unit
    return ""


def _sets_nothing(value: Any) -> bool:
    """Null, false and empty values set no threshold (``require_xid_source: false``, ``versions: {}``)."""
    return value is None or value is False or (isinstance(value, (str, tuple, list, dict)) and not value)


def _walk(model: Any, path: KeyPath) -> Iterable[tuple[KeyPath, Any, str]]:
    """(key path, value, unit) of every field under ``model`` that sets something, lists entered."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        here = (*path, name)
        if _sets_nothing(value):
            continue
        if hasattr(type(value), "model_fields"):
            yield from _walk(value, here)
        elif isinstance(value, (list, tuple)) and value and hasattr(type(value[0]), "model_fields"):
            for index, item in enumerate(value):
                yield from _walk(item, (*here, index))
        elif isinstance(value, dict) and _pattern(here) in OWNERS and _pattern(here) not in WHOLE:
            for key, item in value.items():  # per-dtype floors: each entry its own threshold
                if item is not None:
                    yield (*here, str(key)), item, _unit(model, name)
        else:
            yield here, value, _unit(model, name)


def _written(model: Any, path: KeyPath) -> bool:
    """Whether the profile wrote the key (pydantic's ``model_fields_set``), not only its default."""
    node = model
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else getattr(node, str(part))
    return path[-1] in node.model_fields_set


def _comparison(name: str, value: Any) -> str:
    if name.startswith("max_"):
        return "<="
    if name.startswith("min_") or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return ">="
    return "=="


def profile_thresholds(model: ProfileModel) -> list[ProfileThreshold]:
    """Every threshold ``model`` sets (a value that is not null, false or empty), in file order."""
    out: list[ProfileThreshold] = []
    for path, value, unit in _walk(model, ()):
        rule: Rule | None = OWNERS.get(_pattern(path)) or OWNERS.get(_pattern(path[:-1]))
        if rule is None:
            continue
        if _pattern(path) in ONLY_WHERE_WRITTEN and not _written(model, path):
            continue
        ref = ThresholdRef(model.name, path)
        owners, needs = rule.owners(model, path), rule.needs_of(model, path)
        out.append(
            ProfileThreshold(ref, value, unit, _comparison(str(path[-1]), value), owners, rule.grain, needs)
        )
    for expectation in expectations_of(model.nccl):
        path = ("nccl", *expectation.split("."))
        assert model.nccl is not None
        value = getattr(model.nccl, expectation)
        owners = nccl_owners(model, path)
        out.append(
            ProfileThreshold(ThresholdRef(model.name, path), value, "", "==", owners, "cluster", ("cuda",))
        )
    return out


# ------------------------------------------------------------------------------- the verdict


@dataclass(frozen=True, slots=True)
class Unjudged:
    """A threshold nothing measured that does not fail: why (a capability the cluster lacks, or not run)."""

    ref: ThresholdRef
    why: str


@dataclass(slots=True)
class Coverage:
    """The fail-closed verdict of one session."""

    checks: list[Check] = field(default_factory=list)
    """Failing checks (``problem="not measured"``): one per key nothing measured, else one per node
    (and GPU) of the inventory that lacks a value the key's grain asks for."""
    excused: list[Unjudged] = field(default_factory=list)
    """The cluster lacks a capability the key's tests need: which, in the profile's or probe's words."""
    not_run: list[Unjudged] = field(default_factory=list)
    """No owner ran in this session (deselected, not collected)."""
    measured: int = 0
    """Thresholds a measurement covered everywhere their grain asks."""

    def to_json(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "not_measured": list(dict.fromkeys(c.ref.key for c in self.checks if c.ref is not None)),
            "not_measured_where": [
                {"key": c.ref.key, **{k: c.labels[k] for k in ("host", "gpu") if k in c.labels}}
                for c in self.checks
                if c.ref is not None and c.labels
            ],
            "excused": [{"key": u.ref.key, "why": u.why} for u in self.excused],
            "not_run": [u.ref.key for u in self.not_run],
        }


def _covers(threshold: KeyPath, path: KeyPath) -> bool:
    return path[: len(threshold)] == threshold


def _host(labels: Mapping[str, Any]) -> str | None:
    value = labels.get("host", labels.get("node"))
    return None if value is None else str(value)


def _missing_where(
    t: ProfileThreshold, mine: Sequence[Measurement], inventory: Inventory
) -> list[tuple[str, str | None]]:
    """``(host, gpu)`` of each node (gpu None) or GPU of the inventory with no value of ``t``."""
    if t.grain == "cluster" or not inventory.known:
        return []
    seen_hosts: set[str] = set()
    seen_gpus: set[tuple[str, str]] = set()
    names_gpus = False
    for m in mine:
        host = _host(m.labels)
        if host is None:
            continue
        seen_hosts.add(host)
        if t.grain == "gpu" and m.labels.get("gpu") not in (None, ""):
            names_gpus = True
            seen_gpus.add((host, gpu_id(m.labels["gpu"], inventory.bus_ids.get(host))))
    out: list[tuple[str, str | None]] = []
    for host in inventory.hosts:
        gpus = inventory.gpus.get(host, ())
        if t.grain == "gpu" and names_gpus and gpus:
            out += [(host, g) for g in gpus if (host, g) not in seen_gpus]
        elif host not in seen_hosts:
            out.append((host, None))
    return out


def coverage(
    model: ProfileModel,
    measurements: Sequence[Measurement],
    outcomes: Sequence[TestOutcome],
    inventory: Inventory | None = None,
) -> Coverage:
    """Which of the profile's thresholds the run judged, excused, did not run, or missed, and where.

    Without an ``inventory`` (no probe), a key is covered by one value anywhere and only the
    profile names lacking capabilities."""
    inventory = inventory or Inventory.of(model, None)
    # A check recorded under the key judged it there, whatever its verdict: one the test could not
    # measure (problem "not measured") already failed its test, saying why.
    judged = [m for m in measurements if m.ref is not None and m.test_id != FAIL_CLOSED_TEST_ID]
    out = Coverage()
    for t in profile_thresholds(model):
        mine = [m for m in judged if m.ref is not None and _covers(t.ref.key_path, m.ref.key_path)]
        owned = [o for o in outcomes if any(owner.matches(o.test_id) for owner in t.owners)]
        ran = [o for o in owned if o.category != "skipped"]
        lacks = inventory.lacks(t.needs)
        if mine:
            missing = _missing_where(t, mine, inventory)
            if not missing:
                out.measured += 1
            out.checks += [_not_measured(t, owned, host, gpu) for host, gpu in missing]
        elif not owned:
            out.not_run.append(
                Unjudged(t.ref, "no test that judges it ran: " + ", ".join(map(str, t.owners)))
            )
        elif lacks and not ran:
            out.excused.append(Unjudged(t.ref, "; ".join(lacks)))
        else:
            out.checks.append(_not_measured(t, owned))
    return out


def _said(o: TestOutcome) -> str:
    if o.category == "skipped":
        reason = (o.message.splitlines() or ["skipped"])[0].removeprefix("Skipped: ")
        return f"{o.test_id} (skipped: {reason})"
    return f"{o.test_id} ({'passed' if o.category == 'pass' else o.category})"


def _not_measured(
    t: ProfileThreshold, owned: Sequence[TestOutcome], host: str | None = None, gpu: str | None = None
) -> Check:
    tests = "; ".join(_said(o) for o in owned)
    numeric = isinstance(t.value, (int, float)) and not isinstance(t.value, bool)
    where = f"GPU {gpu} of {host}" if gpu is not None else (f"node {host}" if host else "")
    skipped = any(o.category == "skipped" for o in owned)
    why = (
        " A skip excuses a threshold only where the cluster lacks a capability its test needs, named "
        "by the profile or the probe; this skip names none: fix what it says (a missing package, a "
        "before/after pair split across pytest-xdist workers) and rerun."
        if skipped
        else ""
    )
    if where:
        hint = (
            f"The profile sets {t.ref.key} = {t.value!r}, and {where} has no value for it although "
            f"other nodes or GPUs do; the test(s) that judge it: {tests}. A value missing on one node "
            "or GPU is never dropped: look at that rank's log in the job directory (did it crash, "
            "skip, or is the GPU lost?), then retest that node."
        )
    else:
        hint = (
            f"The profile sets {t.ref.key} = {t.value!r}, and no value was recorded under it although "
            f"the test(s) that judge it ran: {tests}.{why} A gate with no value never passes: find why "
            "the test measured nothing for this key (its log, its skip conditions), or remove the key."
        )
    labels: dict[str, Any] = {}
    if host is not None:
        labels["host"] = host
    if gpu is not None:
        labels["gpu"] = gpu
    return Check(
        metric=f"profile.{t.ref.key}",
        value=math.nan,
        unit=t.unit,
        threshold=float(t.value) if numeric else None,  # an expectation (a version, a name): said in the hint
        comparison=t.comparison if numeric else "==",  # type: ignore[arg-type]
        ref=t.ref,
        labels=labels,
        problem="not measured",
        hint=hint,
    )
