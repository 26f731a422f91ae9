"""Refuse thresholds the hardware cannot meet: implied MFU, link ceilings, memory, efficiency.

A profile is checked against the peaks of the hardware it names (its ``cluster:`` figures,
else ``thresholds/devices.yaml``). Every finding states the arithmetic, so the author sees
which number is wrong and by how much. Errors are thresholds no healthy machine can meet;
warnings are thresholds that are possible but suspiciously close to the peak.

Throughput (``sft.cases[*]``)
    ``min_samples_per_s``, ``min_tokens_per_s_per_gpu`` and ``max_step_time`` each imply a
    rate of tokens per GPU (our SFT workload pads every sample to exactly ``seq_len`` tokens;
    a step is ``micro_batch x grad_accum`` samples per rank). Times the PaLM FLOPs per token of
    the case's model shape (``6N + 12·L·H·Q·T``, :meth:`TransformerShape.flops_per_token`) over
    the device's dense bf16 peak, that is the MFU the threshold demands: above 100% is an
    error, above 60% a warning (PaLM reports 46.2% MFU on 6144 TPU v4 chips). ``min_mfu``
    itself follows the same two limits. fp32 cases are held to the bf16 peak, which no fp32
    run exceeds, so an error stays an error.

Bus bandwidth (``collectives.checks[*].min_busbw``, ``nvlink.*busbw``)
    nccl-tests defines ``busbw = algbw x bus_factor`` (``metrics.bus_factor``) so that, for
    the bandwidth-optimal algorithms NCCL runs, busbw *is* the number of bytes each rank moves
    over its link per second. That makes the intra-node ceiling simply the per-GPU link
    bandwidth per direction (NVLink, else PCIe), with no bus factor to apply — the factor is
    already inside busbw. The general bound, of which that is one case, is

        busbw <= B x bus_factor(collective, n ranks) / traffic(collective, U units)

    where ``B`` is one unit's bandwidth per direction and ``traffic`` the fewest bytes, per byte
    of message, that each unit must send or receive (Patarasuk & Yuan 2009 for all_reduce):
    2(U-1)/U for all_reduce, (U-1)/U for all_gather and reduce_scatter, r(U-1)/U for alltoall
    with r ranks per unit, 1 for broadcast, reduce and sendrecv. Inside a node the unit is the
    GPU (U = n, r = 1) and the ratio is exactly 1. Across nodes the unit is the node,
    ``B = nic_line_rate x nics_per_node``, and the ratio is not 1: NCCL reduces inside each
    node over NVLink first, so a 2-node all_reduce of 16 ranks may reach busbw
    ``B x 1.875 / 1`` — which is why AWS measures 487 GB/s of busbw between two p5 nodes whose
    EFA carries 400 GB/s. Using ``NIC x NICs`` as the ceiling without the bus factors would
    refuse real measurements. An in-switch reduction (NVLink SHARP, NCCL's NVLS, on
    third-generation NVSwitch; SHARP/CollNet across nodes when ``NCCL_COLLNET_ENABLE=1``)
    lowers all_reduce traffic to 1: that is how 8 x H100 reach 460-480 GB/s of busbw on
    450 GB/s links, and the check allows it unless the profile sets ``nccl.nvls: false``.

Burn-in floors
    ``burnin.min_matmul`` above the dense bf16 peak, ``min_memory_bandwidth`` above the memory
    bandwidth and ``min_h2d_bandwidth`` above the PCIe link are errors; ``pair_min_busbw`` is
    held to the 2-node all_reduce ceiling.

Memory and efficiency
    ``max_peak_memory`` above the device memory is an error (the larger of ``cluster.gpu_memory``
    and the device table's figure: vendors print binary capacities with decimal labels, so
    "80GB" in a profile parses to 80e9 bytes while the card holds 80 GiB). Scaling
    ``min_efficiency`` above 100%, and ``min_gpu_util`` above 100%, are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.profiles.devices import Device, find_device
from pytest_gpucluster.profiles.schema import ClusterSection, ProfileModel, SftCase

__all__ = [
    "MFU_WARNING",
    "Ceiling",
    "Figure",
    "Finding",
    "Peaks",
    "PhysicsReport",
    "busbw_ceiling",
    "check_profile",
    "implied_mfu",
    "peaks_for",
]

MFU_WARNING = 0.60
"""Implied MFU above this is suspicious (warning); above 1.0 it is impossible (error)."""

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Literal["error", "warning"]
    key: KeyPath
    """Where in the profile, e.g. ``("sft", "cases", 0, "min_samples_per_s")``."""
    message: str


@dataclass(frozen=True, slots=True)
class PhysicsReport:
    findings: tuple[Finding, ...]
    checked: int
    """How many thresholds were held against a peak."""
    skipped: tuple[str, ...]
    """Thresholds that could not be checked, each with why (no device peak, unknown model...)."""

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "warning")


@dataclass(frozen=True, slots=True)
class Figure:
    """A peak and where it comes from (``cluster.peak_flops``, ``devices.yaml h100-sxm``)."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class Peaks:
    device: Device | None
    peak_flops: Figure | None
    memory: Figure | None
    intra_link: Figure | None
    """Per-GPU link bandwidth per direction inside a node: NVLink, else PCIe."""
    node_network: Figure | None
    """Per-node network bandwidth per direction: NIC line rate x NICs per node."""
    nvls: bool
    memory_bandwidth: Figure | None = None
    pcie: Figure | None = None
    """The GPU's host link per direction."""


