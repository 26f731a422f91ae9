"""The text of a derived profile: quantities written back in profile units, and the YAML of the
entries and sections whose thresholds were derived, each with its comment (measured value, margin).

Rendering only: what each entry holds is decided in `profiles.derive`. No I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from pytest_gpucluster.profiles.derive_rules import Kind
from pytest_gpucluster.profiles.derive_runs import SourceRun
from pytest_gpucluster.profiles.loader import LoadedProfile
from pytest_gpucluster.profiles.schema import CollectiveCheck, ScalingStep, SftCase

__all__ = ["Entry", "Threshold", "format_quantity", "measured_text", "number", "render"]


def _round(x: float, up: bool, sig: int = 3) -> float:
    """Round to ``sig`` significant digits, away from the measured value's side of the margin."""
    if x == 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(abs(x))) - (sig - 1))
    q = x / scale
    q = math.ceil(q - 1e-9) if up else math.floor(q + 1e-9)
    return float(f"{q * scale:.{sig}g}")


def number(x: float) -> str:
    return f"{x:.6g}"


def format_quantity(value: float, kind: Kind, up: bool | None = None, digits: int = 6) -> str:
    """A profile quantity for ``value`` in canonical units; ``up`` rounds to 3 significant digits
    (up or down), None keeps ``digits``."""

    def r(x: float) -> str:
        return f"{x:.{digits}g}" if up is None else number(_round(x, up))

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


def measured_text(value: float, kind: Kind, unit: str) -> str:
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


@dataclass(frozen=True, slots=True)
class Threshold:
    key: str
    text: str
    comment: str
    value: float
    """The threshold in canonical units, to pick the most lenient of several points."""
    floor: bool
    points: int = 1


@dataclass
class Entry:
    """A list entry (check, case, step) or a mapping section (nvlink, burnin), with thresholds to set."""

    identity: tuple[Any, ...]
    parent: Any = None
    thresholds: dict[str, Threshold] = field(default_factory=dict)


_CASE_QUANTITIES: dict[str, Kind] = {
    "max_step_time": "duration",
    "max_peak_memory": "size",
    "min_mfu": "fraction",
    "min_gpu_util": "fraction",
}


def _header(runs: Sequence[SourceRun], parent: LoadedProfile, margin: float) -> list[str]:
    lines = [
        "# Derived by `gpucluster profiles derive` from a known-good run: every gated measurement",
        f"# is a threshold {number(margin * 100)}% on the safe side of its measured value (floors below,",
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


def _check_line(entry: Entry, tag: str) -> list[str]:
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


def _case_lines(entry: Entry, tag: str) -> list[str]:
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


def render(
    runs: Sequence[SourceRun],
    *,
    parent: LoadedProfile,
    extends: str,
    name: str,
    margin: float,
    checks: list[Entry],
    cases: list[Entry],
    steps: list[Entry],
    sections: dict[str, Entry],
    unmapped: list[str],
) -> str:
    first = runs[0]
    tag = f"derived from {first.path.name} of {first.date}" + (
        f" and {len(runs) - 1} more run(s), median" if len(runs) > 1 else ""
    )
    tag += f", {number(margin * 100)}% margin"
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
