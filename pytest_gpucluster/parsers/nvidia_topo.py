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
  (NIC rows present, NIC columns missing), a legend cut mid-line, a paste that stops inside a
  row (a last line with no line end loses its last token, which may be cut: ``SY``). What is
  there is parsed; a cell that cannot be read is None;
* tabs mangled: turned into runs of spaces, or a doubled tab before ``GPU NUMA ID``; lines wrapped
  at a terminal or mail width, the header too (``... NIC7`` / ``NIC8 ... CPU Affinity`` /
  ``GPU NUMA ID``), at a blank or inside a value. A line of only cells and values continues the
  row above while that row is short; row tokens are told apart by shape (link codes, then id
  lists), so the CPU affinity, NUMA affinity and GPU NUMA ID land in their fields even when the
  header and the rows disagree on the column count;
* other output around it: a shell prompt, Markdown fences, ``topo -p2p`` matrices after it (a
  second header ends the matrix), the legend present or absent.
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
# Row labels of old drivers name the NIC itself (mlx5_0, mlx4_0): any identifier may start a row.
_DEVICE_LABEL_OR_NAME = re.compile(r"[A-Za-z][\w.-]*")
# Each heading matched across any run of blanks (tabs turned into spaces, or a header wrapped mid-heading).
_HEADING_RX = {h: re.compile(r"\s+".join(h.split())) for h in _TRAILING}
_HEADING_WORDS = frozenset(w for h in _TRAILING for w in h.split())
# A trailing value: a CPU/NUMA id list, N/A, or a list the terminal cut ("-31,64-95").
_VALUE = re.compile(r"N/A|[\d,-]+")
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
    if len(lines) > 1 and not text.endswith(("\n", "\r")) and len(lines[-1].split()) > 1:
        lines[-1] = lines[-1].rstrip().rsplit(None, 1)[0]  # cut mid-write: its last cell may be cut ("SY")
    start = _find_header(lines)
    if start is None:
        raise ParseError(
            "nvidia-smi topo -m output has no header line ('GPU0  GPU1 ...  CPU Affinity ...'); "
            f"got {text_preview(text)}. Pass the whole output of `nvidia-smi topo -m`."
        )
    width = max(map(len, lines))  # a capture wrapped at a fixed width has its longest lines that long
    header, body = _join_wrapped_header(lines, start, width)
    columns, trailing = _split_header(header)
    rows, nic_names = _read_rows(lines[body:], columns, trailing, width)
    matrix: dict[str, dict[str, str | None]] = {}
    extra: dict[str, dict[str, str | None]] = {name: {} for name in _TRAILING.values()}
    for label, tokens in rows:
        cells, values = _cells_and_values(tokens, len(columns))
        matrix[label] = {col: cells[i] if i < len(cells) else None for i, col in enumerate(columns)}
        for heading, value in zip(trailing, values, strict=False):
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


def _is_header_words(tokens: list[str]) -> bool:
    """Device labels and heading words only: a header, or a header's wrapped tail."""
    return bool(tokens) and all(_DEVICE_LABEL.fullmatch(t) or t in _HEADING_WORDS for t in tokens)


def _join_wrapped_header(lines: list[str], start: int, width: int) -> tuple[str, int]:
    """The header with the lines it wrapped onto (``NIC4  NIC5  CPU Affinity`` / ``GPU NUMA ID``), and
    the index of the first line after it."""
    header, previous, i = lines[start], lines[start], start + 1
    while i < len(lines):
        line = lines[i]
        glue = _hard_wrapped(previous, line, width)
        joined = header + line if glue else f"{header} {line}"
        tail = joined.split()[len(header.split()) - glue :]
        if not _is_header_words(tail) or _is_row_start(tail):
            break
        header, previous, i = joined, line, i + 1
    return header, i


def _hard_wrapped(previous: str, line: str, width: int) -> bool:
    """Whether a wrap at ``width`` cut a token in two between these lines (no blank on either side)."""
    return len(previous) >= width and not previous[-1:].isspace() and not line[:1].isspace()


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """Device column labels, and the trailing headings present, in printed order.

    Headings are found with any run of blanks between their words, so a capture whose tabs became
    spaces, or a header wrapped inside a heading, still names its columns.
    """
    found = sorted((m.start(), heading) for heading, rx in _HEADING_RX.items() if (m := rx.search(line)))
    cut = found[0][0] if found else len(line)
    return line[:cut].split(), [h for _, h in found]


def _is_row_start(tokens: list[str]) -> bool:
    """A label followed by a link code: ``GPU0 X``, ``NIC3 PIX``, ``mlx5_0 PHB`` (not ``NIC12 CPU Affinity``)."""
    if len(tokens) < 2 or not _DEVICE_LABEL_OR_NAME.fullmatch(tokens[0]):
        return False
    cell = tokens[1]
    return bool(_CELL.fullmatch(cell)) and not _DEVICE_LABEL.fullmatch(cell) and cell not in _HEADING_WORDS


def _read_rows(
    lines: list[str], columns: list[str], trailing: list[str], width: int
) -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """Device rows (label, tokens after it) with wrapped lines joined back, and the NIC legend.

    The matrix ends at ``Legend:``/``NIC Legend:`` or at a second header (``topo -p2p`` printed
    after it). A line of only cells and values continues the row above while that row is short of
    its columns and headings; where the wrap cut a value in two (the line above filled the whole
    width and the next line starts with no blank), the halves are glued back.
    """
    rows: list[tuple[str, list[str]]] = []
    nic_names: dict[str, str] = {}
    open_row: list[str] | None = None
    previous = ""
    in_legend = False
    for line in lines:
        tokens = line.split()
        if not tokens:
            open_row = None
            continue
        in_legend = in_legend or "Legend:" in tokens  # "Legend:" and "NIC Legend:" end the matrix
        if in_legend:
            if legend := _LEGEND_NIC.match(line):
                nic_names[legend.group(1)] = legend.group(2)
            continue
        if _is_header_words(tokens) and not _is_row_start(tokens):
            break  # another matrix (topo -p2p ...) follows with no legend between
        if (tokens[0] in columns or _DEVICE_LABEL.fullmatch(tokens[0])) and not _is_header_words(tokens[:2]):
            open_row = list(tokens)
            rows.append((tokens[0], open_row))
        elif open_row is not None and all(_CELL.fullmatch(t) or _VALUE.fullmatch(t) for t in tokens):
            if len(open_row) - 1 >= len(columns) + (
                len(trailing) if _GPU_LABEL.fullmatch(open_row[0]) else 0
            ):
                open_row = None
                continue
            if _hard_wrapped(previous, line, width):
                open_row[-1] += tokens.pop(0)  # a hard wrap cut this value in two
            open_row.extend(tokens)
        else:
            open_row = None  # "...", prompt lines, stray text
        previous = line
    return rows, nic_names


def _cells_and_values(tokens: list[str], ncolumns: int) -> tuple[list[str | None], list[str]]:
    """Split a row's tokens into link cells and trailing values by their shape, not their position.

    Cells are link codes (``X``, ``SYS``, ``NV18``...); values are CPU/NUMA lists, ``N/A`` or a
    cut value. Reading by shape keeps the CPU and NUMA affinity in their fields when the header and
    the rows disagree on the number of columns (a clipped header, a row that lost a cell).
    """
    after = tokens[1:]
    n = 0
    while n < len(after) and n < ncolumns and _CELL.fullmatch(after[n]):
        n += 1
    return [_cell(t) for t in after[:n]], after[n:]


def _cell(token: str) -> str | None:
    return token if _CELL.fullmatch(token) else None
