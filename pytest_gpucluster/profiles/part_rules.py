"""How a part profile's floors follow from the datasheet figures of its part (``devices.yaml``).

A part profile (``thresholds/<device key>.yaml``, e.g. ``h200-sxm.yaml``) describes one GPU part and
nothing of a site: node shape, peaks, NVLink, and floors. Every floor is one of the rules below
applied to the part's devices.yaml entry; the YAML writes the arithmetic beside each number, and
``tests/unit/test_part_profiles.py`` recomputes every one from the table, so the files cannot
drift from the rules or the table.

The fractions are set between a healthy part and a broken one:

- ``burnin.min_matmul`` = 40% of the dense bf16 peak. A healthy H200 measured 687-725 of 989
  TFLOP/s (69-73%) under its 700 W power cap (shared/REFERENCE-FIGURES.md); a GPU at half its clock
  (35%) fails. 40%, not 60%, because power-capped parts (L40S at 350 W) run further below their
  datasheet peak and no other part has been measured by this suite.
- ``burnin.min_memory_bandwidth`` = 70% of the datasheet memory bandwidth. The device copy (bytes
  read + written) measured 4.21-4.25 of 4.8 TB/s on the H200 (88%); a half-rate part fails.
- ``burnin.min_h2d_bandwidth`` = 60% of the PCIe link per direction. The H200 measured 55.3 of 64
  GB/s (86%); AzNHC's H100 floor is 48 GB/s (75%). A link trained at Gen4 or x8 (50%) fails. Not
  set where the host link is NVLink-C2C (GH200, GB200): no measured healthy figure exists yet.
- ``nvlink.min_link_speed`` = NVLink per direction / links: the nominal per-link rate, which
  ``nvidia-smi nvlink -s`` reports (26.562 GB/s on Hopper for 25 = 450/18; 53.125 on GB200 for 50).
  A link that trained at a lower rate fails.
- On an NVSwitch node (every GPU pair reports ``NV<links>``): ``nvlink.topology``, ``min_speedup``
  3.0 (NVLink over host-staged copies reads ~10x on HGX H100, NVIDIA/nccl#1264), and an intra-node
  all_reduce floor of 45% of NVLink per direction at 16 GiB (any algorithm). Operators' published
  healthy floors sit at 48% (GB200, 4 GPUs: 432 of 900 GB/s) to 102% (H100 with NVLS: 460 of 450)
  of that rate; a node whose NVLink runs at half rate reaches at most Ring's ~82% / 2 = 41%.

- ``numerics.min_flops.<dtype>`` = a fraction of the part's dense peak for the dtype (devices.yaml
  ``dense_flops``), per rank, the median of acceptance/test_numerics.py's timed chains of 8192^3
  GEMMs: :data:`NUMERICS_FRACTIONS`. bf16, fp16 and tf32 take burn-in's 40% (the H200's bf16 GEMM
  measured 69-73% of its peak); fp32 on the CUDA cores and fp8 through ``torch._scaled_mm`` (bf16
  output, a cast back to fp8 between the chained GEMMs, no fast accumulation) 30%: neither has
  been measured by this suite on a GPU, so their floors only catch a part running at a third of
  its datasheet rate, a half-clocked or throttled GPU or a fallback to a slow kernel.

Pure: devices in, numbers and sentences out. No pytest, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpucluster.profiles.devices import Device

__all__ = [
    "H2D_FRACTION",
    "INTRA_NODE_FRACTION",
    "INTRA_NODE_SIZE",
    "MATMUL_FRACTION",
    "MEMORY_FRACTION",
    "MIN_SPEEDUP",
    "NUMERICS_FRACTIONS",
    "Floor",
    "part_floors",
]

MATMUL_FRACTION = 0.40
MEMORY_FRACTION = 0.70
H2D_FRACTION = 0.60
INTRA_NODE_FRACTION = 0.45
INTRA_NODE_SIZE = 16 * 2**30
MIN_SPEEDUP = 3.0
NUMERICS_FRACTIONS = {"fp32": 0.30, "tf32": 0.40, "bf16": 0.40, "fp16": 0.40, "fp8": 0.30}
_C2C_ABOVE = 128e9
"""A host link faster than PCIe Gen6 x16 per direction is NVLink-C2C (GH200, GB200)."""


@dataclass(frozen=True, slots=True)
class Floor:
    key: str
    """Where it sits in the profile: ``burnin.min_matmul``, ``collectives.checks[0].min_busbw``."""
    value: float
    derivation: str


def part_floors(device: Device, *, nvlink: bool, switched: bool) -> tuple[Floor, ...]:
    """The floors a part profile of ``device`` carries. ``nvlink``: the profile has an ``nvlink:``
    section (its GPUs have NVLink peers in the node); ``switched``: every GPU pair of the node is
    connected through an NVSwitch (HGX/DGX baseboards, GB200 trays)."""
    src = f"devices.yaml {device.key}"
    floors = [
        Floor(
            "burnin.min_matmul",
            MATMUL_FRACTION * device.peak_flops,
            f"{MATMUL_FRACTION:.0%} of {src} peak_flops {device.peak_flops / 1e12:g} TFLOP/s",
        ),
        Floor(
            "burnin.min_memory_bandwidth",
            MEMORY_FRACTION * device.memory_bandwidth,
            f"{MEMORY_FRACTION:.0%} of {src} memory_bandwidth {device.memory_bandwidth / 1e12:g} TB/s",
        ),
    ]
    if device.pcie_bandwidth <= _C2C_ABOVE:
        floors.append(
            Floor(
                "burnin.min_h2d_bandwidth",
                H2D_FRACTION * device.pcie_bandwidth,
                f"{H2D_FRACTION:.0%} of {src} pcie_bandwidth {device.pcie_bandwidth / 1e9:g} GB/s",
            )
        )
    if nvlink and device.nvlink_bandwidth and device.nvlink_links:
        per_link = device.nvlink_bandwidth / device.nvlink_links
        floors.append(
            Floor(
                "nvlink.min_link_speed",
                per_link,
                f"{src} nvlink_bandwidth {device.nvlink_bandwidth / 1e9:g} GB/s / {device.nvlink_links} links",
            )
        )
        if switched:
            floors.append(
                Floor(
                    "collectives.checks[0].min_busbw",
                    INTRA_NODE_FRACTION * device.nvlink_bandwidth,
                    f"{INTRA_NODE_FRACTION:.0%} of {src} nvlink_bandwidth {device.nvlink_bandwidth / 1e9:g} GB/s",
                )
            )
            floors.append(
                Floor("nvlink.min_speedup", MIN_SPEEDUP, "NVLink over host-staged copies, ~10x on HGX")
            )
    for dtype, peak in device.dense_flops:
        fraction = NUMERICS_FRACTIONS[dtype]
        floors.append(
            Floor(
                f"numerics.min_flops.{dtype}",
                fraction * peak,
                f"{fraction:.0%} of {src} dense_flops.{dtype} {peak / 1e12:g} TFLOP/s",
            )
        )
    return tuple(floors)
