"""Judging each GPU of the health job: its benchmarks, its state under load, its memory health and
its ECC mode, against the profile's ``burnin:`` section.

- **Benchmarks**: bf16 matmul, device memory copy and host-to-device copy bandwidth.
- **Under load** (``value["under_load"]``: NVML sampled on a thread during the matmul/copy load of
  ``burnin.load_duration``, ``workloads/_load_sampler.py``), judged on the load's sustained part
  (its last half, where a GPU has heated up): the hottest temperature and highest power against
  ``max_temperature``/``max_power``, the PCIe generation and width the link reached against
  ``min_pcie_gen``/``min_pcie_width`` (an idle GPU drops to Gen1, so only a loaded reading
  means anything), the lowest SM clock (recorded), average power from NVML's energy counter
  (recorded) and the time NVML's violation counters grew per policy (recorded). Where the load
  was not sampled (no NVML) a *gated* reading has no value (not measured), its hint giving the
  idle reading taken after the load; an ungated one records that reading.
- **Clock reasons**: every forbidden reason seen in any sample, or whose NVML violation counter
  grew during the load (power -> ``sw_power_cap``, thermal -> ``sw_thermal_slowdown``), named.
- **Memory health**: retired pages, remapped rows and the remap-failure flag, uncorrected ECC
  errors (recorded); XID events NVML reported during the load (at most 0).
- **ECC mode**: enabled now and staying enabled (no pending change), from NVML or the
  ``nvidia-smi -q -d ECC`` text the rank sent (``parsers/nvidia_smi_ecc.py``). ECC disabled or a
  pending change fails naming the GPU; a mode nobody could read is not measured (not a pass).

Pure: no torch, no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_smi_ecc import parse_ecc_query
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.results.model import Check, Comparison, ThresholdRef

__all__ = ["POLICY_REASONS", "ecc_mode_of", "gpu_checks"]

POLICY_REASONS = {"power": "sw_power_cap", "thermal": "sw_thermal_slowdown", "sync_boost": "sync_boost"}
"""NVML perf policies whose violation counter stands for a clock reason (nvml.h names the
``NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`` and ``_SYNC_BOOST`` counters as these policies'
fields; the thermal policy is the software thermal slowdown)."""

_BENCH = (
    ("burnin.gpu_matmul", "bf16 matmul", "matmul_flops", "FLOP/s", "min_matmul"),
    ("burnin.gpu_memory_bandwidth", "device memory copy", "memory_bandwidth", "B/s", "min_memory_bandwidth"),
    ("burnin.h2d_bandwidth", "host-to-device copy", "h2d_bandwidth", "B/s", "min_h2d_bandwidth"),
)
_UNDER_LOAD: tuple[tuple[str, str, str, str, str, Comparison, str], ...] = (
    ("burnin.gpu_temperature", "temperature", "temperature_c", "max", "C", "<=", "max_temperature"),
    ("burnin.gpu_power", "power draw", "power_w", "max", "W", "<=", "max_power"),
    ("burnin.pcie_gen", "PCIe link generation", "pcie_gen", "max", "gen", ">=", "min_pcie_gen"),
    ("burnin.pcie_width", "PCIe link width", "pcie_width", "max", "lanes", ">=", "min_pcie_width"),
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _key(profile: str, key: str) -> ThresholdRef:
    return ThresholdRef(profile, ("burnin", key))


class _Gpu:
    """Builds the checks of one GPU: labels host, rank and gpu; hints start with the GPU's name."""

    def __init__(self, value: Mapping[str, Any], section: BurninSection, profile: str) -> None:
        self.value, self.section, self.profile = value, section, profile
        self.nvml: Mapping[str, Any] = value.get("nvml") or {}
        self.load: Mapping[str, Any] = value.get("under_load") or {}
        rank = int(value["rank"])
        gpu = self.nvml.get("gpu") or f"GPU {value.get('local_rank', rank)}"
        self.where = {"host": str(value["host"]), "rank": rank, "gpu": gpu}
        self.out: list[Check] = []

    def add(
        self, metric: str, what: str, number: float, unit: str, comparison: Comparison = "<=",
        key: str | None = None, threshold: float | None = None, detail: str = "",
        labels: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """A reading: its threshold from ``burnin.<key>``, or ``threshold`` (a rule, or a count that
        must stay at 0 of what ``key`` lists, as ``forbidden_throttle_reasons``)."""
        if key is not None and threshold is None:
            threshold = getattr(self.section, key)
        ref = _key(self.profile, key) if key is not None and threshold is not None else None
        hint = f"{self.where['gpu']} of {self.where['host']}: {what}" + (f" ({detail})" if detail else "")
        where = {**self.where, **(labels or {})}
        self.out.append(Check(metric, number, unit, threshold, comparison, ref, labels=where, hint=hint))

    def skipped(self, *names: str) -> str:
        reasons = self.value.get("skipped") or {}
        return "; ".join(str(reasons[n]) for n in names if reasons.get(n)) or "no reason given"


def _bench(g: _Gpu) -> None:
    for metric, what, field, unit, key in _BENCH:
        number = _num((g.value.get("gpu") or {}).get(field))
        if number is not None:
            g.add(metric, what, number, unit, ">=", key)


def _sustained(load: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The samples the ceilings are judged on: the load's last half (``sustained``, where the GPU
    has heated up) when the sampler timed them, else all of them; and how to say which."""
    whole = f"{load.get('samples', 0)} samples over the {load.get('duration_s', 0.0):.1f} s load"
    late = load.get("sustained")
    if late and late.get("samples"):
        return late, (
            f"{late['samples']} samples of the sustained part (from {late.get('from_s', 0.0):.1f} s) of the "
            f"{load.get('duration_s', 0.0):.1f} s load (burnin.load_duration)"
        )
    return load, whole


def _under_load(g: _Gpu) -> None:
    judged, span = _sustained(g.load)
    fields = judged.get("fields") or {}
    for metric, what, field, agg, unit, comparison, key in _UNDER_LOAD:
        stats = fields.get(field)
        after = _num(g.nvml.get(field))
        if stats:
            detail = f"{agg} of {span}; min {stats['min']:g}, max {stats['max']:g}"
            g.add(metric, what, float(stats[agg]), unit, comparison, key, detail=detail)
        elif getattr(g.section, key) is not None:
            idle = f"{after:g} {unit}" if after is not None else "none"
            why = g.skipped("under_load", f"under_load.{field}")
            g.add(
                metric, what, math.nan, unit, comparison, key,
                detail=f"not sampled under load: {why}; the reading after the load, {idle}, is an idle GPU's",
            )  # fmt: skip
        elif after is not None:
            g.add(
                metric,
                what,
                after,
                unit,
                comparison,
                key,
                detail="read after the load (not sampled under it)",
            )
    clock = fields.get("sm_clock_mhz")
    if clock:
        g.add("burnin.gpu_sm_clock_min", "lowest SM clock under load", clock["min"], "MHz", ">=", detail=span)
    counters = g.load.get("counters") or {}
    energy, duration = _num(counters.get("energy_mj")), _num(g.load.get("duration_s"))
    if energy is not None and duration:
        g.add("burnin.gpu_power_avg", "average power under load", energy / 1e3 / duration, "W", detail=span)
    for policy, grown in sorted((counters.get("violation_ns") or {}).items()):
        g.add(
            "burnin.gpu_clock_violation", f"time NVML's {policy} violation counter grew during the load",
            grown / 1e9, "s", detail=span, labels={"policy": policy},
        )  # fmt: skip


def _throttle(g: _Gpu) -> None:
    judged, _span = _sustained(g.load)
    seen: dict[str, int] = dict(judged.get("reasons") or {})
    grown = (g.load.get("counters") or {}).get("violation_ns") or {}
    from_counters = {POLICY_REASONS[p]: ns for p, ns in grown.items() if p in POLICY_REASONS and ns > 0}
    if g.load.get("samples"):
        said = [f"{r} in {n} of {judged['samples']} sustained-load samples" if judged is not g.load
                else f"{r} in {n} of {g.load['samples']} samples" for r, n in sorted(seen.items())]  # fmt: skip
        said += [f"NVML {r} counter +{ns / 1e9:.3g} s" for r, ns in sorted(from_counters.items())]
        active = set(seen) | set(from_counters)
        where = "during the load"
    elif isinstance(g.nvml.get("throttle_reasons"), list):
        active = set(g.nvml["throttle_reasons"])
        said, where = sorted(active), "read after the load (not sampled under it)"
    else:
        return
    forbidden = sorted(set(g.section.forbidden_throttle_reasons) & active)
    detail = f"{', '.join(forbidden)}; " if forbidden else ""
    g.add(
        "burnin.throttle", "forbidden clock throttle reasons active", float(len(forbidden)), "reasons", "<=",
        "forbidden_throttle_reasons", 0.0, detail=f"{detail}{where}: {', '.join(said) or 'none'}",
    )  # fmt: skip


def _memory(g: _Gpu) -> None:
    for metric, what, number in (
        ("burnin.retired_pages", "retired pages", _num(g.nvml.get("retired_pages"))),
        ("burnin.remapped_rows", "uncorrectable remapped rows", _num((g.nvml.get("remapped_rows") or {}).get("uncorrectable"))),
    ):  # fmt: skip
        if number is not None:
            g.add(metric, what, number, "rows" if "rows" in metric else "pages", "<=", "max_retired_pages")
    failure = _num((g.nvml.get("remapped_rows") or {}).get("failure"))
    if failure is not None:
        g.add(
            "burnin.row_remap_failure", "row remapping failure flag", failure, "bool", "<=", threshold=0.0,
            detail="NVML: a failed remap means the GPU needs replacing",
        )  # fmt: skip
    ecc = _num(g.nvml.get("ecc_uncorrected_volatile"))
    if ecc is not None:
        g.add("burnin.ecc_uncorrected", "uncorrected ECC errors since the driver loaded", ecc, "errors")
    xids = g.load.get("xids")
    if isinstance(xids, list):
        shown = ", ".join(f"XID {e.get('xid')}" for e in xids) or "none"
        g.add(
            "burnin.xid_during_load", "XID events NVML reported during the load", float(len(xids)), "events",
            "<=", threshold=0.0, detail=shown,
        )  # fmt: skip


def ecc_mode_of(value: Mapping[str, Any]) -> tuple[bool | None, bool | None, str]:
    """``(current, pending, source)`` of one GPU's ECC mode: NVML's, else the ``nvidia-smi -q -d
    ECC`` text the rank sent (the block of its PCI bus id, or the only block). None where unknown;
    ``source`` says where it was read, or why it could not be."""
    nvml = value.get("nvml") or {}
    mode = nvml.get("ecc_mode")
    if isinstance(mode, Mapping):
        return mode.get("current"), mode.get("pending"), "NVML"
    text = value.get("ecc_smi")
    if not text:
        reasons = value.get("skipped") or {}
        why = "; ".join(str(reasons[k]) for k in ("nvml", "ecc_mode", "ecc_smi") if reasons.get(k))
        return None, None, why or "neither NVML nor nvidia-smi reported it"
    try:
        gpus = parse_ecc_query(str(text))
    except ParseError as exc:
        return None, None, f"nvidia-smi -q -d ECC: {exc}"
    bus = str(nvml.get("pci_bus_id") or "").lower()
    mine = [g for g in gpus if g.bus_id and g.bus_id.lower() == bus] or (gpus if len(gpus) == 1 else [])
    if not mine:
        return (
            None,
            None,
            f"nvidia-smi -q -d ECC printed {len(gpus)} GPUs, none at {bus or 'an unknown bus id'}",
        )
    return mine[0].mode_current, mine[0].mode_pending, "nvidia-smi -q -d ECC"


def _ecc_mode(g: _Gpu) -> None:
    current, pending, source = ecc_mode_of(g.value)
    advice = "Enable it with `nvidia-smi -i <gpu> -e 1` and reset the GPU (or reboot)."
    if current is None:
        g.add(
            "burnin.ecc_enabled", "ECC mode", math.nan, "bool", "==", threshold=1.0,
            detail=f"unknown ({source}): a GPU whose ECC cannot be read may be running without it",
        )  # fmt: skip
        return
    state = "enabled" if current else "disabled"
    g.add(
        "burnin.ecc_enabled", "ECC mode", float(current), "bool", "==", threshold=1.0,
        detail=f"{state}, from {source}" + ("" if current else f": memory errors go undetected. {advice}"),
    )  # fmt: skip
    if pending is not None:
        change = pending != current
        g.add(
            "burnin.ecc_pending_change", "ECC mode pending a change", float(change), "bool", "<=", threshold=0.0,
            detail=f"current {state}, pending {'enabled' if pending else 'disabled'}, from {source}"
            + (": the mode changes at the next GPU reset, so this run did not test the mode it will run in" if change else ""),
        )  # fmt: skip


def gpu_checks(values: Iterable[Mapping[str, Any]], section: BurninSection, profile: str) -> list[Check]:
    """Per GPU: benchmarks, state under load, clock reasons, memory health and ECC mode (module doc)."""
    out: list[Check] = []
    for value in sorted(values, key=lambda v: int(v["rank"])):
        if "gpu" not in value and "nvml" not in value:
            continue
        g = _Gpu(value, section, profile)
        _bench(g)
        _under_load(g)
        _memory(g)
        _throttle(g)
        _ecc_mode(g)
        out += g.out
    return out
