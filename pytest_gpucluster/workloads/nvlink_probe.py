"""Rank side of the NVLink checks: each GPU's links (state, speed, version), the node's
``nvidia-smi topo -m`` matrix, and the bytes that crossed each link during an all_reduce.

Two workloads:

- ``inventory(ctx)`` — one rank per node (launch with ``nproc_per_node=1``,
  ``init_process_group=False``): every GPU's links from NVML, or from ``nvidia-smi nvlink -s``
  where NVML is missing, plus the text of ``nvidia-smi topo -m`` (parsed by the parent, which
  quotes it). NVML has no "NV18 between GPU0 and GPU3" answer behind an NVSwitch, which is why
  the matrix comes from nvidia-smi.
- ``traffic(ctx)`` — one rank per GPU: each rank reads its own GPU's per-link throughput
  counters, every node runs ``iters`` all_reduces inside the node (a subgroup per node when
  there are several), and the rank reads the counters again. It returns the bytes each link
  sent and received and the bytes a ring all_reduce must send per GPU,
  ``iters x size x 2(n-1)/n``.

Counters, in the order tried: NVML field values ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``
with the link in ``scopeId`` (KiB, drivers R450 and later; nvml.h documents ``UINT_MAX`` as
the sum of all links, which we do not use so that a dead link shows); then the deprecated
``nvmlDeviceGetNvLinkUtilizationCounter`` (counter 0), only where its control already counts
bytes; then ``nvidia-smi nvlink -gt d -i <bus id>`` parsed by ``parsers/nvidia_nvlink``.
Link speed is ``NVML_FI_DEV_NVLINK_GET_SPEED`` (MBps, per link) or the older
``..._SPEED_MBPS_COMMON``; both are what ``nvidia-smi nvlink -s`` prints as GB/s (26.562 on
Hopper).

Like the rest of ``workloads/``, this depends on the standard library, torch (``traffic`` only),
pynvml where installed (``nvidia-ml-py``) and the pure parsers. Every NVML and nvidia-smi call
lives here or in ``profiles/detect.py``. No NVML and no nvidia-smi, or no CUDA device for the
traffic: :class:`WorkloadSkip` with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_nvlink import (
    LinkCounters,
    LinkStatus,
    parse_nvlink_counters,
    parse_nvlink_status,
)
from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip

__all__ = ["CounterReader", "inventory", "load_nvml", "nvml_links", "read_topology_text", "traffic"]

# NVML field ids (nvml.h); spelled out because older nvidia-ml-py releases lack the newer names.
FI_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FI_SPEED_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: the speed of the active links, MBps
FI_GET_SPEED = 164  # NVML_FI_DEV_NVLINK_GET_SPEED: one link's speed, MBps (scopeId = link)
FI_DATA_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: KiB (scopeId = link)
FI_DATA_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
MAX_LINKS = 18  # NVLink 4/5 GPUs have 18; older ones fewer (NVML says how many)
_FEATURE_ENABLED = 1
_UNITS_BYTES = 2  # NVML_NVLINK_COUNTER_UNIT_BYTES
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

Smi = Callable[[list[str]], str]
"""Runs an nvidia-smi argv and returns its stdout; raises OSError or CalledProcessError."""

DEFAULT_SIZE_BYTES = 256 << 20
DEFAULT_ITERS = 10


def run_smi(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def _smi(smi: Smi | None) -> Smi | None:
    """The given runner, else the real nvidia-smi where it is on PATH, else None."""
    if smi is not None:
        return smi
    return run_smi if shutil.which("nvidia-smi") else None


def load_nvml() -> tuple[Any, str | None]:
    """``(pynvml, None)`` with NVML initialised, or ``(None, why not)``."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"pynvml is not importable ({exc}); pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return None, f"NVML did not initialise ({type(exc).__name__}: {exc})"
    return pynvml, None


def _field(value: Any) -> float | None:
    """The number in one ``nvmlFieldValue_t``, or None when NVML refused that field."""
    if int(getattr(value, "nvmlReturn", 1)) != 0:
        return None
    attr = _VALUE_ATTR.get(int(value.valueType), "ullVal")
    return float(getattr(value.value, attr))