@dataclass(frozen=True, slots=True)
class Ceiling:
    value: float
    arithmetic: str


def _sig(x: float, digits: int = 4) -> str:
    """``digits`` significant digits with thousands separators, never an exponent."""
    return f"{x:,.0f}" if abs(x) >= 10**digits else f"{x:,.{digits}g}"


def _gbs(bytes_per_s: float) -> str:
    return f"{_sig(bytes_per_s / 1e9)} GB/s"


def _tflops(flops: float) -> str:
    return f"{_sig(flops / 1e12)} TFLOP/s"


def _gib(n: float) -> str:
    return f"{_sig(n / 2**30)} GiB ({_sig(n / 1e9)} GB)"


def _pct(fraction: float) -> str:
    return f"{_sig(fraction * 100, 3)}%"


def peaks_for(model: ProfileModel, devices: tuple[Device, ...] | None = None) -> Peaks:
    """The figures the checks use: the profile's ``cluster:`` section first, then the device table."""
    cluster = model.cluster
    device = find_device(cluster.gpu_model, devices) if cluster.device == "cuda" else None
    dev_src = f"devices.yaml {device.key}" if device else ""

    peak = None
    if cluster.peak_flops:
        peak = Figure(cluster.peak_flops, "cluster.peak_flops")
    elif device:
        peak = Figure(device.peak_flops, dev_src)

    memory = None
    candidates = []
    if cluster.gpu_memory:
        candidates.append(Figure(cluster.gpu_memory, "cluster.gpu_memory"))
    if device:
        candidates.append(Figure(device.memory, dev_src))
    if candidates:
        memory = max(candidates, key=lambda f: f.value)

    intra = None
    if cluster.nvlink_bandwidth:
        intra = Figure(cluster.nvlink_bandwidth, "NVLink per direction, cluster.nvlink_bandwidth")
    elif device and device.nvlink_bandwidth:
        intra = Figure(device.nvlink_bandwidth, f"NVLink per direction, {dev_src}")
    elif device:
        intra = Figure(device.pcie_bandwidth, f"PCIe x16 per direction (no NVLink), {dev_src}")

    network = None
    if cluster.nic_line_rate and cluster.nics_per_node:
        network = Figure(
            cluster.nic_line_rate * cluster.nics_per_node,
            f"{cluster.nics_per_node} NICs x {cluster.nic_line_rate * 8 / 1e9:g} Gb/s "
            "(cluster.nics_per_node x cluster.nic_line_rate)",
        )

    nvls = bool(device and device.nvls) and not (model.nccl is not None and model.nccl.nvls is False)
    if model.nccl_env.get("NCCL_NVLS_ENABLE") == "0":
        nvls = False
    memory_bw = None
    if cluster.memory_bandwidth:
        memory_bw = Figure(cluster.memory_bandwidth, "cluster.memory_bandwidth")
    elif device:
        memory_bw = Figure(device.memory_bandwidth, dev_src)
    pcie = Figure(device.pcie_bandwidth, f"PCIe x16 per direction, {dev_src}") if device else None
    return Peaks(device, peak, memory, intra, network, nvls, memory_bw, pcie)


# --------------------------------------------------------------------------------------------
# Bus bandwidth
# --------------------------------------------------------------------------------------------


