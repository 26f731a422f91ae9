"""Profile sections of the burn-in: health floors, stragglers, the soak, DCGM's diagnostics and
the fabric's ports and counters (``burnin:``, ``fabric:``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field, field_validator

from pytest_gpucluster.profiles.fields import (
    Bandwidth,
    Duration,
    FlopRate,
    Fraction,
    Section,
    Size,
    Timeout,
)
from pytest_gpucluster.profiles.schema_ib import IbFabricSettings


class SoakSettings(Section):
    """The soak (``--gpucluster-soak DURATION``, acceptance/test_fabric.py::test_soak): every busbw
    point of ``collectives.checks`` repeated for the duration on its scope (intra-node: every node at
    once; inter-node: every disjoint node pair at once; full: all nodes), in timed samples."""

    sample_time: Duration = Field(
        1.0,
        gt=0,
        description="Each sample times back-to-back collectives for about this long. The count per "
        "sample is fixed from a first timed call, so a link that slows down makes its samples longer, "
        "never lighter.",
    )
    min_busbw_fraction: Fraction = Field(
        1.0,
        gt=0,
        description="The lowest sample of every series must reach this fraction of its point's floor "
        "(collectives.checks[i].min_busbw): the floor holds at every moment of the window, not only at "
        "the median of a few repeats.",
    )
    max_cv: Fraction | None = Field(
        None,
        description="Coefficient of variation (population standard deviation / mean) of each series' "
        "busbw, at most; unset: recorded, not gated.",
    )
    source: str | None = Field(None, description="Where max_cv and min_busbw_fraction come from.")


class DcgmSettings(Section):
    """``dcgmi diag -r <level> -j`` on every node that has DCGM (acceptance/test_fabric.py::test_dcgm_diag)."""

    level: int = Field(
        2,
        ge=1,
        le=4,
        description="The run level: 1 quick (seconds), 2 medium (about 2 minutes), 3 long (about 15 "
        "minutes), 4 extended (longer), per NVIDIA's dcgmi diag reference (docs.nvidia.com/datacenter/"
        "dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html).",
    )
    timeout: Timeout | None = Field(
        None,
        description="Deadline of the diag job; default: 10 min (level 1), 20 min (2), 1 h (3), 4 h (4).",
    )

    @property
    def effective_timeout(self) -> float:
        default = {1: 600.0, 2: 1200.0, 3: 3600.0, 4: 14400.0}[self.level]
        return self.timeout if self.timeout is not None else default


class BurninSection(Section):
    """Burn-in (acceptance/test_burnin.py): per-rank health floors, straggler tolerance, pairwise
    localization. Every floor is optional: an unset one is measured and reported, not gated."""

    straggler_tolerance: Fraction = Field(
        0.25,
        description="A rank, node or node pair slower than the median of its peers by more than this "
        "fraction of time is a suspect (a rate below median / (1 + tolerance); 1.0: twice as slow).",
    )
    straggler_min_excess: Duration = Field(
        0.001,
        description="...and slower by more than this many seconds (per iteration): smaller differences "
        "are timer noise.",
    )
    min_cpu_matmul: FlopRate | None = Field(None, description="float32 matmul per rank, on the CPU.")
    min_cpu_memory_bandwidth: Bandwidth | None = Field(None, description="Host memory copy per rank.")
    min_matmul: FlopRate | None = Field(None, description="Dense bf16 matmul per GPU.")
    min_memory_bandwidth: Bandwidth | None = Field(None, description="Device memory copy per GPU.")
    min_h2d_bandwidth: Bandwidth | None = Field(None, description="Pinned host-to-device copy per GPU.")
    max_temperature: float | None = Field(None, gt=0, description="GPU temperature, degrees Celsius.")
    max_power: float | None = Field(None, gt=0, description="GPU power draw, watts.")
    min_pcie_gen: int | None = Field(None, ge=1, description="Current PCIe link generation per GPU.")
    min_pcie_width: int | None = Field(None, ge=1, description="Current PCIe link width (lanes) per GPU.")
    max_retired_pages: int | None = Field(None, ge=0, description="Retired pages / remapped rows per GPU.")
    load_duration: Duration = Field(
        5.0,
        gt=0,
        description="How long the health job loads each GPU (bf16 matmul after the benchmarks) while "
        "temperature, power, clocks and clock reasons are sampled; the ceilings (max_temperature, "
        "max_power, forbidden_throttle_reasons) are judged on the sustained part, the last half. "
        "Minutes on a real burn-in (a weak cooler shows after a minute or more), seconds on cpu-local.",
    )
    require_xid_source: bool = Field(
        False,
        description="Fail a node whose XID events no source could read (kernel log, NVML, DCGM). Default: "
        "a warning with the one-line fix (group membership or kernel.dmesg_restrict), never a failure for "
        "the permission alone.",
    )
    max_corrected_ecc_per_hour: float | None = Field(
        None,
        ge=0,
        description="Ceiling on each GPU's corrected ECC errors (and correctable remapped rows) per hour "
        "between the first and the last counter reading; null (default): recorded, not gated. "
        "Uncorrectable errors, retired pages, pending remaps and remap failures always gate at zero.",
    )
    forbidden_throttle_reasons: tuple[str, ...] = Field(
        ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"),
        description="NVML clock throttle reasons that fail a GPU when active.",
    )
    pair_size: Size = Field(4 * 2**20, description="all_reduce size of each pairwise node test.")
    pair_iters: int = Field(10, ge=1, description="Timed all_reduce iterations per pairwise test.")
    pair_min_busbw: Bandwidth | None = Field(None, description="Absolute floor for every node pair.")
    soak: SoakSettings = Field(default_factory=SoakSettings)
    dcgm: DcgmSettings = Field(default_factory=DcgmSettings)


class FabricSection(Section):
    """Fabric ports (acceptance/test_fabric.py::test_fabric_before/after): every IB/RoCE port and
    network interface NCCL may use, read on every node before the first test and after the last;
    error counters that grew fail, naming node, device and port. Port count and rate are judged
    against ``cluster.nics_per_node`` and ``cluster.nic_line_rate``."""

    ib_devices: str | None = Field(
        None,
        description="The IB/RoCE devices (and ports) that count, in NCCL_IB_HCA's syntax: prefixes "
        "'mlx5', exact '=mlx5_0:1,mlx5_3:1', exclusions '^mlx5_4'. Default: the session's NCCL_IB_HCA, "
        "else every device.",
    )
    interfaces: str | None = Field(
        None,
        description="The network interfaces that count, in NCCL_SOCKET_IFNAME's syntax ('eth', "
        "'=eth0,eth1', '^docker,lo'). Default: the session's NCCL_SOCKET_IFNAME, else as NCCL picks "
        "(interfaces starting with 'ib', else every one but docker* and lo). Only interfaces that are up "
        "in the first reading count.",
    )
    max_error_increase: int = Field(
        0,
        ge=0,
        description="How much each link-class counter (link downed, link recovery, receive errors, "
        "integrity, buffer overrun, NIC rx/tx errors...) and, in a window where the suite killed no job, "
        "each transport-class counter (completion, remote-access and RNR-retry errors) may grow over the "
        "run, per port. Symbol errors are judged by max_bit_error_rate.",
    )
    max_bit_error_rate: float = Field(
        1e-12,
        ge=0,
        description="Ceiling for symbol errors per bit a port received over the run (a bit error rate). "
        "On EDR/HDR/NDR links symbol errors are the errors left after forward error correction, and "
        "NVIDIA's ibdiagnet BER test takes 1e-12 as its default threshold; a count gated at zero would "
        "fail long runs on many links for errors within the link's specification. A port whose data "
        "counters are unreadable is judged by max_error_increase instead.",
    )
    max_retransmits_per_gb: float | None = Field(
        100.0,
        ge=0,
        description="Ceiling for each retransmit-class counter (local_ack_timeout_err, packet_seq_err, "
        "out_of_sequence, ...), as its growth per GB (1e9 bytes) the port moved over the run; null: "
        "recorded, not gated.",
    )
    retransmits_per_gb: dict[str, float | None] = Field(
        default_factory=dict,
        description="Per retransmit counter, a ceiling other than max_retransmits_per_gb (null: recorded "
        "only): {hw_out_of_sequence: 5000} where adaptive routing reorders by design.",
    )
    max_drop_increase: int | None = Field(
        None,
        ge=0,
        description="How much each drop-class counter (rx_dropped, tx_dropped, port_xmit_discards, "
        "out_of_buffer, qdisc drops...) may grow; null (default): recorded and shown, not gated.",
    )
    allowed_increase: dict[str, int] = Field(
        default_factory=dict,
        description="Per link- or drop-class counter, an allowance other than the class's: "
        "{symbol_error: 10, qdisc_drops: 0}.",
    )
    saturated: Literal["fail", "warn"] = Field(
        "fail",
        description="An error counter pinned at its maximum (IB counters stop there: link_downed at 255, "
        "port_xmit_discards at 65535) cannot show growth: 'fail' (default: the run cannot prove the port "
        "clean; clear the counters and run again) or 'warn' (recorded and warned, not failed).",
    )
    source: str | None = Field(None, description="Where the allowances come from.")
    ib: IbFabricSettings = Field(
        default_factory=IbFabricSettings,
        description="The InfiniBand fabric as cabled, for `gpucluster fabric scan`: rated link, rails, layout.",
    )

    @field_validator("allowed_increase")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"allowances must be 0 or more, got {bad}")
        _known(value, ("link", "ber", "transport", "drop"), "an allowance (a count)")
        return value

    @field_validator("retransmits_per_gb")
    @classmethod
    def _retransmit_counters(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        bad = {k: v for k, v in value.items() if v is not None and v < 0}
        if bad:
            raise ValueError(f"ceilings must be 0 or more, got {bad}")
        _known(value, ("retransmit",), "a rate ceiling per GB")
        return value


def _known(names: Iterable[str], classes: tuple[str, ...], what: str) -> None:
    """A counter name the classes do not know would silently judge nothing (a typo): refuse it."""
    from pytest_gpucluster.parsers.fabric_diff import COUNTER_CLASSES

    for name in names:
        got = COUNTER_CLASSES.get(name)
        if got not in classes:
            allowed = sorted(k for k, c in COUNTER_CLASSES.items() if c in classes)
            where = f"is a {got}-class counter" if got else "is not a counter this plugin knows"
            raise ValueError(
                f"{name!r} {where}; {what} applies to the {'/'.join(classes)} class: {', '.join(allowed)}"
            )
