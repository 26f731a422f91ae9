"""What ``nvidia-smi -q`` says about a GPU's readiness: fabric state, persistence mode, row remaps
and retired pages, per ``GPU <bus id>`` block.

The ``Fabric`` section (drivers 530 and later) is NVML's per-GPU fabric state: on an NVSwitch
system (HGX/DGX H100, H200, B200) the GPU joins the NVLink fabric only after Fabric Manager has
configured the switches, and CUDA refuses work until then ("system not yet initialized", error
802). Its lines:

- ``State``: ``Completed`` (joined), ``In Progress`` (waiting for Fabric Manager), ``Not Started``,
  ``N/A`` or ``Not Supported`` (a PCIe part, no fabric);
- ``Status``: ``Success`` or the failure NVML returned, ``N/A`` while in progress;
- ``CliqueId`` and ``ClusterUUID`` on multi-node NVLink (GB200 NVL72): every GPU of one NVLink
  domain shares the ClusterUUID.

``Remapped Rows`` (``Pending : Yes`` until the GPU is reset; ``Remapping Failure Occurred``) and
``Retired Pages`` are read with `parsers.nvidia_smi_ecc`'s tree. Pure: text in, dataclasses out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_smi import text_preview
from pytest_gpucluster.parsers.nvidia_smi_ecc import _GPU_LINE, _find, _flatten, _tree, _value

__all__ = ["FABRIC_DONE", "GpuReadiness", "parse_gpu_readiness"]

FABRIC_DONE = "completed"
"""The only fabric state in which an NVSwitch GPU may be used (NVML_GPU_FABRIC_STATE_COMPLETED)."""


@dataclass(frozen=True, slots=True)
class GpuReadiness:
    """One GPU's readiness lines of ``nvidia-smi -q`` (None: the line is absent or N/A)."""

    index: int
    bus_id: str | None
    name: str | None
    persistence: bool | None
    fabric_state: str | None
    """Lower case: ``completed``, ``in progress``, ``not started``; None: no Fabric section or N/A."""
    fabric_status: str | None
    cluster_uuid: str | None
    clique_id: str | None
    remap_pending: bool | None
    remap_failure: bool | None
    remapped_uncorrectable: int | None
    retired_pages: int | None
    """Single- plus double-bit retired pages (pre-Ampere page retirement); None where N/A."""
    retirement_pending: bool | None

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuReadiness:
        return cls(**{f: data.get(f) for f in cls.__dataclass_fields__})


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, Mapping):
        return None
    parsed = _value(str(value))
    return None if parsed is None else str(value).strip()


def _bool(value: Any) -> bool | None:
    parsed = _value(str(value)) if isinstance(value, str) else None
    return parsed if isinstance(parsed, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gpu(index: int, bus_id: str | None, lines: list[str]) -> GpuReadiness:
    tree = _tree(lines)
    fabric = _find(tree, "Fabric")
    fabric = fabric if isinstance(fabric, Mapping) else {}
    remapped = _flatten(_find(tree, "Remapped Rows"))
    retired = _flatten(_find(tree, "Retired Pages"))
    pages = [
        v
        for k, v in retired.items()
        if k.endswith(("single_bit_ecc", "double_bit_ecc")) and _int(v) is not None
    ]
    state = _text(_find(fabric, "State"))
    return GpuReadiness(
        index=index,
        bus_id=bus_id,
        name=_text(_find(tree, "Product Name")),
        persistence=_bool(_find(tree, "Persistence Mode")),
        fabric_state=state.lower() if state else None,
        fabric_status=_text(_find(fabric, "Status")),
        cluster_uuid=_text(_find(fabric, "ClusterUUID", "Cluster UUID")),
        clique_id=_text(_find(fabric, "CliqueId", "Clique ID")),
        remap_pending=remapped.get("pending") if isinstance(remapped.get("pending"), bool) else None,
        remap_failure=remapped.get("remapping_failure_occurred")
        if isinstance(remapped.get("remapping_failure_occurred"), bool)
        else None,
        remapped_uncorrectable=_int(remapped.get("uncorrectable_error")),
        retired_pages=sum(pages) if pages else None,  # type: ignore[arg-type]
        retirement_pending=retired.get("pending_page_blacklist")
        if isinstance(retired.get("pending_page_blacklist"), bool)
        else _bool(_find(_find(tree, "Retired Pages") or {}, "Pending")),
    )


def parse_gpu_readiness(text: str) -> list[GpuReadiness]:
    """One `GpuReadiness` per ``GPU <bus id>`` block of ``nvidia-smi -q`` (or ``-q -d
    ROW_REMAPPER,PAGE_RETIREMENT``); a pasted excerpt whose first block has no ``GPU`` line is
    GPU 0. Raises `ParseError` when the text holds no GPU block at all."""
    blocks: list[tuple[str | None, list[str]]] = []
    for line in text.splitlines():
        match = _GPU_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if match:
            blocks.append((match.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
        elif line.startswith((" ", "\t")) and line.strip():
            blocks.append((None, [line]))
    if not blocks:
        raise ParseError(
            f"nvidia-smi -q output holds no 'GPU <bus id>' block; got {text_preview(text)}. "
            "Expected the output of 'nvidia-smi -q'."
        )
    return [_gpu(i, bus.lower() if bus else None, lines) for i, (bus, lines) in enumerate(blocks)]