def _fields(nvml: Any, handle: Any, ids: list[tuple[int, int]]) -> list[float | None]:
    try:
        return [_field(v) for v in nvml.nvmlDeviceGetFieldValues(handle, ids)]
    except Exception:  # an NVML too old for field values at all
        return [None] * len(ids)


def _link_count(nvml: Any, handle: Any) -> int:
    (count,) = _fields(nvml, handle, [(FI_LINK_COUNT, 0)])
    if count is not None:
        return int(count)
    found = 0
    for link in range(MAX_LINKS):  # older drivers: ask link by link until NVML says there is no such link
        try:
            nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:
            break
        found += 1
    return found


def nvml_links(nvml: Any, handle: Any) -> dict[str, dict[str, Any]]:
    """``{"0": {"active": True, "speed_gbs": 26.562, "version": 4}, ...}`` for one GPU; ``{}`` without NVLink.

    ``speed_gbs`` is MBps / 1000, the number ``nvidia-smi nvlink -s`` prints; None for a link
    that is down or whose speed NVML does not give.
    """
    links: dict[str, dict[str, Any]] = {}
    count = _link_count(nvml, handle)
    speeds = _fields(nvml, handle, [(FI_GET_SPEED, link) for link in range(count)])
    (common,) = _fields(nvml, handle, [(FI_SPEED_COMMON, 0)])
    for link in range(count):
        try:
            active = int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == _FEATURE_ENABLED
        except Exception:  # NVML_ERROR_NOT_SUPPORTED: a GPU without NVLink, or a link it does not have
            continue
        try:
            version: int | None = int(nvml.nvmlDeviceGetNvLinkVersion(handle, link))
        except Exception:
            version = None
        mbps = speeds[link] if speeds[link] else common
        links[str(link)] = {
            "active": active,
            "speed_gbs": round(mbps / 1000.0, 3) if active and mbps else None,
            "version": version,
        }
    return links


def _status_links(status: dict[str, LinkStatus | LinkCounters]) -> dict[str, dict[str, Any]]:
    return {
        n: {"active": link.active, "speed_gbs": link.speed_gbs, "version": None}
        for n, link in status.items()
        if isinstance(link, LinkStatus)
    }


