"""The ``readiness:`` section of a profile: what a node must have before GPU work is worth
measuring, read by the per-node probe (`workloads.readiness_probe`) and judged per node by
`checks.readiness` (``acceptance/test_inventory.py::test_node_readiness``). A key left unset is
not judged; a key that is set and could not be read on a node fails that node as NOT MEASURED,
naming what the reading needs (root, a program), like every other gated value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pytest_gpucluster.profiles.fields import Section, Size

__all__ = ["ReadinessSection"]


class ReadinessSection(Section):
    """Node readiness thresholds (docs/reference/readiness.md: each check, its finding, its action)."""

    fabric_manager: bool | None = Field(
        None,
        description="NVSwitch nodes (HGX/DGX A100, H100, H200, B200): the nvidia-fabricmanager service is "
        "active and every GPU's NVML fabric state is Completed with status Success. Without it CUDA has "
        "no NVLink peer access (error 802, 'system not yet initialized'). Action: start nvidia-fabricmanager.",
    )
    nvlink_domain: Literal["node", "cluster"] | None = Field(
        None,
        description="Multi-node NVLink (GB200 NVL72 and later): the NVLink domain each GPU is in, its fabric "
        "ClusterUUID and CliqueId (nvidia-smi -q 'Fabric', driver 550+), agrees across the GPUs of each node "
        "('node'), or across every GPU of the run ('cluster': the nodes form one NVLink domain, as the trays of "
        "one NVL72 rack). NCCL joins GPUs over multi-node NVLink only when both agree; a tray in another "
        "partition, or in none, talks to the others over the network without an error. A node whose GPUs report "
        "no fabric (PCIe, no NVSwitch) needs none: not needed; an all-zero ClusterUUID (a single-node NVSwitch "
        "fabric) is no multi-node domain. Action: fix node setup (the tray's NVLink Switch, Fabric Manager and "
        "IMEX configuration).",
    )
    max_sxid_fatal: int | None = Field(
        None,
        ge=0,
        description="Fatal NVSwitch SXid errors allowed in the kernel log (and Fabric Manager's log). A fatal "
        "SXid leaves the switch unusable until the GPUs and switches are reset. Action: drain the node.",
    )
    gpudirect_rdma: bool | None = Field(
        None,
        description="GPUDirect RDMA is possible: the nvidia_peermem module is loaded, or the NVIDIA open kernel "
        "module runs on a 5.12+ kernel (NCCL's dma-buf path). Without it NCCL copies through host memory. "
        "Action: load nvidia_peermem (modprobe nvidia_peermem).",
    )
    min_memlock: Literal["unlimited"] | Size | None = Field(
        None,
        description="The locked-memory limit a launched rank gets (ulimit -l): NCCL and libibverbs pin their "
        "buffers; below this they fail to register memory. 'unlimited' or a size. Action: raise memlock in "
        "/etc/security/limits.conf (and the Slurm/container runtime's limits).",
    )
    acs_disabled: bool | None = Field(
        None,
        description="No PCIe bridge on a GPU <-> RDMA NIC path redirects peer-to-peer traffic (ACSCtl ReqRedir+ "
        "/ CmpltRedir+): bare-metal GPUDirect RDMA needs ACS off. Read with lspci -vvv, which needs root to "
        "see the capability. Action: disable ACS in BIOS (or setpci at boot).",
    )
    iommu_passthrough: bool | None = Field(
        None,
        description="The IOMMU is off or in passthrough (identity) mode: a translating IOMMU puts every GPUDirect "
        "transfer through address translation and can block peer-to-peer. Action: boot with iommu=pt "
        "(intel_iommu=on iommu=pt / amd_iommu=pt).",
    )
    max_pending_row_remaps: int | None = Field(
        None,
        ge=0,
        description="GPUs with a row remap pending allowed per node: the remap is applied at the next GPU reset, "
        "and until then the bad row is still in use. Action: reset GPU to apply pending row remaps.",
    )
    max_row_remap_failures: int | None = Field(
        None,
        ge=0,
        description="GPUs whose row remapping failed (no spare rows left) allowed per node. Action: RMA.",
    )
    max_retired_pages: int | None = Field(
        None,
        ge=0,
        description="Retired pages (single- plus double-bit) per GPU, on parts with page retirement (pre-Ampere; "
        "N/A elsewhere, then not judged for that GPU). Action: RMA when past it.",
    )
    persistence_mode: bool | None = Field(
        None,
        description="Every GPU has persistence mode on (nvidia-smi -pm 1 or nvidia-persistenced): without it the "
        "driver tears the GPU down between jobs, and the next job pays the start-up. Action: enable persistence "
        "mode.",
    )
    max_stuck_processes: int | None = Field(
        None,
        ge=0,
        description="Processes in uninterruptible sleep (D state) on two reads 0.2 s apart: a process stuck in "
        "the driver or a filesystem that a job will queue behind. Action: drain the node.",
    )
    max_aer_fatal: int | None = Field(
        None,
        ge=0,
        description="PCIe AER fatal plus non-fatal (uncorrectable) errors counted on a GPU or NIC since boot "
        "(sysfs aer_dev_fatal, aer_dev_nonfatal). Action: reseat the GPU/NIC, else RMA.",
    )
    pcie_full_width: bool | None = Field(
        None,
        description="Every GPU and RDMA NIC link is trained at its maximum width at rest (sysfs current_link_width "
        "= max_link_width). The speed (generation) is not judged at rest: GPUs lower it when idle. Action: reseat "
        "the card or riser.",
    )
    source: str | None = None
