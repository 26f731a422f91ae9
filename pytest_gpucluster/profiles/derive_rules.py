"""Which profile key a measurement was judged against, for `profiles.derive`.

A measurement's ``ref`` (``ThresholdRef``: ``("sft", "cases", 0, "max_step_time")``) names the key
directly; any ``min_*``/``max_*`` key of a mapping section such as ``burnin:`` is typed by the
schema. A measurement without a ref (a results file of schema version 1, a check of one's own) is
mapped by its metric name through :data:`RULES`, one row per metric family. No I/O.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Literal

from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Measurement, ThresholdRef

__all__ = ["RULES", "UNITS", "Kind", "MetricRule", "Target", "rule_for"]

Kind = Literal["bandwidth", "duration", "size", "fraction", "flops", "number"]
Target = str
"""``collective``, ``sft``, ``scaling`` (list entries), or the name of a mapping section (``nvlink``,
``burnin``...) whose ``min_*``/``max_*`` keys are thresholds."""

UNITS: dict[Kind, tuple[str, ...]] = {
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
