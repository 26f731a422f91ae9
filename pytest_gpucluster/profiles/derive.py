"""Write a profile from a known-good run: every gated measurement becomes a threshold at a margin.

``gpucluster profiles derive RESULTS.json --name NAME --margin 10%`` reads a ``results.json``,
maps each measurement that had a threshold back to the profile key it was gated against, and
writes a profile that ``extends:`` the run's own profile, so the cluster shape, NCCL environment
and everything not measured carry over. The key is the measurement's ``ref`` (a `ThresholdRef`:
``("collectives", "checks", 0, "min_busbw")``, as the checks record it; any ``min_*``/``max_*``
key of a mapping section such as ``burnin:`` works, typed by the schema); a measurement without
one (a results file of schema version 1, a check of one's own) is mapped by its metric name
through :data:`RULES` (one row per metric family: add a row for a new metric). Measurements that map to nothing (equality checks, inventory, a
metric with no row) are listed in the file's header comment with why. A key gated at several
points (one floor, several sizes or ranks) gets the most lenient of their thresholds. Floors go ``margin`` below the measured value, ceilings ``margin``
above; every threshold line carries a comment with the run, its date, fingerprint and the
measured value. With ``--from-baseline`` and several results files, the value is the median
across runs (a fleet baseline, as SuperBench's ``generate-baseline`` does).

Lists are replaced, not merged, by ``extends:`` (``collectives.checks``, ``sft.cases``,
``scaling.steps``), so the derived file re-states their entries whole: measured ones with
new thresholds, unmeasured ones as the parent had them. The result is validated (schema and
physics) before it is written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import re
import statistics
import typing
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.loader import LoadedProfile, find_profile, load_profile
from pytest_gpucluster.profiles.quantities import parse_fraction
from pytest_gpucluster.profiles.schema import CollectiveCheck, ProfileModel, ScalingStep, SftCase
from pytest_gpucluster.results.model import Measurement, ThresholdRef

__all__ = ["RULES", "DerivedProfile", "MetricRule", "SourceRun", "derive_profile", "parse_margin", "read_run"]

Kind = Literal["bandwidth", "duration", "size", "fraction", "flops", "number"]
Target = str
"""``collective``, ``sft``, ``scaling`` (list entries), or the name of a mapping section (``nvlink``,
``burnin``...) whose ``min_*``/``max_*`` keys are thresholds."""

_UNITS: dict[Kind, tuple[str, ...]] = {
    "bandwidth": ("B/s",),
    "duration": ("s",),
    "size": ("B",),
    "fraction": ("fraction",),
    "flops": ("FLOP/s",),
    "number": (),  # any unit: samples/s, tokens/s, x
}


@dataclass(frozen=True, slots=True)
class MetricRule:
    """How one family of metrics maps back to a profile key."""

    pattern: str
    """Regex on ``Measurement.metric``; named groups ``collective`` / ``case`` name the entry."""
    target: Target
    key: str
    """The threshold key inside the entry (``min_busbw``, ``max_step_time``...)."""
    kind: Kind
    cap: float | None = None
    """Largest value the threshold may take (100% for efficiencies), whatever was measured."""

    @property
    def floor(self) -> bool:
        """``min_*`` (also ``pair_min_busbw``...) is a floor; ``max_*`` a ceiling."""
        return "_min_" in f"_{self.key}"


RULES: tuple[MetricRule, ...] = (
    MetricRule(r"collectives\.(?P<collective>[a-z_]+)\.busbw", "collective", "min_busbw", "bandwidth"),
    MetricRule(r"collectives\.(?P<collective>[a-z_]+)\.latency", "collective", "max_latency", "duration"),
    MetricRule(r"sft\.(?:(?P<case>[^.]+)\.)?step_time(_median)?", "sft", "max_step_time", "duration"),
    MetricRule(r"sft\.(?:(?P<case>[^.]+)\.)?samples_per_s", "sft", "min_samples_per_s", "number"),
    MetricRule(
        r"sft\.(?:(?P<case>[^.]+)\.)?tokens_per_s_per_(gpu|device|rank)",
        "sft",
        "min_tokens_per_s_per_gpu",
        "number",
    ),
    MetricRule(r"sft\.(?:(?P<case>[^.]+)\.)?mfu", "sft", "min_mfu", "fraction", cap=1.0),
    MetricRule(r"sft\.(?:(?P<case>[^.]+)\.)?peak_memory(_[a-z]+)?", "sft", "max_peak_memory", "size"),
    MetricRule(r"sft\.(?:(?P<case>[^.]+)\.)?gpu_util(ization)?", "sft", "min_gpu_util", "fraction", cap=1.0),
    MetricRule(
        r"scaling\.(?:(?P<case>[^.]+)\.)?efficiency", "scaling", "min_efficiency", "fraction", cap=1.0
    ),
    MetricRule(r"nvlink\.speedup", "nvlink", "min_speedup", "number"),
    MetricRule(r"nvlink\.link_speed", "nvlink", "min_link_speed", "bandwidth"),
    MetricRule(r"nvlink\.counter_fraction", "nvlink", "min_counter_fraction", "fraction"),
    MetricRule(r"nvlink\.busbw", "nvlink", "min_busbw", "bandwidth"),
    MetricRule(r"nvlink\.isolated_intra\.busbw", "nvlink", "isolated_intra_min_busbw", "bandwidth"),
    MetricRule(r"nvlink\.isolated_inter\.busbw", "nvlink", "isolated_inter_min_busbw", "bandwidth"),
)
"""Metric family -> profile key. A measurement no rule matches is listed in the file's comments."""