def _traffic(collective: str, units: int, ranks_per_unit: int, in_network: bool) -> tuple[float, str]:
    """Fewest bytes per message byte each unit must move one way; and how that is written."""
    u = units
    if collective == "all_reduce":
        if in_network:
            return 1.0, "1 (reduced in the switch: each unit sends its data once and receives the sum once)"
        return 2.0 * (u - 1) / u, f"2(U-1)/U = {2.0 * (u - 1) / u:.4g}"
    if collective in ("all_gather", "reduce_scatter"):
        return (u - 1) / u, f"(U-1)/U = {(u - 1) / u:.4g}"
    if collective == "alltoall":
        value = ranks_per_unit * (u - 1) / u
        return value, f"r(U-1)/U = {value:.4g}"
    return 1.0, "1"


def busbw_ceiling(collective: str, scope: str, model: ProfileModel, peaks: Peaks) -> Ceiling | str:
    """The largest busbw the links can carry at this scope, or a string saying why it is unknown."""
    cluster = model.cluster
    if cluster.device == "cpu":
        return "a CPU profile: its ranks talk through host memory, for which no peak is recorded"
    per_node = cluster.effective_ranks_per_node
    nodes = {"intra-node": 1, "inter-node": 2, "full": cluster.nodes}[scope]
    ranks = nodes * per_node
    if ranks < 2:
        return "one rank moves nothing over a link"
    factor = metrics.bus_factor(collective, ranks)
    factor_text = {
        "all_reduce": "2(n-1)/n",
        "all_gather": "(n-1)/n",
        "reduce_scatter": "(n-1)/n",
        "alltoall": "(n-1)/n",
    }.get(collective, "1")
    if nodes == 1:
        link = peaks.intra_link
        if link is None:
            return "no per-GPU link bandwidth (cluster.nvlink_bandwidth, or a gpu_model in devices.yaml)"
        in_network = collective == "all_reduce" and peaks.nvls
        units, r, unit_name, bw = ranks, 1, "GPU", link
    else:
        if peaks.node_network is None:
            return "no network figures (cluster.nic_line_rate and cluster.nics_per_node)"
        in_network = collective == "all_reduce" and model.nccl_env.get("NCCL_COLLNET_ENABLE") == "1"
        units, r, unit_name, bw = nodes, per_node, "node", peaks.node_network
    traffic, traffic_text = _traffic(collective, units, r, in_network)
    value = bw.value * factor / traffic
    arithmetic = (
        f"B x bus factor / traffic per {unit_name} = {_gbs(bw.value)} ({bw.source}) "
        f"x {factor_text} = {factor:.4g} (n = {ranks} ranks) / {traffic_text} "
        f"(U = {units} {unit_name}s{f', r = {r} ranks each' if collective == 'alltoall' else ''}) "
        f"= {_gbs(value)}"
    )
    if nodes == 1 and not in_network:
        arithmetic += (
            "; inside one node busbw is normalised to the bytes each GPU moves, so this is the link itself"
        )
    if in_network and nodes == 1:
        plain = bw.value * factor / _traffic(collective, units, r, False)[0]
        arithmetic += f"; this allows NVLink SHARP (NVLS) in-switch reduction, without which the ceiling is {_gbs(plain)}"
    return Ceiling(value, arithmetic)


# --------------------------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------------------------


def _shape(model_name: str) -> metrics.TransformerShape | None:
    try:
        from pytest_gpucluster.maths.shapes import get_shape
    except ImportError:  # pragma: no cover - maths ships with the package
        try:
            return metrics.shape_for(model_name)
        except ValueError:
            return None
    try:
        return get_shape(model_name).dims
    except ValueError:
        return None


def case_world(case: SftCase, cluster: ClusterSection) -> int:
    """Ranks of an SFT case: its nodes x its ranks per node (the cluster's when it sets none)."""
    return case.nodes * (case.ranks_per_node or cluster.effective_ranks_per_node)


