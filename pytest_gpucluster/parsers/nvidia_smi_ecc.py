"""ECC state per GPU: ``nvidia-smi -q [-d ECC]`` and ``--query-gpu=ecc.mode.current,ecc.mode.pending``.

``nvidia-smi -q`` prints an indented tree per GPU (``GPU 00000000:19:00.0``). Its ECC parts changed
with the driver and the GPU generation, and all of these are read:

- ``ECC Mode`` (``Ecc Mode`` in older drivers) with ``Current``/``Pending``: ``Enabled``, ``Disabled``
  or ``N/A`` (no ECC on the part, e.g. GeForce, TITAN V);
- ``ECC Errors`` -> ``Volatile``/``Aggregate`` either flat (A100/H100 era: ``SRAM Correctable``,
  ``SRAM Uncorrectable Parity``, ``DRAM Uncorrectable``...) or split by ``Single Bit``/``Double Bit``
  with a ``Total`` (Volta and earlier, still printed by 560 drivers for a TITAN V);
- ``Retired Pages`` and ``Remapped Rows`` (a section, or ``Remapped Rows : N/A``).

Pasted excerpts with ``[...]`` elisions, or an ``ECC Errors`` block with no ``GPU`` line above it,
still parse. Pure: no I/O, no pytest/torch imports; the CSV side reuses :mod:`.nvidia_smi`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_smi import parse_query_csv, text_preview

__all__ = [
    "ECC_MODE_FIELDS",
    "EccMode",
    "GpuEcc",
    "parse_ecc",
    "parse_ecc_mode_csv",
    "parse_ecc_query",
    "to_json",
]

ECC_MODE_FIELDS: tuple[str, ...] = ("ecc.mode.current", "ecc.mode.pending")
_GPU_LINE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_ENTRY = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*(?::\s*(?P<value>.*?))?\s*$")
_MODES = {"enabled": True, "disabled": False}
_NO_VALUE = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", ""}

Value = int | bool | str | None


def _value(text: str) -> Value:
    low = text.strip().lower()
    if low in _NO_VALUE:
        return None
    if low in ("yes", "no"):
        return low == "yes"
    if low in _MODES:
        return _MODES[low]
    return int(low) if low.isdigit() else text.strip()


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@dataclass(frozen=True, slots=True)
class GpuEcc:
    """ECC mode and counters of one GPU from ``nvidia-smi -q``.

    ``index`` is the GPU's position in the output (nvidia-smi lists GPUs in index order). Counter
    maps use snake_case names, nested ones dotted: ``dram_uncorrectable``, ``double_bit.total``.
    """

    index: int
    bus_id: str | None
    product_name: str | None
    mode_current: bool | None
    mode_pending: bool | None
    volatile: Mapping[str, Value] = field(default_factory=dict)
    aggregate: Mapping[str, Value] = field(default_factory=dict)
    retired_pages: Mapping[str, Value] = field(default_factory=dict)
    remapped_rows: Mapping[str, Value] = field(default_factory=dict)

    @staticmethod
    def _total(counts: Mapping[str, Value], bad: tuple[str, ...], total_key: str) -> int | None:
        if isinstance(counts.get(total_key), int):
            return counts[total_key]  # type: ignore[return-value]
        values = [v for k, v in counts.items() if any(b in k for b in bad) and isinstance(v, int)]
        return sum(values) if values else None

    def uncorrected(self, scope: str = "volatile") -> int | None:
        """Uncorrectable errors (DBE): summed over SRAM/DRAM, or the old layout's ``double_bit.total``."""
        counts = self.volatile if scope == "volatile" else self.aggregate
        return self._total(counts, ("uncorrectable",), "double_bit.total")

    def corrected(self, scope: str = "volatile") -> int | None:
        counts = self.volatile if scope == "volatile" else self.aggregate
        values = {k: v for k, v in counts.items() if "uncorrectable" not in k}
        return self._total(values, ("correctable",), "single_bit.total")

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "bus_id": self.bus_id,
            "product_name": self.product_name,
            "mode_current": self.mode_current,
            "mode_pending": self.mode_pending,
            "uncorrected_volatile": self.uncorrected("volatile"),
            "uncorrected_aggregate": self.uncorrected("aggregate"),
            "corrected_volatile": self.corrected("volatile"),
            "volatile": dict(self.volatile),
            "aggregate": dict(self.aggregate),
            "retired_pages": dict(self.retired_pages),
            "remapped_rows": dict(self.remapped_rows),
        }