def rule_for(m: Measurement, model: ProfileModel | None = None) -> tuple[MetricRule, dict[str, str]] | None:
    """The rule for a measurement, and the entry it names (``collective``, ``case``, ``check``, ``step``).

    The measurement's ``ref`` (the key the check was judged against) wins: it names the exact key
    whatever the metric is called. Otherwise the metric name is matched against :data:`RULES`.
    """
    if m.ref is not None and model is not None:
        found = _rule_from_ref(m.metric, m.ref, model)
        if found is not None:
            return found
    for rule in RULES:
        match = re.fullmatch(rule.pattern, m.metric)
        if match:
            return rule, {k: v for k, v in match.groupdict().items() if v is not None}
    return None


_PARSERS_KIND: dict[str, Kind] = {
    "parse_bandwidth": "bandwidth",
    "parse_duration": "duration",
    "parse_bytes": "size",
    "parse_fraction": "fraction",
    "parse_flops": "flops",
}


def _mapping_sections() -> tuple[str, ...]:
    """Top-level profile sections that are one mapping (not ``cluster``): nvlink, burnin, ..."""
    from pytest_gpucluster.profiles.loader import _model_of

    return tuple(
        name
        for name, info in ProfileModel.model_fields.items()
        if name not in ("cluster", "collectives", "sft", "scaling") and _model_of(info.annotation) is not None
    )


def _field_kind(section: str, key: str) -> Kind | None:
    """How a ``min_*``/``max_*`` key of a mapping section is written, from the schema; None for
    what takes no margin (integers such as a PCIe generation, lists, flags)."""
    from pytest_gpucluster.profiles.loader import _model_of

    if "_min_" not in f"_{key}" and "_max_" not in f"_{key}":
        return None
    model = _model_of(ProfileModel.model_fields[section].annotation)
    info = model.model_fields.get(key) if model is not None else None
    if info is None:
        return None
    metadata = list(info.metadata)
    plain = set()
    for arg in typing.get_args(info.annotation) or (info.annotation,):
        if typing.get_origin(arg) is typing.Annotated:
            metadata += arg.__metadata__
        elif arg is not type(None):
            plain.add(arg)
    for meta in metadata:
        name = getattr(getattr(meta, "func", None), "__name__", "")
        if name in _PARSERS_KIND:
            return _PARSERS_KIND[name]
    return "number" if plain == {float} else None


_LISTS = {"collectives": "checks", "sft": "cases", "scaling": "steps"}
"""Sections whose thresholds sit in list entries: ``collectives.checks[i].min_busbw``."""


def _ref_entry(ref: ThresholdRef, model: ProfileModel) -> tuple[Target, str, dict[str, str]] | None:
    """(target, key, entry groups) of a key path, or None when the profile has no such entry."""
    path = ref.key_path
    section = str(path[0])
    if section in _LISTS and len(path) == 4 and path[1] == _LISTS[section] and isinstance(path[2], int):
        index, key = path[2], str(path[3])
        if section == "collectives" and index < len(model.collectives.checks):
            return (
                "collective",
                key,
                {"collective": model.collectives.checks[index].collective, "check": str(index)},
            )
        if section == "sft" and index < len(model.sft.cases):
            return "sft", key, {"case": model.sft.cases[index].name}
        if section == "scaling" and model.scaling is not None and index < len(model.scaling.steps):
            return "scaling", key, {"step": str(index)}
        return None
    if len(path) == 2 and section in _mapping_sections():
        return section, str(path[1]), {}
    return None


