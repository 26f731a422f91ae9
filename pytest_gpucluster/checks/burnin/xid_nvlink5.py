"""NVLink5 XIDs (144-150, Blackwell) decoded by the catalog's "XID 144-150 Decode" sheet.

NVIDIA's XID catalog gives these XIDs the bucket ``WORKFLOW_NVLINK5_ERR``: "These errors need decoding
of XID message ... <intrInfo>, <errorStatus> must be decoded and evaluated using 'XID 144-150 Decode' to
derive the final resolution". A line reads ``Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0
Link 13 (0x0409a0c2 0x00000008 ...)``: the unit, then the registers, intrInfo first, errorStatus second.
:data:`DECODE_ROWS` are the sheet's rows (unit; intrInfo bit masks for drivers before R575 (V1) and from
R575 (V2), ``-`` a bit not decoded; errorStatus; the immediate-action bucket), checked against the saved
excerpt ``tests/data/xid_catalog/xid_144_150_decode.csv`` by ``tests/unit/test_xid_catalog.py``.

:func:`decode` gives a bucket only where the line's unit, intrInfo and errorStatus select rows that all
agree; otherwise (no registers, an NVML event without a line, a decode the sheet does not hold, rows
that disagree) None, and the caller keeps the fail-closed reading of ``WORKFLOW_NVLINK5_ERR``. A row's
"Action 2" (a promoted, fatal, decode) has its own intrInfo mask that no row here matches, so such a
line is not decoded and stays fail-closed, which is the action 2 (``RESET_GPU``).

Pure: no imports from the package, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DECODE_ROWS", "Decoded", "decode"]

DECODE_ROWS: tuple[tuple[int, str, str, str, int, str], ...] = (
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000001, "IGNORE"),
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000002, "RESET_GPU"),
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000004, "IGNORE"),
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000008, "IGNORE"),
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000010, "RESET_GPU"),
    (144, "SAW_MVB", "------000000----------0000100001", "------000000-------------0000001", 0x00000020, "IGNORE"),
    (145, "RLW_CTRL", "------000000----------0001100010", "------000000-------------0000011", 0x80000000, "IGNORE"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000001, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000002, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000004, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000008, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000010, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000020, "XID_154_EVAL"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000040, "RESET_GPU"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000080, "RESET_GPU"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000100, "IGNORE"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x00000200, "IGNORE"),
    (145, "RLW_REMAP", "------000000----------0010000010", "------000000-------------0000100", 0x80000000, "IGNORE"),
    (145, "RLW_RSPCOL", "------000000----------0010100010", "------000000-------------0000101", 0x00000001, "IGNORE"),
    (145, "RLW_RSPCOL", "------000000----------0010100010", "------000000-------------0000101", 0x00000002, "RESET_GPU"),
    (145, "RLW_RSPCOL", "------000000----------0010100010", "------000000-------------0000101", 0x80000000, "IGNORE"),
    (145, "RLW_RXPIPE", "------000000---------00011000010", "------000000------------00000110", 0x00000001, "IGNORE"),
    (145, "RLW_RXPIPE", "------000000---------00011000010", "------000000------------00000110", 0x00000002, "IGNORE"),
    (145, "RLW_RXPIPE", "------000000---------00011000010", "------000000------------00000110", 0x00000004, "IGNORE"),
    (145, "RLW_RXPIPE", "------000000----------0011000010", "------000000-------------0000110", 0x00000008, "IGNORE"),
    (145, "RLW_RXPIPE", "------000000----------0011000010", "------000000-------------0000110", 0x80000000, "IGNORE"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000001, "RESET_GPU"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000002, "IGNORE"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000004, "XID_154_EVAL"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000008, "XID_154_EVAL"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000010, "RESET_GPU"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x00000020, "RESET_GPU"),
    (145, "RLW_SRC_TRACK", "------000000----------0011100010", "------000000-------------0000111", 0x80000000, "IGNORE"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x00000001, "IGNORE"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x00000002, "RESET_GPU"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x00010000, "IGNORE"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x00020000, "RESET_GPU"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x00100000, "RESET_GPU"),
    (145, "RLW_TAGSTATE", "------000000----------0100000010", "------000000-------------0001000", 0x80000000, "IGNORE"),
    (146, "TLW_CTRL", "------000000----------0100100011", "------000000-------------0001001", 0x00000001, "IGNORE"),
    (146, "TLW_CTRL", "------000000----------0100100011", "------000000-------------0001001", 0x00000002, "IGNORE"),
    (146, "TLW_CTRL", "------000000----------0100100011", "------000000-------------0001001", 0x00000004, "RESET_GPU"),
    (146, "TLW_CTRL", "------000000----------0100100011", "------000000-------------0001001", 0x80000000, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE0", "------000000----------0101000011", "------000000-------------0001010", 0x00000001, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE0", "------000000----------0101000011", "------000000-------------0001010", 0x00000002, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE0", "------000000----------0101000011", "------000000-------------0001010", 0x00000004, "RESET_GPU"),
    (146, "TLW_RX/TLW_RX_PIPE0", "------000000----------0101000011", "------000000-------------0001010", 0x80000000, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE1", "------000000----------0101000011", "------000000-------------0001011", 0x00000001, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE1", "------000000----------0101000011", "------000000-------------0001011", 0x00000002, "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE1", "------000000----------0101000011", "------000000-------------0001011", 0x00000004, "RESET_GPU"),
    (146, "TLW_RX/TLW_RX_PIPE1", "------000000----------0101000011", "------000000-------------0001011", 0x80000000, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE0", "------000000----------0101100011", "------000000-------------0001100", 0x00000001, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE0", "------000000----------0101100011", "------000000-------------0001100", 0x00000002, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE0", "------000000----------0101100011", "------000000-------------0001100", 0x00000004, "RESET_GPU"),
    (146, "TLW_TX/TLW_TX_PIPE0", "------000000----------0101100011", "------000000-------------0001100", 0x80000000, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE1", "------000000----------0101100011", "------000000-------------0001101", 0x00000001, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE1", "------000000----------0101100011", "------000000-------------0001101", 0x00000002, "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE1", "------000000----------0101100011", "------000000-------------0001101", 0x00000004, "RESET_GPU"),
    (146, "TLW_TX/TLW_TX_PIPE1", "------000000----------0101100011", "------000000-------------0001101", 0x80000000, "IGNORE"),
    (147, "TREX", "------000000----------0110000100", "------000000-------------0001110", 0x00000001, "IGNORE"),
    (147, "TREX", "------000000----------0110000100", "------000000-------------0001110", 0x80000000, "IGNORE"),
    (148, "NVLPW_CTRL/NVLPW", "------000000----------0000000101", "------000000-------------0001111", 0x80000000, "IGNORE"),
    (149, "NETIR/NETIR_INT", "------000000----------0000000110", "------000000-------------0011000", 0x00000000, "RESET_GPU"),
    (149, "NETIR_BER_EVENT", "------000000----------1000100110", "------000000-------------0010011", 0x00000000, "IGNORE"),
    (149, "NETIR_BER_EVENT", "------000000----------1000100110", "------000000-------------0010011", 0x00000001, "IGNORE"),
    (149, "NETIR_BER_EVENT", "------000000----------1000100110", "------000000-------------0010011", 0x00000002, "IGNORE"),
    (149, "NETIR_BER_EVENT", "------000000----------1000100110", "------000000-------------0010011", 0x00000003, "IGNORE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------000000----------0111000110", "------000000-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------000001----------0111000110", "------000001-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------000010----------0111000110", "------000010-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------000100----------0111000110", "------000100-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------001010----------0111000110", "------001010-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------001111----------0111000110", "------001111-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------010000----------0111000110", "------010000-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------010001----------0111000110", "------010001-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------010010----------0111000110", "------010010-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------010101----------0111000110", "------010101-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------010110----------0111000110", "------010110-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100000----------0111000110", "------100000-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100001----------0111000110", "------100001-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100010----------0111000110", "------100010-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100011----------0111000110", "------100011-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100100----------0111000110", "------100100-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100101----------0111000110", "------100101-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------100110----------0111000110", "------100110-------------0010001", 0x00000000, "IGNORE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------101000----------0111000110", "------101000-------------0010001", 0x00000000, "IGNORE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------101010----------0111000110", "------101010-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "------101011----------0111000110", "------101011-------------0010001", 0x00000000, "RESET_GPU"),
    (149, "NETIR_MFDE_EVENT", "------000000----------1001000110", "------000000-------------0010100", 0x00000001, "RESET_GPU"),
    (149, "NETIR_MFDE_EVENT", "------000000----------1001000110", "------000000-------------0010100", 0x00000003, "IGNORE"),
    (149, "NETIR_MFDE_EVENT", "------000000----------1001000110", "------000000-------------0010100", 0x00000004, "RESET_GPU"),
    (149, "NETIR_MFDE_EVENT", "------000000----------1001000110", "------000000-------------0010100", 0x00000005, "RESET_GPU"),
    (149, "NETIR_MFDE_EVENT", "------000000----------1001000110", "------000000-------------0010100", 0x00000007, "RESET_GPU"),
    (150, "MSE_WATCHDOG", "------000000----------0000000000", "------000000-------------0000000", 0x00000000, "RESET_GPU"),
)  # fmt: skip
"""``(xid, unit, intrInfo mask V1, intrInfo mask V2, errorStatus, immediate-action bucket)``: the catalog's
"XID 144-150 Decode" sheet (source: ``xid_catalog.SOURCES``; the unit is written ``V1/V2`` where the
driver's name for it changed at R575)."""

_LINE = re.compile(
    r":\s*(?P<xid>14[4-9]|150),\s*(?P<unit>[A-Za-z0-9_]+)\b.*?\((?P<intr>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+)"
)


@dataclass(frozen=True, slots=True)
class Decoded:
    unit: str
    intr_info: int
    error_status: int
    bucket: str
    """The decode sheet's immediate-action bucket (``IGNORE``, ``RESET_GPU``, ``XID_154_EVAL``)."""

    def __str__(self) -> str:
        return (
            f"decoded {self.unit} intrInfo 0x{self.intr_info:08x} errorStatus 0x{self.error_status:08x} "
            f"on the catalog's XID 144-150 Decode sheet: {self.bucket}"
        )


def _matches(mask: str, value: int) -> bool:
    bits = format(value, "032b")
    return len(mask) == 32 and all(m == "-" or m == b for m, b in zip(mask, bits, strict=True))


def decode(xid: int, line: str) -> Decoded | None:
    """The decode sheet's bucket for an NVLink5 XID's log line, or None where it cannot be decided."""
    match = _LINE.search(line or "")
    if match is None or int(match["xid"]) != xid:
        return None
    unit, intr, status = match["unit"], int(match["intr"], 16), int(match["status"], 16)
    buckets = set()
    for row_xid, row_unit, v1, v2, row_status, bucket in DECODE_ROWS:
        if row_xid != xid or row_status != status:
            continue
        names = row_unit.split("/")
        masks = (
            [v1, v2] if len(names) == 1 else [m for n, m in zip(names, (v1, v2), strict=True) if n == unit]
        )
        if unit in names and any(_matches(m, intr) for m in masks):
            buckets.add(bucket)
    if len(buckets) != 1:
        return None
    return Decoded(unit, intr, status, buckets.pop())
