"""Judging the health job: each rank's and GPU's numbers against the profile's ``burnin:`` section.

The rank side (``workloads/health.py``) measures; this module turns its per-rank values into
checks, one per number and rank (or GPU), each with its threshold from the profile (None:
recorded, not gated) and labels naming the host, rank and GPU, and into the ECC/XID counter
increases between two readings. A check that fails is also a `Suspect` (:func:`suspect_of`)
naming the node, rank and GPU, for the drain list.

Pure: no torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.burnin.stragglers import Sample, value_samples
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.results.model import Check, Comparison, ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "COUNTERS",
    "counter_increases",
    "cpu_checks",
    "gpu_checks",
    "intra_node_samples",
    "matmul_samples",
    "skip_reasons",
    "skip_sentence",
    "suspect_of",
]

_EXPECTED = {">=": "at least", "<=": "at most", "==": "exactly"}


def _reading(
    metric: str,
    what: str,
    value: float,
    threshold: float | None,
    unit: str,
    comparison: Comparison,
    ref: ThresholdRef | None,
    where: Mapping[str, Any],
    detail: str = "",
) -> Check:
    """One number of one rank (or GPU): ``where`` holds host, rank and (on GPUs) gpu; the hint says
    what the number is, of which rank or GPU (``GPU 3 of node7: bf16 matmul``)."""
    who = (
        f"{where['gpu']} of {where['host']}"
        if where.get("gpu")
        else f"rank {where['rank']} on {where['host']}"
    )
    hint = f"{who}: {what}" + (f" ({detail})" if detail else "")
    return Check(
        metric,
        value,
        unit,
        threshold,
        comparison,
        ref if threshold is not None else None,
        labels=where,
        hint=hint,
    )


def suspect_of(check: Check) -> Suspect:
    """The rank or GPU a failed health check names, with a sentence of its numbers."""
    labels = check.labels
    threshold = "n/a" if check.threshold is None else format_value(check.threshold, check.unit)
    key = f" ({check.ref.key})" if check.ref else ""
    reason = (
        f"{check.hint} {format_value(check.value, check.unit)}, expected {_EXPECTED[check.comparison]} "
        f"{threshold}{key}"
    )
    return Suspect(
        node=str(labels["host"]),
        rank=labels.get("rank"),
        gpu=labels.get("gpu"),
        kind="gpu" if labels.get("gpu") else "node",
        check="health",
        reason=reason,
        evidence={
            "metric": check.metric,
            "value": check.value,
            "threshold": check.threshold,
            "unit": check.unit,
        },
    )


def _num(value: Mapping[str, Any], *path: str) -> float | None:
    node: Any = value
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def _by_rank(values: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(values, key=lambda v: int(v["rank"]))


def _key(profile: str, key: str) -> ThresholdRef:
    return ThresholdRef(profile, ("burnin", key))


def cpu_checks(values: Iterable[Mapping[str, Any]], section: BurninSection, profile: str) -> list[Check]:
    """Per rank: CPU float32 matmul FLOP/s and memory copy bandwidth."""
    specs = (
        ("burnin.cpu_matmul", "CPU float32 matmul", ("cpu", "matmul_flops"), "FLOP/s", "min_cpu_matmul"),
        ("burnin.cpu_memory_bandwidth", "host memory copy", ("cpu", "memory_bandwidth"), "B/s", "min_cpu_memory_bandwidth"),
    )  # fmt: skip
    out = []
    for value in _by_rank(values):
        where = {"host": str(value["host"]), "rank": int(value["rank"])}
        for metric, what, path, unit, key in specs:
            number = _num(value, *path)
            if number is not None:
                out.append(
                    _reading(
                        metric, what, number, getattr(section, key), unit, ">=", _key(profile, key), where
                    )
                )
    return out


_GPU_SPECS: tuple[tuple[str, str, tuple[str, ...], str, Comparison, str], ...] = (
    ("burnin.gpu_matmul", "bf16 matmul", ("gpu", "matmul_flops"), "FLOP/s", ">=", "min_matmul"),
    ("burnin.gpu_memory_bandwidth", "device memory copy", ("gpu", "memory_bandwidth"), "B/s", ">=", "min_memory_bandwidth"),
    ("burnin.h2d_bandwidth", "host-to-device copy", ("gpu", "h2d_bandwidth"), "B/s", ">=", "min_h2d_bandwidth"),
    ("burnin.gpu_temperature", "temperature", ("nvml", "temperature_c"), "C", "<=", "max_temperature"),
    ("burnin.gpu_power", "power draw", ("nvml", "power_w"), "W", "<=", "max_power"),
    ("burnin.pcie_gen", "PCIe link generation", ("nvml", "pcie_gen"), "gen", ">=", "min_pcie_gen"),
    ("burnin.pcie_width", "PCIe link width", ("nvml", "pcie_width"), "lanes", ">=", "min_pcie_width"),
    ("burnin.retired_pages", "retired pages", ("nvml", "retired_pages"), "pages", "<=", "max_retired_pages"),
    ("burnin.remapped_rows", "uncorrectable remapped rows", ("nvml", "remapped_rows", "uncorrectable"), "rows", "<=", "max_retired_pages"),
)  # fmt: skip


def _gpu_rank_checks(value: Mapping[str, Any], section: BurninSection, profile: str) -> list[Check]:
    host, rank = str(value["host"]), int(value["rank"])
    gpu = (value.get("nvml") or {}).get("gpu") or f"GPU {value.get('local_rank', rank)}"
    where = {"host": host, "rank": rank, "gpu": gpu}
    out = []
    for metric, what, path, unit, comparison, key in _GPU_SPECS:
        number = _num(value, *path)
        if number is not None:
            threshold = getattr(section, key)
            out.append(_reading(metric, what, number, threshold, unit, comparison, _key(profile, key), where))
    failure = _num(value, "nvml", "remapped_rows", "failure")
    if failure is not None:
        out.append(
            _reading(
                "burnin.row_remap_failure", "row remapping failure flag", failure, 0.0, "bool", "<=", None, where,
                "NVML: a failed remap means the GPU needs replacing",
            )
        )  # fmt: skip
    ecc = _num(value, "nvml", "ecc_uncorrected_volatile")
    if ecc is not None:
        what = "uncorrected ECC errors since the driver loaded"
        out.append(_reading("burnin.ecc_uncorrected", what, ecc, None, "errors", "<=", None, where))
    reasons = (value.get("nvml") or {}).get("throttle_reasons")
    if isinstance(reasons, list):
        active = sorted(set(section.forbidden_throttle_reasons) & set(reasons))
        out.append(
            _reading(
                "burnin.throttle", "forbidden clock throttle reasons active", float(len(active)), 0.0, "reasons",
                "<=", _key(profile, "forbidden_throttle_reasons"), where,
                ", ".join(active) if active else f"active: {', '.join(reasons) or 'none'}",
            )
        )  # fmt: skip
    return out


def gpu_checks(values: Iterable[Mapping[str, Any]], section: BurninSection, profile: str) -> list[Check]:
    """Per GPU: bf16 matmul, device memory and host-to-device bandwidth, and the NVML readings."""
    return [
        check
        for value in _by_rank(values)
        if "gpu" in value or "nvml" in value
        for check in _gpu_rank_checks(value, section, profile)
    ]


def skip_reasons(values: Iterable[Mapping[str, Any]], part: str) -> list[str]:
    """The distinct reasons the ranks gave for skipping ``part`` (``gpu``, ``nvml``, ``xid``...)."""
    reasons: list[str] = []
    for value in _by_rank(values):
        reason = (value.get("skipped") or {}).get(part)
        if reason and reason not in reasons:
            reasons.append(reason)
    return reasons


def skip_sentence(values: Iterable[Mapping[str, Any]], *parts: str) -> str:
    """The ranks' reasons for skipping ``parts``, each said once; many alike as one "and N more"."""
    reasons = list(dict.fromkeys(r for part in parts for r in skip_reasons(values, part)))
    return f"{reasons[0]} (and {len(reasons) - 1} more like it)" if len(reasons) > 2 else "; ".join(reasons)


