"""Parsers for the inventory side of ``nvidia-smi``: ``-L``, ``--query-gpu`` CSV and the main table.

Text in, frozen dataclasses out; no I/O, no subprocess, no pytest/torch imports. The
topology matrix lives in :mod:`.nvidia_topo` and the NVLink commands in :mod:`.nvidia_nvlink`.

What the inventory check runs on a GPU host, and what parses it::

    nvidia-smi -L                                   -> parse_gpu_list
    nvidia-smi <INVENTORY_ARGS>                     -> parse_gpu_inventory
    nvidia-smi --query-gpu=<any> --format=csv[...]  -> parse_query_csv
    nvidia-smi                                      -> parse_smi_table, parse_smi_processes
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_gpucluster.errors import ParseError

__all__ = [
    "INVENTORY_ARGS",
    "INVENTORY_FIELDS",
    "GpuHeader",
    "GpuInventoryRow",
    "GpuListEntry",
    "MigDevice",
    "SmiGpu",
    "SmiTable",
    "parse_gpu_header",
    "parse_gpu_inventory",
    "parse_gpu_list",
    "parse_mib",
    "parse_query_csv",
    "parse_smi_processes",
    "parse_smi_table",
    "to_json",
]

INVENTORY_FIELDS: tuple[str, ...] = ("index", "name", "memory.total", "driver_version", "pci.bus_id")
# The argv tail the inventory check passes to nvidia-smi; parse_gpu_inventory reads its output.
INVENTORY_ARGS: tuple[str, ...] = (f"--query-gpu={','.join(INVENTORY_FIELDS)}", "--format=csv,noheader")

# Values nvidia-smi prints instead of a reading; all of them mean "no value".
_NO_VALUE = frozenset(
    {"", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"}
)

# "memory.total [MiB]" -> "memory.total"
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]$")
# "GPU 0: NVIDIA H800 (UUID: GPU-34bf...)" -- shared by -L and every `nvidia-smi nvlink` command.
_GPU_HEADER = re.compile(r"^\s*GPU\s+(\d+):\s*(.*?)\s*(?:\(UUID:\s*([^)]*?)\s*\))?\s*$")
# "  MIG 1g.20gb     Device  0: (UUID: MIG-ce86...)"
_MIG_LINE = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)]*?)\s*\)")


@dataclass(frozen=True, slots=True)
class GpuHeader:
    """One ``GPU <i>: <name> (UUID: <uuid>)`` line. ``uuid`` is None when absent or elided (``...``)."""

    index: int
    name: str
    uuid: str | None


def parse_gpu_header(line: str) -> GpuHeader | None:
    """Read a ``GPU <i>: <name> (UUID: ...)`` line, or return None when the line is something else."""
    m = _GPU_HEADER.match(line)
    if not m:
        return None
    uuid = m.group(3)
    if uuid is not None and not uuid.strip("."):
        uuid = None  # "(UUID: ...)" -- a person elided it
    return GpuHeader(index=int(m.group(1)), name=m.group(2), uuid=uuid)


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG instance listed under its parent GPU by ``nvidia-smi -L``."""

    profile: str  # e.g. "1g.20gb"
    device: int
    uuid: str

    def to_json(self) -> dict:
        return {"profile": self.profile, "device": self.device, "uuid": self.uuid}


@dataclass(frozen=True, slots=True)
class GpuListEntry:
    """One GPU from ``nvidia-smi -L``."""

    index: int
    name: str
    uuid: str | None
    mig: tuple[MigDevice, ...] = ()

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "mig": [m.to_json() for m in self.mig],
        }