def implied_mfu(
    case: SftCase, field: str, value: float, cluster: ClusterSection, peak: Figure
) -> tuple[float, str] | None:
    """The MFU a throughput threshold demands, with its arithmetic; None for an unknown model."""
    shape = _shape(case.model)
    if shape is None:
        return None
    world = case_world(case, cluster)
    t = case.seq_len
    if field == "min_samples_per_s":
        tokens = value * t / world
        rate = f"{_sig(value, 6)} samples/s x {t} tokens / {world} GPUs = {_sig(tokens, 6)} tokens/s per GPU"
    elif field == "min_tokens_per_s_per_gpu":
        tokens = value
        rate = f"{_sig(tokens, 6)} tokens/s per GPU"
    elif field == "max_step_time":
        per_step = case.micro_batch * case.grad_accum * t
        tokens = per_step / value
        rate = (
            f"{case.micro_batch} x {case.grad_accum} x {t} tokens per GPU per step "
            f"(micro_batch x grad_accum x seq_len) / {value:.4g} s = {_sig(tokens, 6)} tokens/s per GPU"
        )
    else:
        raise ValueError(f"not a throughput threshold: {field}")
    fpt = shape.flops_per_token(t)
    needed = tokens * fpt
    mfu = metrics.mfu(tokens, fpt, peak.value)
    text = (
        f"{rate}; x {_sig(fpt / 1e9)} GFLOP/token ({case.model} at seq_len {t}, PaLM 6N + 12·L·H·Q·T) "
        f"= {_tflops(needed)} per GPU; / {_tflops(peak.value)} dense peak ({peak.source}) = {_pct(mfu)} MFU"
    )
    return mfu, text


# --------------------------------------------------------------------------------------------
# The whole profile
# --------------------------------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.skipped: list[str] = []
        self.checked = 0

    def error(self, key: KeyPath, message: str) -> None:
        self.findings.append(Finding("error", key, message))

    def warning(self, key: KeyPath, message: str) -> None:
        self.findings.append(Finding("warning", key, message))

    def skip(self, key: KeyPath, reason: str) -> None:
        from pytest_gpucluster.profiles.loader import format_key

        self.skipped.append(f"{format_key(key)}: {reason}")


def _check_busbw(
    out: _Collector,
    key: KeyPath,
    value: float,
    collective: str,
    scope: str,
    model: ProfileModel,
    peaks: Peaks,
) -> None:
    ceiling = busbw_ceiling(collective, scope, model, peaks)
    if isinstance(ceiling, str):
        out.skip(key, f"not checked against the links: {ceiling}")
        return
    out.checked += 1
    if value > ceiling.value:
        out.error(
            key,
            f"min_busbw {_gbs(value)} ({collective}, {scope}) is more than the links can carry: "
            f"busbw ceiling = {ceiling.arithmetic}; {_gbs(value)} > {_gbs(ceiling.value)}",
        )


def _check_fraction(out: _Collector, key: KeyPath, value: float | None, what: str) -> None:
    if value is None:
        return
    out.checked += 1
    if value > 1.0:
        out.error(key, f"{what} {_pct(value)} is above 100%, which cannot be measured")


def _check_case(out: _Collector, index: int, case: SftCase, model: ProfileModel, peaks: Peaks) -> None:
    base: KeyPath = ("sft", "cases", index)
    cluster = model.cluster
    for field in ("min_samples_per_s", "min_tokens_per_s_per_gpu", "max_step_time"):
        value = getattr(case, field)
        if value is None:
            continue
        key = (*base, field)
        if peaks.peak_flops is None:
            out.skip(key, "no device peak (cluster.peak_flops, or a gpu_model in devices.yaml)")
            continue
        if field == "max_step_time" and value <= 0:
            out.error(key, "max_step_time must be positive")
            continue
        result = implied_mfu(case, field, value, cluster, peaks.peak_flops)
        if result is None:
            out.skip(key, f"model {case.model!r} is not a named shape; its FLOPs per token are unknown")
            continue
        out.checked += 1
        mfu, text = result
        shown = f"{value:.4g} s" if field == "max_step_time" else _sig(value, 6)
        if mfu > 1.0:
            out.error(
                key,
                f"{field} {shown} implies {_pct(mfu)} MFU, more than the GPU's peak: {text}. "
                "No GPU computes faster than its peak; lower the threshold (or fix seq_len/model/peak_flops).",
            )
        elif mfu > MFU_WARNING:
            out.warning(
                key,
                f"{field} {shown} implies {_pct(mfu)} MFU, above {_pct(MFU_WARNING)} (PaLM reports 46.2%): "
                f"{text}. Possible, but check the number.",
            )
    if case.min_mfu is not None:
        key = (*base, "min_mfu")
        out.checked += 1
        if case.min_mfu > 1.0:
            out.error(
                key, f"min_mfu {_pct(case.min_mfu)} is above 100%: no GPU computes faster than its peak"
            )
        elif case.min_mfu > MFU_WARNING:
            out.warning(
                key, f"min_mfu {_pct(case.min_mfu)} is above {_pct(MFU_WARNING)} (PaLM reports 46.2%)"
            )
    _check_fraction(out, (*base, "min_gpu_util"), case.min_gpu_util, "min_gpu_util")
    if case.max_peak_memory is not None:
        key = (*base, "max_peak_memory")
        if cluster.device != "cuda":
            out.skip(key, "a CPU profile's peak memory is resident memory, not device memory")
        elif peaks.memory is None:
            out.skip(key, "no device memory (cluster.gpu_memory, or a gpu_model in devices.yaml)")
        else:
            out.checked += 1
            if case.max_peak_memory > peaks.memory.value:
                out.error(
                    key,
                    f"max_peak_memory {_gib(case.max_peak_memory)} is above the device memory "
                    f"{_gib(peaks.memory.value)} ({peaks.memory.source}): a process cannot hold more "
                    "than the device has, so this ceiling never fails",
                )


