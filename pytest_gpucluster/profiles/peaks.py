"""The hardware figures a profile's thresholds are held against, and where each one comes from.

A figure in the profile's ``cluster:`` section wins; otherwise the part ``cluster.gpu_model``
names in ``thresholds/devices.yaml``. The per-node network figure is NIC line rate x NICs, where
the NICs are the ones NCCL will use: all ``cluster.nics_per_node``, or fewer when ``NCCL_IB_HCA``
lists them exactly (``=mlx5_0,mlx5_1`` on an 8-NIC node is 2 NICs' worth).

Imports ``devices``, ``nccl_env`` and the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpucluster.profiles.devices import Device, DeviceMatch, resolve_gpu_model
from pytest_gpucluster.profiles.nccl_env import nic_selection
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["Figure", "Peaks", "node_network", "peaks_for"]


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
    """Per-node network bandwidth per direction: NIC line rate x the NICs NCCL uses."""
    nvls: bool
    memory_bandwidth: Figure | None = None
    pcie: Figure | None = None
    """The GPU's host link per direction."""
    match: DeviceMatch | None = None
    """How ``cluster.gpu_model`` resolved (exactly, or only to a family)."""
    intra_is_nvlink: bool = False
    """Whether ``intra_link`` is NVLink (else the PCIe host link)."""


def node_network(model: ProfileModel, env: dict[str, str] | None = None) -> Figure | None:
    """NIC line rate x the NICs NCCL uses under ``env`` (default: ``nccl_env``); None without
    ``cluster.nic_line_rate`` and ``cluster.nics_per_node``."""
    cluster = model.cluster
    if not (cluster.nic_line_rate and cluster.nics_per_node):
        return None
    env = model.nccl_env if env is None else env
    selection = nic_selection(env)
    count, why = cluster.nics_per_node, "cluster.nics_per_node x cluster.nic_line_rate"
    if selection.exact_count is not None and selection.exact_count < cluster.nics_per_node:
        count = selection.exact_count
        why = (
            f"NCCL_IB_HCA={selection.value!r} selects {count} of cluster.nics_per_node "
            f"{cluster.nics_per_node}; cluster.nic_line_rate"
        )
    rate = cluster.nic_line_rate
    return Figure(rate * count, f"{count} NICs x {rate * 8 / 1e9:g} Gb/s ({why})")


def peaks_for(model: ProfileModel, devices: tuple[Device, ...] | None = None) -> Peaks:
    """The figures the checks use: the profile's ``cluster:`` section first, then the device table."""
    cluster = model.cluster
    match = resolve_gpu_model(cluster.gpu_model, devices) if cluster.device == "cuda" else None
    device = match.device if match else None
    dev_src = f"devices.yaml {device.key}" if device else ""

    peak = None
    if cluster.peak_flops:
        peak = Figure(cluster.peak_flops, "cluster.peak_flops")
    elif device:
        peak = Figure(device.peak_flops, dev_src)

    # vendors print binary capacities with decimal labels: "80GB" in a profile is 80e9 bytes
    # while the card holds 80 GiB, so the larger stated capacity is the one held against
    candidates = []
    if cluster.gpu_memory:
        candidates.append(Figure(cluster.gpu_memory, "cluster.gpu_memory"))
    if device:
        candidates.append(Figure(device.memory, dev_src))
    memory = max(candidates, key=lambda f: f.value) if candidates else None

    intra, is_nvlink = None, True
    if cluster.nvlink_bandwidth:
        intra = Figure(cluster.nvlink_bandwidth, "NVLink per direction, cluster.nvlink_bandwidth")
    elif device and device.nvlink_bandwidth:
        intra = Figure(device.nvlink_bandwidth, f"NVLink per direction, {dev_src}")
    elif device:
        intra, is_nvlink = (
            Figure(device.pcie_bandwidth, f"PCIe x16 per direction (no NVLink), {dev_src}"),
            False,
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
    return Peaks(device, peak, memory, intra, node_network(model), nvls, memory_bw, pcie, match, is_nvlink)