def _rule_from_ref(
    metric: str, ref: ThresholdRef, model: ProfileModel
) -> tuple[MetricRule, dict[str, str]] | None:
    entry = _ref_entry(ref, model)
    if entry is None:
        return None
    target, key, groups = entry
    rule = next((r for r in RULES if (r.target, r.key) == (target, key)), None)
    if rule is None and target not in ("collective", "sft", "scaling"):
        kind = _field_kind(target, key)
        if kind is None:
            return None
        return MetricRule(re.escape(metric), target, key, kind, 1.0 if kind == "fraction" else None), groups
    if rule is None:
        return None
    return MetricRule(re.escape(metric), target, key, rule.kind, rule.cap), groups


# --------------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceRun:
    """One results.json: its measurements and where they come from."""

    path: Path
    measurements: tuple[Measurement, ...]
    profile: Mapping[str, Any]
    fingerprint: Mapping[str, Any]
    started_at: float | None

    @property
    def date(self) -> str:
        if self.started_at is None:
            return "unknown date"
        stamp = dt.datetime.fromtimestamp(float(self.started_at), tz=dt.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M UTC")

    @property
    def fingerprint_id(self) -> str:
        text = json.dumps(self.fingerprint, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def fingerprint_line(self) -> str:
        fp = self.fingerprint
        versions = fp.get("versions") or {}
        gpus = f"{fp.get('gpu_count', 0)} x {fp.get('gpu_model')}" if fp.get("gpu_count") else "no GPU"
        hosts = fp.get("hosts") or [fp.get("hostname")]
        soft = ", ".join(
            f"{name} {versions[name]}"
            for name in ("torch", "nccl", "cuda", "driver", "deepspeed")
            if versions.get(name)
        )
        return f"hosts {', '.join(str(h) for h in hosts if h)}; {gpus}; {soft}; fingerprint {self.fingerprint_id}"


def read_run(path: Path) -> SourceRun:
    """Read a results.json; ProfileError names the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read results file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise ProfileError(f"{path} is not a pytest-gpucluster results.json (no 'measurements' list)")
    try:
        measurements = tuple(Measurement.from_json(m) for m in data["measurements"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ProfileError(f"{path}: a measurement is malformed: {exc}") from None
    return SourceRun(
        path=Path(path),
        measurements=measurements,
        profile=data.get("profile") or {},
        fingerprint=data.get("fingerprint") or {},
        started_at=data.get("started_at"),
    )


def parse_margin(text: str) -> float:
    """``"10%"`` -> 0.1; a bare number above 1 is read as percent (``10`` -> 0.1)."""
    try:
        value = parse_fraction(text if "%" in text or float(text) <= 1 else f"{text}%")
    except ValueError:
        raise ProfileError(f"--margin {text!r}: expected a percentage such as 10%") from None
    if not 0 <= value < 1:
        raise ProfileError(f"--margin {text!r}: expected a percentage from 0% to below 100%")
    return value


# --------------------------------------------------------------------------------------------
# Formatting quantities back into profile units
# --------------------------------------------------------------------------------------------


def _round(x: float, up: bool, sig: int = 3) -> float:
    """Round to ``sig`` significant digits, away from the measured value's side of the margin."""
    if x == 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(abs(x))) - (sig - 1))
    q = x / scale
    q = math.ceil(q - 1e-9) if up else math.floor(q + 1e-9)
    return float(f"{q * scale:.{sig}g}")


def _num(x: float) -> str:
    return f"{x:.6g}"


def format_quantity(value: float, kind: Kind, up: bool | None = None, digits: int = 6) -> str:
    """A profile quantity for ``value`` in canonical units; ``up`` rounds to 3 significant digits
    (up or down), None keeps ``digits``."""

    def r(x: float) -> str:
        return f"{x:.{digits}g}" if up is None else _num(_round(x, up))

    if kind == "bandwidth":
        return f"{r(value / 1e9)}GB/s"
    if kind == "flops":
        return f"{r(value / 1e12)}TFLOP/s"
    if kind == "duration":
        for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if value >= scale or unit == "us":
                return f"{r(value / scale)}{unit}"
    if kind == "size":
        for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= scale:
                return f"{r(value / scale)}{unit}"
        return f"{r(value)}B"
    if kind == "fraction":
        return f"{r(value * 100)}%"
    return r(value)