def intra_node_samples(values: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``host -> intra-node all_reduce busbw`` (every rank of a node reports the same number)."""
    out: dict[str, float] = {}
    for value in _by_rank(values):
        number = _num(value, "intra_node", "busbw")
        if number is not None:
            out.setdefault(str(value["host"]), number)
    return out


def matmul_samples(values: Sequence[Mapping[str, Any]]) -> tuple[str, list[Sample]]:
    """Each rank's best matmul span, on its GPU where it has one, else on its CPU: ``(part, samples)``.
    The best span, because load from elsewhere only ever adds to it."""
    for part in ("gpu", "cpu"):
        samples = value_samples(values, part, "matmul_best_s")
        if samples:
            return part, samples
    return "cpu", []


COUNTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("uncorrected ECC errors (volatile)", ("ecc_uncorrected_volatile",)),
    ("corrected ECC errors (volatile)", ("ecc_corrected_volatile",)),
    ("uncorrected ECC errors (aggregate)", ("ecc_uncorrected_aggregate",)),
    ("retired pages", ("retired_pages",)),
    ("uncorrectable remapped rows", ("remapped_rows", "uncorrectable")),
    ("correctable remapped rows", ("remapped_rows", "correctable")),
)
"""The counters that must not grow during the run: any increase fails, naming the GPU."""


def _gpus(values: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    out = {}
    for value in values:
        nvml = value.get("nvml") or {}
        if nvml.get("pci_bus_id"):
            out[(str(value["host"]), str(nvml["pci_bus_id"]))] = value
    return out


def _pci_key(address: str) -> tuple[int, int, int] | None:
    """``(domain, bus, device)`` of ``00000000:3B:00.0`` (NVML) or ``0000:3b:00`` (an XID line)."""
    parts = address.strip().lower().split(".")[0].split(":")
    try:
        domain, bus, device = (
            (int(p, 16) for p in parts[-3:]) if len(parts) >= 3 else (0, *(int(p, 16) for p in parts))
        )
    except ValueError:
        return None
    return domain, bus, device


def _xids(values: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    return {str(v["host"]): list(v["xid_events"]) for v in values if isinstance(v.get("xid_events"), list)}


def counter_increases(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Suspect]:
    """Every GPU whose ECC / retired-page / remapped-row counter grew between the two readings,
    and every new XID event (matched to its GPU by PCI address), as suspects."""
    suspects: list[Suspect] = []
    old = _gpus(before)
    for key, now in _gpus(after).items():
        host, bus = key
        was = old.get(key)
        if was is None:
            continue
        gpu = (now.get("nvml") or {}).get("gpu") or bus
        for what, path in COUNTERS:
            a, b = _num(was.get("nvml") or {}, *path), _num(now.get("nvml") or {}, *path)
            if a is not None and b is not None and b > a:
                suspects.append(
                    Suspect(
                        node=host, kind="gpu", gpu=gpu, rank=int(now["rank"]), check="counters",
                        reason=f"{what} rose from {a:g} to {b:g} during the run",
                        evidence={"counter": ".".join(path), "before": a, "after": b},
                    )
                )  # fmt: skip
    old_xids = _xids(before)
    for host, events in _xids(after).items():
        if host not in old_xids:
            continue
        seen = {e.get("line") for e in old_xids[host]}
        new = [e for e in events if e.get("line") not in seen]
        gpu_of = {_pci_key(bus): v for (h, bus), v in _gpus(after).items() if h == host}
        for event in new:
            pci = str(event.get("pci", "")).lower()
            match = gpu_of.get(_pci_key(pci))
            gpu = (match.get("nvml") or {}).get("gpu") if match else f"the GPU at PCI {pci}"
            suspects.append(
                Suspect(
                    node=host, kind="gpu", gpu=gpu, check="counters",
                    reason=f"XID {event.get('xid')} during the run: {event.get('line', '')}",
                    evidence={"xid": event.get("xid"), "pci": pci},
                )
            )  # fmt: skip
    return suspects