def _tree(lines: list[str]) -> dict[str, Any]:
    """Indentation tree of one GPU block: a section maps to a dict, a ``key : value`` line to its text."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in lines:
        if not line.strip() or line.strip() == "[...]":
            continue
        m = _ENTRY.match(line)
        if not m:
            continue
        indent = len(m.group("indent").expandtabs(4))
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if m.group("value") is None:
            node: dict[str, Any] = {}
            parent[m.group("key")] = node
            stack.append((indent, node))
        else:
            parent[m.group("key")] = m.group("value")
    return root


def _find(tree: Mapping[str, Any], *names: str) -> Any:
    wanted = {n.lower() for n in names}
    return next((v for k, v in tree.items() if k.lower() in wanted), None)


def _flatten(section: Any, prefix: str = "") -> dict[str, Value]:
    if not isinstance(section, Mapping):
        return {}
    out: dict[str, Value] = {}
    for key, value in section.items():
        name = f"{prefix}{_snake(key)}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = _value(value)
    return out


def _mode(text: Any, where: str) -> bool | None:
    if text is None:
        return None
    value = _value(str(text))
    if value is not None and not isinstance(value, bool):
        raise ParseError(f"{where}: ECC mode {text!r}, expected Enabled, Disabled or N/A")
    return value


def _gpu(index: int, bus_id: str | None, lines: list[str]) -> GpuEcc:
    tree = _tree(lines)
    where = f"GPU {bus_id or index}"
    mode = _find(tree, "ECC Mode")
    mode = mode if isinstance(mode, Mapping) else {}
    errors = _find(tree, "ECC Errors")
    errors = errors if isinstance(errors, Mapping) else {}
    remapped = _find(tree, "Remapped Rows")
    return GpuEcc(
        index=index,
        bus_id=bus_id,
        product_name=_find(tree, "Product Name"),
        mode_current=_mode(_find(mode, "Current"), where),
        mode_pending=_mode(_find(mode, "Pending"), where),
        volatile=_flatten(_find(errors, "Volatile")),
        aggregate=_flatten(_find(errors, "Aggregate")),
        retired_pages=_flatten(_find(tree, "Retired Pages")),
        remapped_rows=_flatten(remapped) if isinstance(remapped, Mapping) else {},
    )


def parse_ecc_query(text: str) -> list[GpuEcc]:
    """Parse ``nvidia-smi -q`` or ``-q -d ECC``: one :class:`GpuEcc` per ``GPU <bus id>`` block.

    Raises :class:`ParseError` when the text has neither an ``ECC Mode`` nor an ``ECC Errors`` section.
    """
    blocks: list[tuple[str | None, list[str]]] = []
    for line in text.splitlines():
        m = _GPU_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if m:
            blocks.append((m.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
        elif line.startswith((" ", "\t")):
            blocks.append((None, [line]))  # a pasted block with no GPU line above it
    gpus = [_gpu(i, bus, lines) for i, (bus, lines) in enumerate(blocks)]
    gpus = [
        g
        for g in gpus
        if g.mode_current is not None or g.mode_pending is not None or g.volatile or g.aggregate
    ]
    if not gpus:
        raise ParseError(
            f"nvidia-smi -q output holds no 'ECC Mode' or 'ECC Errors' section; got {text_preview(text)}. "
            "Expected the output of 'nvidia-smi -q -d ECC'."
        )
    return gpus


@dataclass(frozen=True, slots=True)
class EccMode:
    """One row of ``--query-gpu=[index,]ecc.mode.current,ecc.mode.pending``; None where it printed [N/A]."""

    index: int
    current: bool | None
    pending: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "mode_current": self.current, "mode_pending": self.pending}


def parse_ecc_mode_csv(text: str) -> list[EccMode]:
    """Parse the ECC-mode CSV, with or without header, with or without a leading ``index`` column."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.startswith(("ecc.mode", "index")):
        rows = parse_query_csv(text)
    else:
        width = len(first.split(","))
        fields = ("index", *ECC_MODE_FIELDS) if width == 3 else ECC_MODE_FIELDS
        rows = parse_query_csv(text, fields)
    out: list[EccMode] = []
    for n, row in enumerate(rows):
        if not set(ECC_MODE_FIELDS) <= set(row):
            raise ParseError(f"ECC CSV: columns are {list(row)}; expected {', '.join(ECC_MODE_FIELDS)}")
        index = row.get("index")
        where = f"ECC CSV line {n + 1}"
        out.append(
            EccMode(
                index=int(index) if index and index.isdigit() else n,
                current=_mode(row["ecc.mode.current"], where),
                pending=_mode(row["ecc.mode.pending"], where),
            )
        )
    return out


def parse_ecc(text: str) -> list[GpuEcc] | list[EccMode]:
    """``nvidia-smi -q`` text or the ECC-mode CSV, whichever ``text`` holds."""
    if re.search(r"(?i)ecc (mode|errors)", text) or "NVSMI LOG" in text:
        return parse_ecc_query(text)
    if not re.search(r"(?i)(^|,)\s*(enabled|disabled|\[?n/a\]?)\s*(,|$)", text, re.MULTILINE):
        raise ParseError(
            f"no 'ECC Mode' section (nvidia-smi -q -d ECC) and no 'Enabled, Enabled' row "
            f"(--query-gpu=ecc.mode.current,ecc.mode.pending --format=csv); got {text_preview(text)}"
        )
    return parse_ecc_mode_csv(text)


def to_json(result: list[GpuEcc] | list[EccMode]) -> list[dict[str, Any]]:
    return [r.to_json() for r in result]
