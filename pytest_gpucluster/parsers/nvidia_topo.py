"""Parser for ``nvidia-smi topo -m`` (alias ``topo --matrix``) and the check the NVLink test runs on it.

Text in, a frozen :class:`Topology` out; no I/O, no pytest/torch imports.

What real outputs look like, and what this parser copes with (each case has a recorded
output under ``tests/data/nvidia_smi/``):

* columns separated by runs of spaces, or by tabs (``GPU0\\t X \\tSYS``), sometimes only one
  space (``112-127,240-254 7``): cells never contain blanks, so rows are split on whitespace;
* a header with ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` (recent drivers), fewer
  of them (older drivers), or none; NIC rows carry no affinity values;
* NIC columns named ``NIC0``.. with a ``NIC Legend:`` naming the devices (drivers >= ~R520), or
  named after the device itself (``mlx5_0``, ``mlx4_0``) with no legend (older drivers);
* ANSI colour/underline codes when the output was captured from a terminal;
* outputs a person cut short: GPU rows elided with ``...``, a header clipped by the terminal
  (NIC rows present, NIC columns missing), a legend cut mid-line. What is there is parsed;
  a cell that cannot be read is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_smi import text_preview

__all__ = ["Topology", "parse_topo_text", "to_json", "topology_mismatches"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The multi-word headings after the device columns, and the Topology field each one fills.
_TRAILING = {"CPU Affinity": "cpu_affinity", "NUMA Affinity": "numa_affinity", "GPU NUMA ID": "gpu_numa_id"}
_GPU_LABEL = re.compile(r"GPU\d+")
_NIC_LABEL = re.compile(r"NIC\d+")
_DEVICE_LABEL = re.compile(r"(?:GPU|NIC)\d+")
# A readable cell is a link code: X, SYS, SOC (pre-2017 name of SYS), NODE, PHB, PXB, PIX, NV<n>, ...
_CELL = re.compile(r"[A-Z][A-Z0-9]*")
_LEGEND_NIC = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)")
# Affinity values are CPU/NUMA lists ("0-47,96-143", "3"); a value cut by the terminal
# ("-31,64-95") or "N/A" is not, and reads as None.
_ID_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")


@dataclass(frozen=True, slots=True)
class Topology:
    """The ``nvidia-smi topo -m`` matrix of one host.

    ``matrix[row][column]`` holds the printed link code (``"NV18"``, ``"SYS"``, ``"X"`` on the
    diagonal) or None where the cell could not be read; it has a row for every device row
    printed (GPUs and NICs) and, in each, a key for every column.

    ``nic_names`` maps a NIC column to its device name: from the ``NIC Legend`` on recent
    drivers (``{"NIC0": "mlx5_0"}``); on older drivers, whose columns already are device names,
    each name maps to itself (``{"mlx5_0": "mlx5_0"}``), so ``nic_names[nic]`` works for either.
    A ``NICn`` whose legend line was not included has no entry.

    ``cpu_affinity``, ``numa_affinity`` and ``gpu_numa_id`` hold the printed strings
    (``"0-47,96-143"``, ``"0"``) for the rows that print them; ``N/A`` or a value that is not
    a list of ids (cut by the terminal) becomes None, and a column the driver does not print
    leaves its mapping empty.
    """

    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    nic_names: dict[str, str] = field(default_factory=dict)
    matrix: dict[str, dict[str, str | None]] = field(default_factory=dict)
    cpu_affinity: dict[str, str | None] = field(default_factory=dict)
    numa_affinity: dict[str, str | None] = field(default_factory=dict)
    gpu_numa_id: dict[str, str | None] = field(default_factory=dict)

    def link(self, a: str, b: str) -> str | None:
        """The cell between two devices, read from row ``a`` or, when that row is missing, row ``b``."""
        cell = self.matrix.get(a, {}).get(b)
        return cell if cell is not None else self.matrix.get(b, {}).get(a)

    def to_json(self) -> dict:
        return {
            "gpus": list(self.gpus),
            "nics": list(self.nics),
            "nic_names": dict(self.nic_names),
            "matrix": {row: dict(cells) for row, cells in self.matrix.items()},
            "cpu_affinity": dict(self.cpu_affinity),
            "numa_affinity": dict(self.numa_affinity),
            "gpu_numa_id": dict(self.gpu_numa_id),
        }


def parse_topo_text(text: str) -> Topology:
    """Parse the text of ``nvidia-smi topo -m``; raise ParseError when it holds no matrix."""
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    start = _find_header(lines)
    if start is None:
        raise ParseError(
            "nvidia-smi topo -m output has no header line ('GPU0  GPU1 ...  CPU Affinity ...'); "
            f"got {text_preview(text)}. Pass the whole output of `nvidia-smi topo -m`."
        )
    columns, trailing = _split_header(lines[start])
    matrix: dict[str, dict[str, str | None]] = {}
    extra: dict[str, dict[str, str | None]] = {name: {} for name in _TRAILING.values()}
    nic_names: dict[str, str] = {}
    in_legend = False
    for line in lines[start + 1 :]:
        tokens = line.split()
        if not tokens:
            continue
        in_legend = in_legend or "Legend:" in tokens  # "Legend:" and "NIC Legend:" end the matrix
        if in_legend:
            if legend := _LEGEND_NIC.match(line):
                nic_names[legend.group(1)] = legend.group(2)
            continue
        label = tokens[0]
        if label not in columns and not _DEVICE_LABEL.fullmatch(label):
            continue  # "...", prompt lines, stray text
        cells = tokens[1 : 1 + len(columns)]
        matrix[label] = {col: _cell(cells[i]) if i < len(cells) else None for i, col in enumerate(columns)}
        for heading, value in zip(trailing, tokens[1 + len(columns) :], strict=False):
            extra[_TRAILING[heading]][label] = value if _ID_LIST.fullmatch(value) else None
    if not matrix:
        raise ParseError(
            f"nvidia-smi topo -m output has a header ({' '.join(columns)}) but no device row under it; "
            f"got {text_preview(text)}."
        )
    # A clipped header can lose columns whose rows (or legend lines) are still there: keep those devices.
    devices = list(dict.fromkeys([*columns, *matrix, *nic_names]))
    gpus = tuple(d for d in devices if _GPU_LABEL.fullmatch(d))
    nics = tuple(d for d in devices if not _GPU_LABEL.fullmatch(d))
    for nic in nics:
        if not _NIC_LABEL.fullmatch(nic):
            nic_names.setdefault(nic, nic)  # old drivers: the column is the device name
    return Topology(
        gpus=gpus,
        nics=nics,
        nic_names={n: nic_names[n] for n in nics if n in nic_names},
        matrix=matrix,
        **extra,
    )


def to_json(topo: Topology) -> dict:
    """The JSON form of a parsed topology (same as ``topo.to_json()``)."""
    return topo.to_json()


def topology_mismatches(topo: Topology, expected: str) -> list[tuple[str, str, str | None]]:
    """Every GPU pair whose link is not ``expected`` (e.g. ``"NV18"``), as ``(gpu_a, gpu_b, cell)``.

    Each unordered pair is checked once (``gpu_a`` before ``gpu_b`` in ``topo.gpus``); a pair
    whose cell is missing from both rows (an elided row) is reported with cell None, since
    the link could not be confirmed. Fewer than two GPUs gives an empty list: the GPU count
    is the inventory check's business.
    """
    out = []
    for i, a in enumerate(topo.gpus):
        for b in topo.gpus[i + 1 :]:
            cell = topo.link(a, b)
            if cell != expected:
                out.append((a, b, cell))
    return out


def _find_header(lines: list[str]) -> int | None:
    """Index of the column header: starts with a GPU label and, unlike a data row, has no ``X`` cell."""
    for i, line in enumerate(lines):
        tokens = line.split()
        if tokens and _GPU_LABEL.fullmatch(tokens[0]) and "X" not in tokens:
            return i
    return None


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """Device column labels, and the trailing headings present, in printed order."""
    positions = sorted((line.find(h), h) for h in _TRAILING if line.find(h) >= 0)
    cut = positions[0][0] if positions else len(line)
    return line[:cut].split(), [h for _, h in positions]


def _cell(token: str) -> str | None:
    return token if _CELL.fullmatch(token) else None