def read_topology_text(smi: Smi | None = None) -> tuple[str | None, str | None]:
    """``(text of nvidia-smi topo -m, None)`` or ``(None, why it could not be read)``."""
    smi = _smi(smi)
    if smi is None:
        return None, "there is no nvidia-smi on PATH to print the topology matrix"
    try:
        return smi(["nvidia-smi", "topo", "-m"]), None
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip().splitlines()
        return (
            None,
            f"nvidia-smi topo -m exited with code {exc.returncode}: {said[-1] if said else 'no output'}",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi topo -m could not run: {exc}"


def _bus_id(nvml: Any, handle: Any) -> str | None:
    try:
        info = nvml.nvmlDeviceGetPciInfo(handle)
    except Exception:
        return None
    bus = info.busId
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def _name(nvml: Any, handle: Any) -> str | None:
    try:
        name = nvml.nvmlDeviceGetName(handle)
    except Exception:
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


def inventory(ctx: RankContext, *, nvml: Any = None, smi: Smi | None = None) -> dict[str, Any]:
    """This node's GPUs and their links, and its topology matrix as text (see the module doc)."""
    why_no_nvml = None
    if nvml is None:
        nvml, why_no_nvml = load_nvml()
    smi = _smi(smi)
    if nvml is None and smi is None:
        raise WorkloadSkip(
            f"NVLink inventory on {ctx.host}: {why_no_nvml}, and there is no nvidia-smi on PATH"
        )
    gpus: dict[str, dict[str, Any]] = {}
    if nvml is not None:
        source = "NVML"
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus[str(index)] = {
                "name": _name(nvml, handle),
                "pci_bus_id": _bus_id(nvml, handle),
                "links": nvml_links(nvml, handle),
            }
    else:
        assert smi is not None
        source = f"nvidia-smi nvlink -s ({why_no_nvml})"
        try:
            status = parse_nvlink_status(smi(["nvidia-smi", "nvlink", "-s"]))
        except (OSError, subprocess.SubprocessError, ParseError) as exc:
            raise WorkloadSkip(
                f"NVLink inventory on {ctx.host}: {why_no_nvml}, and nvidia-smi nvlink -s failed: {exc}"
            ) from exc
        for index, block in status.gpus.items():
            gpus[index] = {
                "name": block.name,
                "pci_bus_id": None,
                "links": _status_links(block.links),
                "note": block.note,
            }
    topo_text, topo_error = read_topology_text(smi)
    return {
        "host": ctx.host,
        "rank": ctx.rank,
        "links_source": source,
        "gpus": gpus,
        "topo_text": topo_text,
        "topo_error": topo_error,
    }


# ------------------------------------------------------------------------------------------
# Traffic counters
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterReader:
    """Reads one GPU's cumulative per-link byte counters, ``{link: (tx_bytes, rx_bytes)}``."""

    source: str
    read: Callable[[], dict[str, tuple[int, int]]]

    @classmethod
    def find(cls, nvml: Any, handle: Any, bus_id: str | None, smi: Smi | None = None) -> CounterReader:
        """The first reader that works on this GPU and driver (module doc); WorkloadSkip if none.

        A GPU on which NVML sees no active link gets a reader of no links: its zero bytes are
        the finding, and the parent names the GPU.
        """
        tried: list[str] = []
        smi = _smi(smi)
        if nvml is not None and handle is not None:
            links = [int(n) for n, link in nvml_links(nvml, handle).items() if link["active"]]
            if not links:
                return cls("NVML: no active NVLink on this GPU", dict)
            fields = [(fid, link) for link in links for fid in (FI_DATA_TX, FI_DATA_RX)]

            def from_fields() -> dict[str, tuple[int, int]]:
                got = _fields(nvml, handle, fields)
                if any(v is None for v in got):
                    raise RuntimeError("NVML stopped returning the NVLink throughput fields")
                return {
                    str(link): (int(got[2 * i]) * 1024, int(got[2 * i + 1]) * 1024)
                    for i, link in enumerate(links)
                }

            if all(v is not None for v in _fields(nvml, handle, fields)):
                return cls("NVML field values NVLINK_THROUGHPUT_DATA_TX/RX", from_fields)
            tried.append("NVML throughput fields: not supported by this driver")
            try:
                in_bytes = all(
                    int(nvml.nvmlDeviceGetNvLinkUtilizationControl(handle, link, 0).units) == _UNITS_BYTES
                    for link in links
                )
                if not in_bytes:
                    tried.append("NVML utilization counter 0 does not count bytes")
            except Exception as exc:
                in_bytes = False
                tried.append(f"nvmlDeviceGetNvLinkUtilizationControl: {type(exc).__name__}: {exc}")
            if in_bytes:

                def from_counters() -> dict[str, tuple[int, int]]:
                    out = {}
                    for link in links:
                        rx, tx = nvml.nvmlDeviceGetNvLinkUtilizationCounter(handle, link, 0)
                        out[str(link)] = (int(tx), int(rx))
                    return out

                return cls("NVML nvmlDeviceGetNvLinkUtilizationCounter (counter 0, bytes)", from_counters)
        if bus_id is not None and smi is not None:
            argv = ["nvidia-smi", "nvlink", "-gt", "d", "-i", bus_id]

            run = smi

            def from_smi() -> dict[str, tuple[int, int]]:
                report = parse_nvlink_counters(run(argv), "data")
                if len(report.gpus) != 1:
                    raise ParseError(f"{' '.join(argv)} printed {len(report.gpus)} GPU blocks, expected 1")
                (block,) = report.gpus.values()
                return {
                    n: ((c.tx_kib or 0) * 1024, (c.rx_kib or 0) * 1024)
                    for n, c in block.links.items()
                    if isinstance(c, LinkCounters)
                }

            try:
                if from_smi():
                    return cls(" ".join(argv), from_smi)
                tried.append(f"{' '.join(argv)}: no link counters")
            except (OSError, subprocess.SubprocessError, ParseError) as exc:
                tried.append(f"{' '.join(argv)}: {exc}")
        else:
            tried.append("no nvidia-smi on PATH" if bus_id is not None else "the GPU's PCI bus id is unknown")
        raise WorkloadSkip(f"no NVLink traffic counter can be read on GPU {bus_id}: {'; '.join(tried)}")


def _delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], where: str
) -> dict[str, dict[str, int]]:
    out = {}
    for link, (tx0, rx0) in before.items():
        if link not in after:
            continue
        tx1, rx1 = after[link]
        if tx1 < tx0 or rx1 < rx0:
            raise RuntimeError(
                f"the NVLink counters of {where} link {link} went down during the all_reduce "
                f"(tx {tx0} -> {tx1}, rx {rx0} -> {rx1} bytes): something reset them; run the test again"
            )
        out[link] = {"tx_bytes": tx1 - tx0, "rx_bytes": rx1 - rx0}
    return out