def _check_burnin(out: _Collector, model: ProfileModel, peaks: Peaks) -> None:
    """Per-GPU floors of the burn-in section against the device's own peaks."""
    burnin = getattr(model, "burnin", None)
    if burnin is None:
        return
    for field, figure, what, show in (
        ("min_matmul", peaks.peak_flops, "the dense bf16 peak", _tflops),
        ("min_memory_bandwidth", peaks.memory_bandwidth, "the memory bandwidth", _gbs),
        ("min_h2d_bandwidth", peaks.pcie, "the host link", _gbs),
    ):
        value = getattr(burnin, field, None)
        if value is None:
            continue
        key = ("burnin", field)
        if model.cluster.device != "cuda" or figure is None:
            out.skip(key, "no device figure to hold it against")
            continue
        out.checked += 1
        if value > figure.value:
            out.error(
                key,
                f"{field} {show(value)} per GPU is above {what}, {show(figure.value)} ({figure.source}): "
                "no GPU measures more than its peak",
            )
    value = getattr(burnin, "pair_min_busbw", None)
    if value is not None:
        _check_busbw(out, ("burnin", "pair_min_busbw"), value, "all_reduce", "inter-node", model, peaks)


def check_profile(model: ProfileModel, devices: tuple[Device, ...] | None = None) -> PhysicsReport:
    """Hold every threshold of a validated profile against the peaks of its hardware."""
    out = _Collector()
    peaks = peaks_for(model, devices)
    for index, check in enumerate(model.collectives.checks):
        if check.min_busbw is not None:
            key = ("collectives", "checks", index, "min_busbw")
            _check_busbw(out, key, check.min_busbw, check.collective, check.scope, model, peaks)
    if model.nvlink is not None:
        for field, scope in (
            ("min_busbw", "intra-node"),
            ("isolated_intra_min_busbw", "intra-node"),
            ("isolated_inter_min_busbw", "inter-node"),
        ):
            value = getattr(model.nvlink, field)
            if value is not None:
                _check_busbw(out, ("nvlink", field), value, "all_reduce", scope, model, peaks)
        links = model.nvlink.links_per_gpu
        if links is not None and peaks.device is not None and model.cluster.device == "cuda":
            out.checked += 1
            if links > peaks.device.nvlink_links:
                out.error(
                    ("nvlink", "links_per_gpu"),
                    f"links_per_gpu {links} is more than the {peaks.device.nvlink_links} NVLinks "
                    f"of a {peaks.device.name} ({peaks.device.source})",
                )
    for index, case in enumerate(model.sft.cases):
        _check_case(out, index, case, model, peaks)
    _check_burnin(out, model, peaks)
    if model.scaling is not None:
        for index, step in enumerate(model.scaling.steps):
            key = ("scaling", "steps", index, "min_efficiency")
            out.checked += 1
            if step.min_efficiency > 1.0:
                out.error(
                    key,
                    f"min_efficiency {_pct(step.min_efficiency)} from {step.from_nodes} to {step.to_nodes} "
                    f"{model.scaling.unit} is above 100%: throughput({step.to_nodes}) / "
                    f"({step.to_nodes}/{step.from_nodes} x throughput({step.from_nodes})) cannot be "
                    "gated above linear scaling",
                )
    return PhysicsReport(tuple(out.findings), out.checked, tuple(out.skipped))
