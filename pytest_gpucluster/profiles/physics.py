"""Refuse thresholds the hardware cannot meet, and flag the ones that cannot fail.

A profile is checked against the peaks of the hardware it names (its ``cluster:`` figures, else
``thresholds/devices.yaml``), and its NCCL environment against the floors it must produce. Every
finding states the arithmetic, so the author sees which number is wrong and by how much. Errors
are thresholds no healthy machine can meet (or settings that cannot run); warnings are thresholds
that are possible but suspicious, or too loose to catch a sick machine. thresholds/README.md
lists every check and how to satisfy it; the modules hold the reasoning:

- ``links``: busbw floors against NVLink/PCIe/NIC ceilings, and the NCCL algorithm a floor needs.
- ``env_checks``: NIC lists matched by prefix, NCCL_ALGO values NCCL misreads.
- ``cases``: SFT throughput (implied MFU), memory (ZeRO states + activations), run time against
  the job timeout, gates that cannot fail; scaling efficiency.
- this module: burn-in and numerics floors and NVLink settings, and :func:`check_profile`, which
  runs them all.

Import order (no cycles): schema <- devices <- peaks <- links/cases/env_checks <- physics <- loader.
"""

from __future__ import annotations

from pytest_gpucluster.profiles.cases import MFU_WARNING, case_world, check_case, check_scaling, implied_mfu
from pytest_gpucluster.profiles.devices import Device
from pytest_gpucluster.profiles.env_checks import check_nccl_env
from pytest_gpucluster.profiles.findings import Collector, Finding, PhysicsReport, gbs, tflops
from pytest_gpucluster.profiles.links import Ceiling, busbw_ceiling, check_busbw, check_collective_floor
from pytest_gpucluster.profiles.peaks import Figure, Peaks, peaks_for
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = [
    "MFU_WARNING",
    "ONE_RANK",
    "Ceiling",
    "Figure",
    "Finding",
    "Peaks",
    "PhysicsReport",
    "busbw_ceiling",
    "case_world",
    "check_profile",
    "implied_mfu",
    "peaks_for",
]


def _check_device(out: Collector, model: ProfileModel, peaks: Peaks) -> None:
    """A gpu_model that names only a family: say which part the checks assumed."""
    match = peaks.match
    if match is None or match.exact:
        return
    parts = ", ".join(f"{d.key} ({d.part})" for d in match.candidates)
    out.warning(
        ("cluster", "gpu_model"),
        f"gpu_model {model.cluster.gpu_model!r} names a family, not a part ({parts}): the physics checks "
        f"assume {match.device.key}, the strongest, and --hw=auto never selects this profile. Name the part: "
        f"its name as nvidia-smi prints it ({', '.join(repr(d.names[0]) for d in match.candidates)}) or its key.",
    )


def _check_nvlink(out: Collector, model: ProfileModel, peaks: Peaks) -> None:
    nvlink = model.nvlink
    if nvlink is None:
        return
    for field, scope in (
        ("min_busbw", "intra-node"),
        ("isolated_intra_min_busbw", "intra-node"),
        ("isolated_inter_min_busbw", "inter-node"),
    ):
        value = getattr(nvlink, field)
        if value is not None:
            check_busbw(out, ("nvlink", field), value, "all_reduce", scope, model, peaks)
    links = nvlink.links_per_gpu
    if links is not None and peaks.device is not None and model.cluster.device == "cuda":
        out.checked += 1
        if links > peaks.device.nvlink_links:
            out.error(
                ("nvlink", "links_per_gpu"),
                f"links_per_gpu {links} is more than the {peaks.device.nvlink_links} NVLinks "
                f"of a {peaks.device.name} ({peaks.device.source})",
            )