def _exact_size(n: float) -> str:
    n = int(n)
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _measured(value: float, kind: Kind, unit: str) -> str:
    if kind == "number":
        return f"{value:.4g} {unit}".strip()
    return format_quantity(value, kind, digits=4)


def _scalar(value: Any) -> str:
    """A YAML scalar; strings double-quoted (a JSON string is a YAML one), safe in flow mappings."""
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_/.][A-Za-z0-9_./+-]*", value) and yaml.safe_load(value) == value
        return value if plain else json.dumps(value, ensure_ascii=False)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


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
class _Threshold:
    key: str
    text: str
    comment: str
    value: float
    """The threshold in canonical units, to pick the most lenient of several points."""
    floor: bool
    points: int = 1


@dataclass
class _Entry:
    """A list entry (check, case, step) or a mapping section (nvlink, burnin), with thresholds to set."""

    identity: tuple[Any, ...]
    parent: Any = None
    thresholds: dict[str, _Threshold] = field(default_factory=dict)


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
                    _describe(m), f"no profile key for this metric (value {_num(m.value)} {m.unit})"
                )
                continue
            rule, _ = found
            if _UNITS[rule.kind] and m.unit not in _UNITS[rule.kind]:
                unmapped.setdefault(
                    _describe(m), f"unit {m.unit!r}, expected {' or '.join(_UNITS[rule.kind])} for {rule.key}"
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


def _threshold_for(point: _Point, margin: float, runs: Sequence[SourceRun]) -> tuple[_Threshold, str | None]:
    rule = point.rule
    value = point.value
    raw = value * (1 - margin) if rule.floor else value * (1 + margin)
    note = None
    if rule.cap is not None and raw > rule.cap:
        raw = rule.cap
        note = f"capped at {format_quantity(rule.cap, rule.kind)}"
    text = format_quantity(raw, rule.kind, up=not rule.floor)
    measured = _measured(value, rule.kind, point.sample.unit)
    if len(runs) > 1:
        spread = ", ".join(_measured(v, rule.kind, point.sample.unit) for v in point.values)
        measured = f"median {measured} of {len(point.values)} runs ({spread})"
    else:
        measured = f"measured {measured}"
    side = f"{'-' if rule.floor else '+'}{_num(margin * 100)}%"
    parts = [measured, side]
    if note:
        parts.append(note)
    if point.failed:
        parts.append(
            f"missed the run's own threshold {_measured(point.sample.threshold or 0, rule.kind, point.sample.unit)}"
        )
    return _Threshold(rule.key, text, "; ".join(parts), raw, rule.floor), (
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
    if out is not None:
        here = Path(out).resolve().parent
        if os.sep not in extends:
            # a name is looked up next to the derived file first: that must not find another file
            # (or the derived file itself, when --name repeats the parent's name)
            sibling = here / f"{extends}.yaml"
            if sibling.resolve() == Path(out).resolve() or (
                sibling.exists() and sibling.resolve() != parent.path.resolve()
            ):
                extends = str(parent.path.resolve())
        if os.sep in extends:
            relative = os.path.relpath(extends, here)  # a profile repository moves as a whole
            if not relative.startswith(".."):
                extends = relative if os.sep in relative else f".{os.sep}{relative}"
    model = parent.model
    points, unmapped = _collect(runs, model)
    notes: list[str] = []

    checks: dict[tuple[Any, ...], _Entry] = {}
    for check in model.collectives.checks:
        ident = (check.collective, check.scope, float(check.size))
        checks.setdefault(ident, _Entry(ident, check))
    cases: dict[str, _Entry] = {c.name: _Entry((c.name,), c) for c in model.sft.cases}
    steps: dict[tuple[Any, ...], _Entry] = {}
    if model.scaling is not None:
        for step in model.scaling.steps:
            steps[(step.from_nodes, step.to_nodes)] = _Entry((step.from_nodes, step.to_nodes), step)
    sections: dict[str, _Entry] = {}

    count = 0
    for point in points:
        m = point.sample
        if point.rule.target == "collective" and "check" in point.groups:
            check = model.collectives.checks[int(point.groups["check"])]
            entry = checks[(check.collective, check.scope, float(check.size))]
        elif point.rule.target == "collective":
            size = _size_label(m)
            collective = point.groups.get("collective", "")
            scope = _scope(m)
            if size is None or scope not in ("intra-node", "inter-node", "full"):
                unmapped.append(
                    f"{_describe(m)}: needs a size_bytes label and a scope to become a collectives check"
                )
                continue
            entry = checks.setdefault((collective, scope, size), _Entry((collective, scope, size)))
        elif point.rule.target == "sft":
            case = point.groups.get("case") or str(m.labels.get("case", ""))
            if case not in cases:
                unmapped.append(f"{_describe(m)}: sft case {case!r} is not in profile {model.name}")
                continue
            entry = cases[case]
        elif point.rule.target == "scaling" and "step" in point.groups and model.scaling is not None:
            step = model.scaling.steps[int(point.groups["step"])]
            entry = steps[(step.from_nodes, step.to_nodes)]
        elif point.rule.target == "scaling":
            lo = m.labels.get("from_nodes", m.labels.get("from"))
            hi = m.labels.get("to_nodes", m.labels.get("to"))
            if model.scaling is None or lo is None or hi is None:
                unmapped.append(f"{_describe(m)}: needs from_nodes/to_nodes labels and a scaling section")
                continue
            entry = steps.setdefault((int(lo), int(hi)), _Entry((int(lo), int(hi))))
        else:
            entry = sections.setdefault(point.rule.target, _Entry((point.rule.target,)))
        threshold, note = _threshold_for(point, margin, runs)
        earlier = entry.thresholds.get(threshold.key)
        if earlier is None:
            entry.thresholds[threshold.key] = threshold
            count += 1
        else:
            # several points gated by one key (nvlink.min_speedup at each size): the threshold
            # must hold at all of them, so the lowest floor / highest ceiling wins
            lenient = threshold.value < earlier.value if threshold.floor else threshold.value > earlier.value
            kept = threshold if lenient else earlier
            entry.thresholds[threshold.key] = dataclasses.replace(
                kept,
                points=earlier.points + 1,
                comment=f"{kept.comment.split(' [')[0]} [the most lenient of {earlier.points + 1} measured points]",
            )
        if note:
            notes.append(note)

    text = _render(
        runs,
        parent=parent,
        extends=extends,
        name=name,
        margin=margin,
        checks=list(checks.values()),
        cases=list(cases.values()),
        steps=list(steps.values()),
        sections=sections,
        unmapped=unmapped,
    )
    return DerivedProfile(text, count, tuple(unmapped), tuple(notes))


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------

_CASE_QUANTITIES: dict[str, Kind] = {
    "max_step_time": "duration",
    "max_peak_memory": "size",
    "min_mfu": "fraction",
    "min_gpu_util": "fraction",
}


def _header(runs: Sequence[SourceRun], parent: LoadedProfile, margin: float) -> list[str]:
    lines = [
        "# Derived by `gpucluster profiles derive` from a known-good run: every gated measurement",
        f"# is a threshold {_num(margin * 100)}% on the safe side of its measured value (floors below,",
        "# ceilings above). The comment on each threshold gives the measured value.",
    ]
    for run in runs:
        lines += [
            f"# Source run: {run.path.resolve()} ({run.date}), profile {run.profile.get('name')}"
            f" (sha256 {str(run.profile.get('sha256', ''))[:12]})",
            f"#   {run.fingerprint_line()}",
        ]
    if len(runs) > 1:
        lines.append(f"# Each value is the median across these {len(runs)} runs (fleet baseline).")
    recorded = {str(r.profile.get("sha256")) for r in runs}
    if parent.sha256 not in recorded:
        lines.append(
            f"# NOTE: {parent.path} has changed since the run (sha256 {parent.sha256[:12]} now); "
            "inherited values are today's."
        )
    lines.append(f"# Thresholds the run did not measure are inherited from {parent.name} through extends:.")
    return lines


def _check_line(entry: _Entry, tag: str) -> list[str]:
    collective, scope, size = entry.identity
    parent: CollectiveCheck | None = entry.parent
    fields = [f"collective: {collective}", f"scope: {scope}", f"size: {_exact_size(size)}"]
    comments = []
    for key, kind in (("min_busbw", "bandwidth"), ("max_latency", "duration")):
        if key in entry.thresholds:
            threshold = entry.thresholds[key]
            fields.append(f"{key}: {threshold.text}")
            comments.append(f"{key}: {threshold.comment}")
        elif parent is not None and getattr(parent, key) is not None:
            fields.append(f"{key}: {format_quantity(getattr(parent, key), kind)}")  # type: ignore[arg-type]
            comments.append(f"{key}: not measured, kept from the parent")
    if entry.thresholds:
        fields.append(f"source: {_scalar(tag)}")
    elif parent is not None and parent.source:
        fields.append(f"source: {_scalar(parent.source)}")
    lines = [f"    # {c}" for c in comments]
    lines.append(f"    - {{{', '.join(fields)}}}")
    return lines


def _case_lines(entry: _Entry, tag: str) -> list[str]:
    case: SftCase = entry.parent
    lines = []
    if not entry.thresholds:
        lines.append("    # not measured in the source run: as the parent has it")
    set_fields = [f for f in SftCase.model_fields if f in case.model_fields_set and f != "source"]
    keys = list(dict.fromkeys([*set_fields, *entry.thresholds]))
    first = True
    for key in keys:
        prefix = "    - " if first else "      "
        first = False
        if key in entry.thresholds:
            threshold = entry.thresholds[key]
            lines.append(f"{prefix}{key}: {threshold.text}    # {threshold.comment}")
            continue
        value = getattr(case, key)
        if key in _CASE_QUANTITIES and value is not None:
            text = format_quantity(value, _CASE_QUANTITIES[key])
        else:
            text = _scalar(value)
        lines.append(f"{prefix}{key}: {text}")
    source = tag if entry.thresholds else case.source
    if source:
        lines.append(f"      source: {_scalar(source)}")
    return lines


def _render(
    runs: Sequence[SourceRun],
    *,
    parent: LoadedProfile,
    extends: str,
    name: str,
    margin: float,
    checks: list[_Entry],
    cases: list[_Entry],
    steps: list[_Entry],
    sections: dict[str, _Entry],
    unmapped: list[str],
) -> str:
    first = runs[0]
    tag = f"derived from {first.path.name} of {first.date}" + (
        f" and {len(runs) - 1} more run(s), median" if len(runs) > 1 else ""
    )
    tag += f", {_num(margin * 100)}% margin"
    lines = _header(runs, parent, margin)
    if unmapped:
        lines.append("# Measurements not turned into thresholds:")
        lines += [f"#   {u}" for u in unmapped]
    base = parent.model.description.split(" — thresholds derived from")[0]
    description = f"{base} — thresholds derived from a run of {first.date}"
    lines += [
        "",
        f"name: {_scalar(name)}",
        f"description: {_scalar(description)}",
        f"extends: {_scalar(extends)}",
    ]

    if any(e.thresholds for e in checks):
        lines += ["", "collectives:", "  checks:"]
        for entry in checks:
            lines += _check_line(entry, tag)
    for section, entry in sections.items():
        lines += ["", f"{section}:"]
        for threshold in entry.thresholds.values():
            lines.append(f"  {threshold.key}: {threshold.text}    # {threshold.comment}")
    if any(e.thresholds for e in cases):
        lines += ["", "sft:", "  cases:"]
        for entry in cases:
            lines += _case_lines(entry, tag)
    if any(e.thresholds for e in steps):
        lines += ["", "scaling:", f"  source: {_scalar(tag)}", "  steps:"]
        for entry in sorted(steps, key=lambda e: e.identity):
            lo, hi = entry.identity
            parent_step: ScalingStep | None = entry.parent
            if "min_efficiency" in entry.thresholds:
                threshold = entry.thresholds["min_efficiency"]
                value, comment = threshold.text, threshold.comment
            elif parent_step is not None:
                value = format_quantity(parent_step.min_efficiency, "fraction")
                comment = "not measured, kept from the parent"
            else:  # pragma: no cover - a step entry exists only with a threshold or a parent
                continue
            lines.append(
                f"    - {{from_nodes: {lo}, to_nodes: {hi}, min_efficiency: {value}}}    # {comment}"
            )
    return "\n".join(lines) + "\n"


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