def parse_gpu_list(text: str) -> list[GpuListEntry]:
    """Parse ``nvidia-smi -L``: one entry per GPU line, MIG lines attached to the GPU above them.

    Prompt lines, blank lines and anything else are ignored.
    """
    entries: list[GpuListEntry] = []
    for line in text.splitlines():
        header = parse_gpu_header(line)
        if header is not None:
            entries.append(GpuListEntry(header.index, header.name, header.uuid))
            continue
        mig = _MIG_LINE.match(line)
        if mig and entries:
            last = entries[-1]
            device = MigDevice(mig.group(1), int(mig.group(2)), mig.group(3))
            entries[-1] = GpuListEntry(last.index, last.name, last.uuid, (*last.mig, device))
    if not entries:
        raise ParseError(
            "nvidia-smi -L output holds no 'GPU <i>: <name> (UUID: ...)' line; "
            f"got {text_preview(text)}. Is the driver loaded on this host?"
        )
    return entries


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` into one dict per GPU.

    With ``fields`` None the first line must be nvidia-smi's header; its unit suffixes
    (``memory.total [MiB]``) are dropped from the keys. With ``fields`` given, a header line
    (if present) is skipped and rows are keyed by ``fields``. Values are stripped strings with
    their units kept (``"81559 MiB"``); ``N/A``/``[Not Supported]`` and friends become None.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    rows = list(csv.reader(lines, skipinitialspace=True))
    header = [_UNIT_SUFFIX.sub("", cell.strip()) for cell in rows[0]] if rows else []
    if fields is None:
        if not rows:
            raise ParseError("nvidia-smi CSV output is empty: expected a header line and one line per GPU.")
        keys, rows = header, rows[1:]
    else:
        keys = list(fields)
        if header[:1] == keys[:1]:
            rows = rows[1:]  # a header line although `noheader` was asked for
    out: list[dict[str, str | None]] = []
    for n, row in enumerate(rows, start=1):
        if len(row) != len(keys):
            raise ParseError(
                f"nvidia-smi CSV line {n} has {len(row)} values, expected {len(keys)} ({', '.join(keys)}): "
                f"{', '.join(row)!r}"
            )
        out.append(
            {k: (None if v.strip() in _NO_VALUE else v.strip()) for k, v in zip(keys, row, strict=True)}
        )
    if not out:
        raise ParseError(f"nvidia-smi CSV output holds no GPU rows; got {text_preview(text)}.")
    return out


def parse_mib(value: str | None) -> int | None:
    """``"81559 MiB"`` or ``"81559"`` (``nounits``) -> 81559; None or anything else -> None."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:MiB)?\s*", value)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class GpuInventoryRow:
    """One GPU from the inventory query (:data:`INVENTORY_ARGS`)."""

    index: int
    name: str
    memory_total_mib: int | None
    driver_version: str | None
    pci_bus_id: str | None

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "driver_version": self.driver_version,
            "pci_bus_id": self.pci_bus_id,
        }


def parse_gpu_inventory(text: str) -> list[GpuInventoryRow]:
    """Parse the output of ``nvidia-smi`` + :data:`INVENTORY_ARGS` (header line tolerated)."""
    out = []
    for n, row in enumerate(parse_query_csv(text, INVENTORY_FIELDS), start=1):
        index, name = row["index"], row["name"]
        if index is None or not index.isdigit() or name is None:
            raise ParseError(f"nvidia-smi inventory line {n}: expected '<index>, <name>, ...', got {row!r}")
        out.append(
            GpuInventoryRow(
                index=int(index),
                name=name,
                memory_total_mib=parse_mib(row["memory.total"]),
                driver_version=row["driver_version"],
                pci_bus_id=row["pci.bus_id"],
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One GPU block of the main ``nvidia-smi`` table. ``name`` may be cut short (``Tesla P100-SXM2...``)."""

    index: int
    name: str
    bus_id: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    util_percent: int | None
    mig_mode: str | None = None
    """The ``MIG M.`` column: ``Enabled``, ``Disabled`` or ``N/A`` (a GPU without MIG); None: not shown."""

    def to_json(self) -> dict:
        return {
            "mig_mode": self.mig_mode,
            "index": self.index,
            "name": self.name,
            "bus_id": self.bus_id,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "util_percent": self.util_percent,
        }


@dataclass(frozen=True, slots=True)
class SmiTable:
    """The header and GPU blocks of the main ``nvidia-smi`` table (processes are not read)."""

    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[SmiGpu, ...]

    def to_json(self) -> dict:
        return {
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "gpus": [g.to_json() for g in self.gpus],
        }


# "|   0  NVIDIA A40        On  |   00000000:4F:00.0 Off |" (both the <=525 and the >=530 layouts)
_TABLE_GPU = re.compile(
    r"^\|\s*(\d+)\s+(.+?)\s+(?:On|Off|N/A)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s"
)
# "| N/A   44C    P0   153W / 700W |  60787MiB / 81559MiB |     23%      Default |"
_TABLE_USAGE = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(?:(\d+)\s*%|N/A)")
# "|                                         |                        |             Disabled |" (MIG M.)
_TABLE_MIG = re.compile(r"^\|\s*\|\s*\|\s*(Enabled|Disabled|N/A)\s*\|$")


def parse_smi_table(text: str) -> SmiTable:
    """Parse the plain ``nvidia-smi`` table: driver/CUDA versions, then per GPU name, bus id, memory, util."""
    driver = re.search(r"Driver Version:\s*(\S+)", text)
    cuda = re.search(r"CUDA Version:\s*(\S+)", text)
    gpus: list[SmiGpu] = []
    for line in text.splitlines():
        m = _TABLE_GPU.match(line.strip())
        if m:
            gpus.append(SmiGpu(int(m.group(1)), m.group(2), m.group(3), None, None, None))
            continue
        mig = _TABLE_MIG.match(line.strip())
        if mig and gpus and gpus[-1].mig_mode is None:
            gpus[-1] = replace(gpus[-1], mig_mode=mig.group(1))
            continue
        u = _TABLE_USAGE.search(line)
        if u and gpus and gpus[-1].memory_total_mib is None:
            g = gpus[-1]
            util = int(u.group(3)) if u.group(3) is not None else None
            gpus[-1] = SmiGpu(g.index, g.name, g.bus_id, int(u.group(1)), int(u.group(2)), util)
    if not gpus and driver is None:
        raise ParseError(
            f"nvidia-smi table holds no 'Driver Version:' and no GPU row; got {text_preview(text)}."
        )
    return SmiTable(
        driver_version=driver.group(1) if driver else None,
        cuda_version=cuda.group(1) if cuda else None,
        gpus=tuple(gpus),
    )


# "|    0   N/A  N/A     10734      C   ...-x86_64-Release/abcdefgh/foo_bar         160MiB |" (GI/CI
# columns since 450; older tables have none) -- the Processes section of the plain table.
_TABLE_PROCESS = re.compile(
    r"^\|\s+(\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(\d+)\s+([CGM+]+)\s+(.*?)\s+(\d+MiB|N/A)\s*\|$"
)


@dataclass(frozen=True, slots=True)
class SmiProcess:
    """One row of the table's ``Processes:`` section: a process holding a GPU."""

    gpu: int
    pid: int
    kind: str
    """``C`` (compute: a CUDA context), ``G`` (graphics), ``C+G``, ``M`` (MPS)."""
    name: str
    memory_mib: int | None


def parse_smi_processes(text: str) -> list[SmiProcess]:
    """The rows of the ``Processes:`` section of the plain ``nvidia-smi`` table (none when it says
    ``No running processes found`` or has no such section). Names may be cut short (``...``)."""
    found = []
    for line in text.splitlines():
        m = _TABLE_PROCESS.match(line.strip())
        if m:
            memory = parse_mib(m.group(5)) if m.group(5) != "N/A" else None
            found.append(SmiProcess(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), memory))
    return found


def to_json(result: SmiTable | Sequence[GpuListEntry | GpuInventoryRow]) -> dict | list[dict]:
    """The JSON form of what parse_smi_table, parse_gpu_list or parse_gpu_inventory returned."""
    if isinstance(result, SmiTable):
        return result.to_json()
    return [row.to_json() for row in result]


def text_preview(text: str, limit: int = 120) -> str:
    """The start of a tool output, on one line, for error messages (shared by the nvidia-smi parsers)."""
    flat = " | ".join(ln.strip() for ln in text.strip().splitlines()[:3])
    return repr(flat[:limit] + ("..." if len(flat) > limit else "")) if flat else "empty text"