def _check_burnin(out: Collector, model: ProfileModel, peaks: Peaks) -> None:
    """Per-GPU floors of the burn-in section against the device's own peaks."""
    burnin = model.burnin
    for field, figure, what, show in (
        ("min_matmul", peaks.peak_flops, "the dense bf16 peak", tflops),
        ("min_memory_bandwidth", peaks.memory_bandwidth, "the memory bandwidth", gbs),
        ("min_h2d_bandwidth", peaks.pcie, "the host link", gbs),
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
    if burnin.pair_min_busbw is not None:
        check_busbw(
            out, ("burnin", "pair_min_busbw"), burnin.pair_min_busbw, "all_reduce", "inter-node", model, peaks
        )


def _check_numerics(out: Collector, model: ProfileModel, peaks: Peaks) -> None:
    """Per-dtype GEMM floors against the part's dense peak for the dtype (devices.yaml dense_flops):
    above it, or for a dtype the part has no peak for (fp8 on Ampere), no GPU can meet them."""
    for dtype, value in model.numerics.min_flops.items():
        key = ("numerics", "min_flops", dtype)
        device = peaks.device
        if model.cluster.device != "cuda" or device is None:
            out.skip(key, "no device figure to hold it against")
            continue
        out.checked += 1
        peak = device.dense_peak(dtype)
        if peak is None:
            out.error(
                key,
                f"min_flops.{dtype} {tflops(value)} per GPU: a {device.name} has no dense {dtype} peak in "
                f"devices.yaml {device.key} (no {dtype} tensor cores), so the check could only ever be not "
                "measured; remove the floor",
            )
        elif value > peak:
            out.error(
                key,
                f"min_flops.{dtype} {tflops(value)} per GPU is above the dense {dtype} peak, {tflops(peak)} "
                f"(devices.yaml {device.key} dense_flops.{dtype}): no GPU measures more than its peak",
            )


ONE_RANK = (
    "a collective on one rank measures nothing: an all_reduce moves no bus traffic (busbw factor "
    "2(n-1)/n = 0) and a broadcast or reduce through torch's in-place API is a no-op timed at launch cost"
)
"""Why a collective check whose scope has a single rank is refused here and skipped by the run."""


def _check_scope_ranks(out: Collector, model: ProfileModel) -> None:
    """A collectives check whose scope runs on one rank (one GPU per node inside a node, one node
    of one rank in full) is a degenerate measurement, whatever its floor: refused."""
    per_node = model.cluster.effective_ranks_per_node
    for index, check in enumerate(model.collectives.checks):
        nodes = {"intra-node": 1, "inter-node": 2, "full": model.cluster.nodes}[check.scope]
        if nodes * per_node >= 2:
            continue
        key = "min_busbw" if check.min_busbw is not None else "max_latency"
        where = (
            "cluster.ranks_per_node" if model.cluster.ranks_per_node is not None else "cluster.gpus_per_node"
        )
        out.error(
            ("collectives", "checks", index, key),
            f"{check.collective} at scope {check.scope} runs on {nodes * per_node} rank ({nodes} node x "
            f"{per_node} rank per node, {where}): {ONE_RANK}. Remove the check, or set it in a profile "
            "of nodes with 2 or more GPUs",
        )


_NO_NVSWITCH_FORMS = ("-pcie", "-nvl")
"""Part keys whose NVLink (if any) is a bridge between pairs of cards: no NVSwitch, no Fabric Manager."""
_RDMA = ("ib", "roce", "efa")


def _check_readiness(out: Collector, model: ProfileModel, peaks: Peaks) -> None:
    """Readiness requirements the hardware the profile names cannot have, or cannot use."""
    ready = model.readiness
    device = peaks.device
    if ready.fabric_manager and device is not None:
        bridged = device.key.endswith(_NO_NVSWITCH_FORMS)
        if device.nvlink_links == 0 or bridged:
            what = "has no NVLink" if device.nvlink_links == 0 else "links pairs of cards by NVLink bridges"
            out.error(
                ("readiness", "fabric_manager"),
                f"readiness.fabric_manager: true, but {device.part} ({device.key}) {what}: there is no NVSwitch "
                "for Fabric Manager to configure, so the check could never pass. Remove the key.",
            )
    rdma = [name for name in ("gpudirect_rdma", "acs_disabled") if getattr(ready, name)]
    if rdma and not any(kind in model.cluster.interconnects for kind in _RDMA):
        out.warning(
            ("readiness", rdma[0]),
            f"readiness.{', readiness.'.join(rdma)} judge the GPUDirect RDMA path, but cluster.interconnects "
            f"({', '.join(model.cluster.interconnects) or 'none'}) names no ib, roce or efa: a node would "
            "fail for a path this profile never uses. Add the fabric to interconnects or remove the keys.",
        )


def check_profile(model: ProfileModel, devices: tuple[Device, ...] | None = None) -> PhysicsReport:
    """Hold every threshold of a validated profile against the peaks of its hardware."""
    out = Collector()
    peaks = peaks_for(model, devices)
    _check_device(out, model, peaks)
    check_nccl_env(out, model)
    _check_scope_ranks(out, model)
    for index, check in enumerate(model.collectives.checks):
        check_collective_floor(out, index, check, model, peaks)
    _check_nvlink(out, model, peaks)
    for index, case in enumerate(model.sft.cases):
        check_case(out, index, case, model, peaks)
    _check_burnin(out, model, peaks)
    _check_numerics(out, model, peaks)
    _check_readiness(out, model, peaks)
    check_scaling(out, model)
    return out.report()
