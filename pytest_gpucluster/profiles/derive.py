"""Write a profile from a known-good run: every gated measurement becomes a threshold at a margin.

``gpucluster profiles derive RESULTS.json --name NAME --margin 10%`` reads a ``results.json``,
maps each measurement that had a threshold back to the profile key it was gated against, and
writes a profile that ``extends:`` the run's own profile, so the cluster shape, NCCL environment
and everything not measured carry over. The key is the measurement's ``ref`` (a `ThresholdRef`:
``("collectives", "checks", 0, "min_busbw")``, as the checks record it; any ``min_*``/``max_*``
key of a mapping section such as ``burnin:`` works, typed by the schema); a measurement without
one (a results file of schema version 1, a check of one's own) is mapped by its metric name
through :data:`RULES` (one row per metric family: add a row for a new metric). Measurements that
map to nothing (equality checks, inventory, a metric with no row) are listed in the file's header
comment with why. A key gated at several points (one floor, several sizes or ranks) gets the most
lenient of their thresholds. Floors go ``margin`` below the measured value, ceilings ``margin``
above; every threshold line carries a comment with the run, its date, fingerprint and the
measured value. With ``--from-baseline`` and several results files, the value is the median
across runs (a fleet baseline, as SuperBench's ``generate-baseline`` does).

Lists are replaced, not merged, by ``extends:`` (``collectives.checks``, ``sft.cases``,
``scaling.steps``), so the derived file re-states their entries whole: measured ones with
new thresholds, unmeasured ones as the parent had them. The result is validated (schema and
physics) before it is written.

This module decides which threshold goes where; `derive_rules` maps a measurement to its key,
`derive_runs` reads the results files, `derive_text` writes the YAML.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.derive_rules import RULES, UNITS, MetricRule, rule_for
from pytest_gpucluster.profiles.derive_runs import SourceRun, parse_margin, read_run
from pytest_gpucluster.profiles.derive_text import (
    Entry,
    Threshold,
    format_quantity,
    measured_text,
    number,
    render,
)
from pytest_gpucluster.profiles.loader import LoadedProfile, find_profile, load_profile
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Measurement

__all__ = [
    "RULES",
    "DerivedProfile",
    "MetricRule",
    "SourceRun",
    "derive_files",
    "derive_profile",
    "format_quantity",
    "parse_margin",
    "read_run",
    "rule_for",
    "write_derived",
]

# --------------------------------------------------------------------------------------------
# Deriving
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Point:
    """One measured quantity, merged over runs (median) and over repeats inside a run."""

    rule: MetricRule
    groups: dict[str, str]
    sample: Measurement
    values: tuple[float, ...]
    failed: bool

    @property
    def value(self) -> float:
        return statistics.median(self.values)


@dataclass(frozen=True, slots=True)
class DerivedProfile:
    text: str
    thresholds: int
    unmapped: tuple[str, ...]
    notes: tuple[str, ...]


def _size_label(m: Measurement) -> float | None:
    for name in ("size_bytes", "size"):
        value = m.labels.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _scope(m: Measurement) -> str:
    return str(m.scope or m.labels.get("scope") or "intra-node")


def _describe(m: Measurement) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items()))
    scope = f" [{m.scope}]" if m.scope else ""
    return f"{m.metric}{scope}{f' ({labels})' if labels else ''}"


def _collect(runs: Sequence[SourceRun], model: ProfileModel) -> tuple[list[_Point], list[str]]:
    """Group gated measurements by identity across runs; list what maps to no profile key."""
    unmapped: dict[str, str] = {}
    grouped: dict[str, list[tuple[int, Measurement]]] = defaultdict(list)
    for index, run in enumerate(runs):
        for m in run.measurements:
            if m.threshold is None:
                continue
            if m.metric.startswith("inventory."):
                unmapped.setdefault(
                    m.metric, "an inventory check: the cluster section is inherited through extends"
                )
                continue
            if m.comparison == "==":
                unmapped.setdefault(
                    m.metric, "an equality check: no margin applies, the parent's expectation stays"
                )
                continue
            found = rule_for(m, model)
            if found is None:
                unmapped.setdefault(
                    _describe(m), f"no profile key for this metric (value {number(m.value)} {m.unit})"
                )
                continue
            rule, _ = found
            if UNITS[rule.kind] and m.unit not in UNITS[rule.kind]:
                unmapped.setdefault(
                    _describe(m), f"unit {m.unit!r}, expected {' or '.join(UNITS[rule.kind])} for {rule.key}"
                )
                continue
            if not math.isfinite(m.value):
                unmapped.setdefault(_describe(m), "no value was measured")
                continue
            grouped[m.key].append((index, m))
    points = []
    for items in grouped.values():
        sample = items[0][1]
        rule, groups = rule_for(sample, model)  # type: ignore[misc]
        per_run: dict[int, list[float]] = defaultdict(list)
        for index, m in items:
            per_run[index].append(m.value)
        values = tuple(statistics.median(v) for _, v in sorted(per_run.items()))
        failed = any(m.verdict == "fail" for _, m in items)
        points.append(_Point(rule, groups, sample, values, failed))
    order = {(r.target, r.key): i for i, r in reversed(list(enumerate(RULES)))}
    points.sort(key=lambda p: (order.get((p.rule.target, p.rule.key), len(RULES)), p.sample.key))
    return points, [f"{name}: {why}" for name, why in sorted(unmapped.items())]


def _threshold_for(point: _Point, margin: float, runs: Sequence[SourceRun]) -> tuple[Threshold, str | None]:
    rule = point.rule
    value = point.value
    raw = value * (1 - margin) if rule.floor else value * (1 + margin)
    note = None
    if rule.cap is not None and raw > rule.cap:
        raw = rule.cap
        note = f"capped at {format_quantity(rule.cap, rule.kind)}"
    text = format_quantity(raw, rule.kind, up=not rule.floor)
    measured = measured_text(value, rule.kind, point.sample.unit)
    if len(runs) > 1:
        spread = ", ".join(measured_text(v, rule.kind, point.sample.unit) for v in point.values)
        measured = f"median {measured} of {len(point.values)} runs ({spread})"
    else:
        measured = f"measured {measured}"
    side = f"{'-' if rule.floor else '+'}{number(margin * 100)}%"
    parts = [measured, side]
    if note:
        parts.append(note)
    if point.failed:
        parts.append(
            f"missed the run's own threshold {measured_text(point.sample.threshold or 0, rule.kind, point.sample.unit)}"
        )
    return Threshold(rule.key, text, "; ".join(parts), raw, rule.floor), (
        f"{_describe(point.sample)} missed its threshold in the source run; derived from it anyway"
        if point.failed
        else None
    )


def _source_profile(runs: Sequence[SourceRun], extra_dirs: Sequence[Path]) -> tuple[LoadedProfile, str]:
    """The profile the runs used, and how the derived file should name it in ``extends:``."""
    names = {str(r.profile.get("name")) for r in runs}
    if len(names) != 1 or "None" in names:
        listed = ", ".join(f"{r.path}: {r.profile.get('name')}" for r in runs)
        raise ProfileError(f"the results files must come from runs of one profile; got {listed}")
    name = names.pop()
    recorded = runs[0].profile.get("path")
    by_name: Path | None = None
    try:
        by_name = find_profile(name, extra_dirs)
    except ProfileError:
        by_name = None
    if recorded and Path(recorded).is_file():
        path = Path(recorded)
        if by_name is not None and by_name.resolve() == path.resolve():
            return load_profile(str(by_name), extra_dirs), name
        return load_profile(str(path), extra_dirs), str(path.resolve())
    if by_name is not None:
        return load_profile(str(by_name), extra_dirs), name
    raise ProfileError(
        f"cannot find profile {name!r} that {runs[0].path} was run with (recorded path {recorded}); "
        "pass --thresholds-dir with the directory that holds it"
    )


def _extends(parent: LoadedProfile, extends: str, out: Path | None) -> str:
    """How the derived file at ``out`` names its parent: by name, unless that would find another
    file next to it (or itself, when --name repeats the parent's); by a relative path when the
    two live in one tree (a profile repository moves as a whole)."""
    if out is None:
        return extends
    here = Path(out).resolve().parent
    if os.sep not in extends:
        sibling = here / f"{extends}.yaml"
        if sibling.resolve() == Path(out).resolve() or (
            sibling.exists() and sibling.resolve() != parent.path.resolve()
        ):
            extends = str(parent.path.resolve())
    if os.sep in extends:
        relative = os.path.relpath(extends, here)
        if not relative.startswith(".."):
            extends = relative if os.sep in relative else f".{os.sep}{relative}"
    return extends


class _Entries:
    """The parent's list entries (collective checks, SFT cases, scaling steps) and the mapping
    sections a derived threshold goes into; new entries for points the parent has none for."""

    def __init__(self, model: ProfileModel) -> None:
        self.model = model
        self.checks: dict[tuple[Any, ...], Entry] = {}
        for check in model.collectives.checks:
            ident = (check.collective, check.scope, float(check.size))
            self.checks.setdefault(ident, Entry(ident, check))
        self.cases = {c.name: Entry((c.name,), c) for c in model.sft.cases}
        steps = model.scaling.steps if model.scaling is not None else ()
        self.steps = {(s.from_nodes, s.to_nodes): Entry((s.from_nodes, s.to_nodes), s) for s in steps}
        self.sections: dict[str, Entry] = {}

    def entry_for(self, point: _Point) -> Entry | str:
        """The entry the point's threshold belongs in, or why it belongs nowhere."""
        m, target, groups, model = point.sample, point.rule.target, point.groups, self.model
        if target == "collective" and "check" in groups:
            check = model.collectives.checks[int(groups["check"])]
            return self.checks[(check.collective, check.scope, float(check.size))]
        if target == "collective":
            size, scope = _size_label(m), _scope(m)
            if size is None or scope not in ("intra-node", "inter-node", "full"):
                return f"{_describe(m)}: needs a size_bytes label and a scope to become a collectives check"
            ident = (groups.get("collective", ""), scope, size)
            return self.checks.setdefault(ident, Entry(ident))
        if target == "sft":
            case = groups.get("case") or str(m.labels.get("case", ""))
            return self.cases.get(case) or f"{_describe(m)}: sft case {case!r} is not in profile {model.name}"
        if target == "scaling" and "step" in groups and model.scaling is not None:
            step = model.scaling.steps[int(groups["step"])]
            return self.steps[(step.from_nodes, step.to_nodes)]
        if target == "scaling":
            lo = m.labels.get("from_nodes", m.labels.get("from"))
            hi = m.labels.get("to_nodes", m.labels.get("to"))
            if model.scaling is None or lo is None or hi is None:
                return f"{_describe(m)}: needs from_nodes/to_nodes labels and a scaling section"
            return self.steps.setdefault((int(lo), int(hi)), Entry((int(lo), int(hi))))
        return self.sections.setdefault(target, Entry((target,)))


def _keep(entry: Entry, threshold: Threshold) -> bool:
    """Put ``threshold`` in ``entry``; True when its key is new there. A key gated at several points
    (nvlink.min_speedup at each size) must hold at all of them: the most lenient one is kept."""
    earlier = entry.thresholds.get(threshold.key)
    if earlier is None:
        entry.thresholds[threshold.key] = threshold
        return True
    lenient = threshold.value < earlier.value if threshold.floor else threshold.value > earlier.value
    kept = threshold if lenient else earlier
    entry.thresholds[threshold.key] = dataclasses.replace(
        kept,
        points=earlier.points + 1,
        comment=f"{kept.comment.split(' [')[0]} [the most lenient of {earlier.points + 1} measured points]",
    )
    return False


def derive_profile(
    runs: Sequence[SourceRun],
    *,
    name: str,
    margin: float,
    extra_dirs: Sequence[Path] = (),
    out: Path | None = None,
) -> DerivedProfile:
    """The text of a derived profile (not yet written or validated; see :func:`write_derived`)."""
    if not runs:
        raise ProfileError("derive needs at least one results.json")
    parent, extends = _source_profile(runs, extra_dirs)
    points, unmapped = _collect(runs, parent.model)
    entries = _Entries(parent.model)
    notes: list[str] = []
    count = 0
    for point in points:
        entry = entries.entry_for(point)
        if isinstance(entry, str):
            unmapped.append(entry)
            continue
        threshold, note = _threshold_for(point, margin, runs)
        count += _keep(entry, threshold)
        if note:
            notes.append(note)
    text = render(
        runs,
        parent=parent,
        extends=_extends(parent, extends, out),
        name=name,
        margin=margin,
        checks=list(entries.checks.values()),
        cases=list(entries.cases.values()),
        steps=list(entries.steps.values()),
        sections=entries.sections,
        unmapped=unmapped,
    )
    return DerivedProfile(text, count, tuple(unmapped), tuple(notes))


def write_derived(
    derived: DerivedProfile, out: Path, extra_dirs: Sequence[Path] = (), *, force: bool = False
) -> LoadedProfile:
    """Validate the derived profile (schema and physics) and write it; nothing is written on error."""
    if out.exists() and not force:
        raise ProfileError(f"{out} exists; pass --force to overwrite it, or --out another file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.yaml")
    tmp.write_text(derived.text, encoding="utf-8")
    try:
        load_profile(str(tmp), extra_dirs)
    except ProfileError as exc:
        tmp.unlink(missing_ok=True)
        raise ProfileError(
            f"the derived profile does not validate, so {out} was not written:\n{exc}"
        ) from None
    os.replace(tmp, out)
    return load_profile(str(out), extra_dirs)


def derive_files(
    paths: Iterable[Path],
    *,
    name: str,
    margin_text: str,
    from_baseline: bool,
    out: Path | None,
    extra_dirs: Sequence[Path] = (),
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """The ``gpucluster profiles derive`` command: read, derive, validate, write; return the file."""
    paths = list(paths)
    if len(paths) > 1 and not from_baseline:
        raise ProfileError(
            f"{len(paths)} results files given: pass --from-baseline to take the median across runs"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ProfileError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names a file)")
    margin = parse_margin(margin_text)
    runs = [read_run(p) for p in paths]
    target = out if out is not None else Path(f"{name}.yaml")
    derived = derive_profile(runs, name=name, margin=margin, extra_dirs=extra_dirs, out=target)
    if derived.thresholds == 0:
        raise ProfileError(
            f"no measurement in {', '.join(str(p) for p in paths)} maps to a profile threshold "
            f"({len(derived.unmapped)} unmapped); nothing to derive"
        )
    loaded = write_derived(derived, target, extra_dirs, force=force)
    echo(
        f"wrote {target}: {derived.thresholds} thresholds at {margin_text} margin, extends {loaded.chain[1]}"
    )
    for note in derived.notes:
        echo(f"note: {note}")
    for warning in loaded.warnings:
        echo(f"warning: {warning}")
    if derived.unmapped:
        echo(
            f"{len(derived.unmapped)} measurement(s) not turned into thresholds (listed in the file's comments)"
        )
    return target
