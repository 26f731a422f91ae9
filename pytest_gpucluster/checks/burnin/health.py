"""Judging the health job: each rank's and GPU's numbers against the profile's ``burnin:`` section.

The rank side (``workloads/health.py``) measures; this module turns its per-rank values into
`Reading` s, one per number and rank (or GPU), each with its threshold from the profile (None:
recorded, not gated), and into the ECC/XID counter increases between two readings. The test
passes every reading to ``results.check`` so that every number lands in results.json; a reading
that fails becomes a `Suspect` naming the node, rank and GPU.

Pure: no torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.results.model import compare
from pytest_gpucluster.results.recorder import format_value

__all__ = [
    "COUNTERS",
    "Reading",
    "counter_increases",
    "cpu_readings",
    "gpu_readings",
    "intra_node_samples",
    "skip_reasons",
]


@dataclass(frozen=True, slots=True)
class Reading:
    """One number of one rank (or GPU) and the threshold it must meet."""

    metric: str
    what: str
    """What it is, for people: ``CPU float32 matmul``."""
    value: float
    threshold: float | None
    unit: str
    host: str
    rank: int
    comparison: str = ">="
    gpu: str | None = None
    source: str | None = None
    """The profile key the threshold comes from."""
    detail: str = ""
    """Said after the value in a failure (the throttle reasons that are active)."""
    labels: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.threshold is not None and not compare(self.value, self.threshold, self.comparison)  # type: ignore[arg-type]

    def all_labels(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "rank": self.rank}
        if self.gpu:
            out["gpu"] = self.gpu
        return {**out, **self.labels}

    def sentence(self) -> str:
        where = f"{self.gpu} of {self.host}" if self.gpu else f"rank {self.rank} on {self.host}"
        expected = (
            "at least" if self.comparison == ">=" else "at most" if self.comparison == "<=" else "exactly"
        )
        limit = format_value(self.threshold, self.unit) if self.threshold is not None else "n/a"
        detail = f" ({self.detail})" if self.detail else ""
        src = f" ({self.source})" if self.source else ""
        return f"{where}: {self.what} {format_value(self.value, self.unit)}{detail}, expected {expected} {limit}{src}"

    def suspect(self) -> Suspect:
        return Suspect(
            node=self.host,
            rank=self.rank,
            gpu=self.gpu,
            kind="gpu" if self.gpu else "node",
            check="health",
            reason=self.sentence(),
            evidence={
                "metric": self.metric,
                "value": self.value,
                "threshold": self.threshold,
                "unit": self.unit,
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


def cpu_readings(values: Iterable[Mapping[str, Any]], section: BurninSection) -> list[Reading]:
    """Per rank: CPU float32 matmul FLOP/s and memory copy bandwidth."""
    specs = (
        ("burnin.cpu_matmul", "CPU float32 matmul", ("cpu", "matmul_flops"), "FLOP/s", section.min_cpu_matmul, "burnin.min_cpu_matmul"),
        ("burnin.cpu_memory_bandwidth", "host memory copy", ("cpu", "memory_bandwidth"), "B/s", section.min_cpu_memory_bandwidth, "burnin.min_cpu_memory_bandwidth"),
    )  # fmt: skip
    out = []
    for value in _by_rank(values):
        for metric, what, path, unit, threshold, key in specs:
            number = _num(value, *path)
            if number is not None:
                out.append(
                    Reading(
                        metric, what, number, threshold, unit, str(value["host"]), int(value["rank"]),
                        source=key if threshold is not None else None,
                    )
                )  # fmt: skip
    return out


def gpu_readings(values: Iterable[Mapping[str, Any]], section: BurninSection) -> list[Reading]:
    """Per GPU: bf16 matmul, device memory and host-to-device bandwidth, and the NVML readings."""
    s = section
    specs = (
        ("burnin.gpu_matmul", "bf16 matmul", ("gpu", "matmul_flops"), "FLOP/s", ">=", s.min_matmul, "burnin.min_matmul"),
        ("burnin.gpu_memory_bandwidth", "device memory copy", ("gpu", "memory_bandwidth"), "B/s", ">=", s.min_memory_bandwidth, "burnin.min_memory_bandwidth"),
        ("burnin.h2d_bandwidth", "host-to-device copy", ("gpu", "h2d_bandwidth"), "B/s", ">=", s.min_h2d_bandwidth, "burnin.min_h2d_bandwidth"),
        ("burnin.gpu_temperature", "temperature", ("nvml", "temperature_c"), "C", "<=", s.max_temperature, "burnin.max_temperature"),
        ("burnin.gpu_power", "power draw", ("nvml", "power_w"), "W", "<=", s.max_power, "burnin.max_power"),
        ("burnin.pcie_gen", "PCIe link generation", ("nvml", "pcie_gen"), "gen", ">=", s.min_pcie_gen, "burnin.min_pcie_gen"),
        ("burnin.pcie_width", "PCIe link width", ("nvml", "pcie_width"), "lanes", ">=", s.min_pcie_width, "burnin.min_pcie_width"),
        ("burnin.retired_pages", "retired pages", ("nvml", "retired_pages"), "pages", "<=", s.max_retired_pages, "burnin.max_retired_pages"),
        ("burnin.remapped_rows", "uncorrectable remapped rows", ("nvml", "remapped_rows", "uncorrectable"), "rows", "<=", s.max_retired_pages, "burnin.max_retired_pages"),
        ("burnin.row_remap_failure", "row remapping failure flag", ("nvml", "remapped_rows", "failure"), "bool", "<=", 0.0, "NVML: a failed remap means the GPU needs replacing"),
        ("burnin.ecc_uncorrected", "uncorrected ECC errors since the driver loaded", ("nvml", "ecc_uncorrected_volatile"), "errors", "<=", None, None),
    )  # fmt: skip
    forbidden = set(s.forbidden_throttle_reasons)
    out = []
    for value in _by_rank(values):
        if "gpu" not in value and "nvml" not in value:
            continue
        host, rank = str(value["host"]), int(value["rank"])
        gpu = (value.get("nvml") or {}).get("gpu") or f"GPU {value.get('local_rank', rank)}"
        for metric, what, path, unit, comparison, threshold, key in specs:
            number = _num(value, *path)
            if number is not None:
                out.append(
                    Reading(
                        metric, what, number, None if threshold is None else float(threshold), unit, host, rank,
                        comparison, gpu, key if threshold is not None else None,
                    )
                )  # fmt: skip
        reasons = (value.get("nvml") or {}).get("throttle_reasons")
        if isinstance(reasons, list):
            active = sorted(forbidden & set(reasons))
            out.append(
                Reading(
                    "burnin.throttle", "forbidden clock throttle reasons active", float(len(active)), 0.0,
                    "reasons", host, rank, "<=", gpu, "burnin.forbidden_throttle_reasons",
                    detail=", ".join(active) if active else f"active: {', '.join(reasons) or 'none'}",
                )
            )  # fmt: skip
    return out


def skip_reasons(values: Iterable[Mapping[str, Any]], part: str) -> list[str]:
    """The distinct reasons the ranks gave for skipping ``part`` (``gpu``, ``nvml``, ``xid``...)."""
    reasons: list[str] = []
    for value in _by_rank(values):
        reason = (value.get("skipped") or {}).get(part)
        if reason and reason not in reasons:
            reasons.append(reason)
    return reasons


def intra_node_samples(values: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``host -> intra-node all_reduce busbw`` (every rank of a node reports the same number)."""
    out: dict[str, float] = {}
    for value in _by_rank(values):
        number = _num(value, "intra_node", "busbw")
        if number is not None:
            out.setdefault(str(value["host"]), number)
    return out


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