def _this_gpu(nvml: Any, device: Any) -> tuple[Any, str | None, str | None]:
    """(NVML handle or None, PCI bus id, name) of the CUDA device this rank uses."""
    import torch

    props = torch.cuda.get_device_properties(device)
    bus_id = None
    if hasattr(props, "pci_bus_id"):
        bus_id = f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
    handle = None
    if nvml is not None:
        uuid = getattr(props, "uuid", None)
        for lookup, key in (
            (nvml.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}" if uuid else None),
            (nvml.nvmlDeviceGetHandleByPciBusId, bus_id),
        ):
            if key is None:
                continue
            try:
                handle = lookup(key)
                break
            except Exception:
                continue
    return handle, bus_id, props.name


def traffic(ctx: RankContext) -> dict[str, Any]:
    """Counters of this rank's GPU before and after ``iters`` intra-node all_reduces (module doc).

    Options: ``size_bytes`` (default 256 MiB), ``iters`` (default 10).
    """
    if not ctx.is_cuda:
        raise WorkloadSkip(
            f"NVLink traffic needs a CUDA device; this job runs on {ctx.device} ({ctx.backend})"
        )
    import torch
    import torch.distributed as dist

    unknown = sorted(set(ctx.options) - {"size_bytes", "iters"})
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: iters, size_bytes")
    size = int(ctx.options.get("size_bytes", DEFAULT_SIZE_BYTES))
    iters = int(ctx.options.get("iters", DEFAULT_ITERS))
    nvml, _ = load_nvml()
    device = torch.device(ctx.device)
    handle, bus_id, name = _this_gpu(nvml, device)
    reader = CounterReader.find(nvml, handle, bus_id)
    group = None
    if ctx.nnodes > 1:  # one all_reduce per node, all nodes at once: the traffic stays inside each node
        group, _ = dist.new_subgroups(group_size=ctx.local_world_size)
    n = ctx.local_world_size
    tensor = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
    for _ in range(2):  # NCCL connects its channels on the first call; keep that out of the count
        dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize(device)
    dist.barrier(group=group)
    before = reader.read()
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    dist.barrier(group=group)
    after = reader.read()
    where = f"GPU {bus_id} on {ctx.host}"
    links = _delta(before, after, where)
    return {
        "host": ctx.host,
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "gpu": {"name": name, "pci_bus_id": bus_id, "cuda_index": device.index},
        "counter_source": reader.source,
        "links": links,
        "tx_bytes": sum(v["tx_bytes"] for v in links.values()),
        "rx_bytes": sum(v["rx_bytes"] for v in links.values()),
        "size_bytes": tensor.numel() * 4,
        "iters": iters,
        "node_ranks": n,
        "expected_bytes": iters * tensor.numel() * 4 * 2 * (n - 1) / n,
        "elapsed_s": elapsed,
    }
