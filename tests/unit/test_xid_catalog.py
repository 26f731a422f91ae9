"""The XID table agrees with NVIDIA's XID catalog, row by row (checks/burnin/xid_catalog.py against the
saved catalog excerpt tests/data/xid_catalog/xid_catalog.csv, whose header and README.md say where
every row was copied from)."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_gpucluster.checks.burnin.xid_catalog import SOURCES
from pytest_gpucluster.checks.burnin.xid_classes import (
    BUCKET_ACTIONS,
    UNKNOWN_ACTION,
    WARNING_BUCKETS,
    XID_CLASSES,
    XidClass,
    classify,
    classify_event,
)
from pytest_gpucluster.checks.burnin.xid_nvlink5 import DECODE_ROWS, decode

DATA = Path(__file__).parents[1] / "data" / "xid_catalog"
EXCERPT = DATA / "xid_catalog.csv"
COLUMNS = ["xid", "mnemonic", "description", "immediate_action", "investigatory_action"]
DECODE = DATA / "xid_144_150_decode.csv"
DECODE_COLUMNS = ["xid", "unit", "intrinfo_v1", "intrinfo_v2", "error_status", "immediate_action", "action2",
                  "investigatory_action", "severity", "hw_sw"]  # fmt: skip
GB200 = Path(__file__).parents[1] / "data" / "kernel_logs" / "xid_145_149_gb200_pci_domain_gpud1174.log"


def _rows(path: Path, columns: list[str]) -> list[dict[str, str]]:
    """The excerpt's rows past its ``#`` credit lines; a malformed line is named with its line number."""
    text = path.read_text(encoding="utf-8").splitlines()
    body = [(n, line) for n, line in enumerate(text, 1) if not line.startswith("#")]
    reader = csv.reader(line for _, line in body)
    header = next(reader)
    assert header == columns, f"{path}:{body[0][0]}: header {header}, expected {columns}"
    rows = []
    for (n, _), cells in zip(body[1:], reader, strict=True):
        assert len(cells) == len(columns), f"{path}:{n}: {len(cells)} cells, expected {len(columns)}"
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


CATALOG = {int(row["xid"]): row for row in _rows(EXCERPT, COLUMNS)}
DECODE_SHEET = _rows(DECODE, DECODE_COLUMNS)


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def disagreements(table: Mapping[int, XidClass], catalog: Mapping[int, Mapping[str, str]]) -> list[str]:
    """Every way a row of ``table`` differs from the catalog excerpt: a missing XID, another bucket,
    mnemonic or description, a source that is not cited."""
    out = []
    for xid, c in sorted(table.items()):
        row = catalog.get(xid)
        if row is None:
            out.append(f"XID {xid}: not in the catalog excerpt")
            continue
        if c.bucket != row["immediate_action"]:
            out.append(
                f"XID {xid}: bucket {c.bucket}, the catalog's immediate action is {row['immediate_action']}"
            )
        if c.mnemonic != row["mnemonic"]:
            out.append(f"XID {xid}: mnemonic {c.mnemonic}, the catalog's is {row['mnemonic']}")
        if len(c.name) < 3 or not _norm(row["description"]).startswith(_norm(c.name)):
            out.append(f"XID {xid}: name {c.name!r} is not the catalog's description {row['description']!r}")
        if not SOURCES.get(c.source):
            out.append(f"XID {xid}: source {c.source!r} is not a key of xid_catalog.SOURCES")
    return out


def test_every_row_of_the_table_agrees_with_the_catalog_and_cites_its_source():
    assert len(CATALOG) == 172 and list(CATALOG) == list(range(1, 173))
    assert disagreements(XID_CLASSES, CATALOG) == []
    assert all(c.source == "nvidia-xid-catalog" for c in XID_CLASSES.values())


@pytest.mark.parametrize(
    ("xid", "change"),
    [(45, {"bucket": "RESTART_APP"}), (79, {"bucket": "RESET_GPU"}), (64, {"name": "ECC page retirement"}),
     (13, {"mnemonic": "ROBUST_CHANNEL_GR_EXCEPTION"}), (8, {"source": "hearsay"})],
)  # fmt: skip
def test_a_changed_bucket_name_or_source_is_caught(xid, change):
    """The agreement check is not vacuous: one field changed in one row is named."""
    table = dict(XID_CLASSES)
    table[xid] = dataclasses.replace(table[xid], **change)
    [found] = disagreements(table, CATALOG)
    [field] = change
    assert found.startswith(f"XID {xid}: {field} ")


def test_the_table_holds_every_catalog_row_with_a_bucket_except_unused_contact_support():
    """Held: every row with an immediate action, but the deprecated "Unused"/CONTACT_SUPPORT ones, which
    the table judges as it judges any unknown code (a suspect to drain, the catalog's CONTACT_SUPPORT).
    Rows with an empty bucket (162-172) are not held: suspects too."""
    expected = {
        xid
        for xid, row in CATALOG.items()
        if row["immediate_action"]
        and not (row["description"] == "Unused" and row["immediate_action"] == "CONTACT_SUPPORT")
    }
    assert set(XID_CLASSES) == expected
    empty = [xid for xid, row in CATALOG.items() if not row["immediate_action"]]
    assert empty == list(range(162, 173))
    for xid in (61, 56, 57, 122, 123, *empty):
        assert classify(xid) is None  # judged a suspect: UNKNOWN_ACTION
    assert UNKNOWN_ACTION == BUCKET_ACTIONS["CONTACT_SUPPORT"] == "drain node"


def test_every_catalog_bucket_has_an_action_and_warnings_are_only_buckets_that_spare_the_gpu():
    buckets = {row["immediate_action"] for row in CATALOG.values() if row["immediate_action"]}
    decoded = {row[c] for row in DECODE_SHEET for c in ("immediate_action", "action2") if row[c]}
    assert buckets | decoded == set(BUCKET_ACTIONS)
    assert decoded == {"IGNORE", "RESET_GPU", "XID_154_EVAL"}
    assert {b for b, a in BUCKET_ACTIONS.items() if a == "rerun"} == WARNING_BUCKETS
    assert {"RESTART_APP", "IGNORE", "RESTART_VM", "WORKFLOW_XID_45", "XID_154_EVAL"} == WARNING_BUCKETS
    for c in XID_CLASSES.values():
        assert c.warning == (c.action == "rerun"), c


@pytest.mark.parametrize(
    ("xid", "bucket", "action"),
    [(13, "RESTART_APP", "rerun"), (31, "RESTART_APP", "rerun"), (43, "IGNORE", "rerun"),
     (45, "WORKFLOW_XID_45", "rerun"), (63, "IGNORE", "rerun"), (92, "IGNORE", "rerun"),
     (94, "RESTART_APP", "rerun"), (32, "RESTART_APP", "rerun"), (38, "IGNORE", "rerun"),
     (46, "RESET_GPU", "reset GPU"), (48, "WORKFLOW_XID_48", "reset GPU"), (62, "RESET_GPU", "reset GPU"),
     (64, "RESET_GPU", "reset GPU"), (74, "WORKFLOW_NVLINK_ERR", "reset GPU"), (95, "RESET_GPU", "reset GPU"),
     (109, "RESET_GPU", "reset GPU"), (119, "RESET_GPU", "reset GPU"), (120, "RESET_GPU", "reset GPU"),
     (140, "RESET_GPU", "reset GPU"), (143, "RESET_GPU", "reset GPU"), (149, "WORKFLOW_NVLINK5_ERR", "reset GPU"),
     (155, "RESET_GPU", "reset GPU"), (79, "RESTART_BM", "drain node"), (54, "CHECK_MECHANICALS", "drain node"),
     (154, "XID_154", "drain node")],
)  # fmt: skip
def test_the_xids_a_training_cluster_sees(xid, bucket, action):
    """Read off the catalog excerpt by eye (and the page text, README.md): the bucket, and the rung
    the suite gives it."""
    found = classify(xid)
    assert found is not None and (found.bucket, found.action) == (bucket, action)


def test_the_excerpt_credits_its_sources():
    header = [line for line in EXCERPT.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    credit = " ".join(header)
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in credit
    assert "leptonai/gpud@4a8de33a3f02e207f39e9023d67125592d599731:" in credit
    assert "components/accelerator/nvidia/xid/catalog_generated.go" in credit
    for cited in SOURCES.values():
        assert "analyzing-xid-catalog.html" in cited and "tests/data/xid_catalog/xid_catalog.csv" in cited


def test_the_nvlink5_decode_rows_are_the_catalogs_decode_sheet():
    """xid_nvlink5.DECODE_ROWS against the saved "XID 144-150 Decode" excerpt, field by field."""
    assert [
        (
            int(r["xid"]),
            r["unit"],
            r["intrinfo_v1"],
            r["intrinfo_v2"],
            int(r["error_status"], 16),
            r["immediate_action"],
        )
        for r in DECODE_SHEET
    ] == list(DECODE_ROWS)
    assert len(DECODE_ROWS) == 94 and all(len(v1) == len(v2) == 32 for _, _, v1, v2, _, _ in DECODE_ROWS)


@pytest.mark.parametrize(
    ("line", "xid", "bucket", "action"),
    [(0, 149, "RESET_GPU", "reset GPU"), (1, 149, "RESET_GPU", "reset GPU"), (2, 145, "IGNORE", "rerun")],
)  # fmt: skip
def test_real_gb200_nvlink5_lines_decode_on_the_catalogs_sheet(line, xid, bucket, action):
    """A recorded GB200 log (leptonai/gpud#1174, tests/data/kernel_logs/SOURCES.md), decoded by hand on the
    sheet: 149 ``NETIR`` intrInfo 0x000fe406 is NETIR/NETIR_INT (V1 mask ...0000000110), RESET_GPU;
    149 ``NETIR_LINK_EVT`` 0x025001c6 has bits 25-20 100101, RESET_GPU (INVESTIGATE_PEER_DEVICE);
    145 ``RLW_RXPIPE`` 0x0409a0c2 with errorStatus 0x00000008 is the non-fatal row, IGNORE."""
    text = GB200.read_text(encoding="utf-8").splitlines()[line]
    found = classify_event(xid, text)
    assert found is not None and (found.bucket, found.action) == (bucket, action)
    assert found.decoded.startswith("decoded ") and bucket in found.decoded


def test_an_nvlink5_line_the_sheet_cannot_decide_stays_fail_closed():
    """No registers (an NVML event), a unit the sheet does not hold for this XID, an errorStatus no row
    has, the action-2 intrInfo mask of a promoted RLW_RXPIPE error: the catalog's WORKFLOW_NVLINK5_ERR,
    judged as the sheet's fatal decodes (reset GPU)."""
    line = "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x0)"
    assert decode(145, line) is not None
    for xid, text in [
        (145, None),
        (145, line.replace("RLW_RXPIPE", "SAW_MVB")),
        (145, line.replace("0x00000008", "0x00000040")),
        (145, line.replace("0x0409a0c2 0x00000008", "0x0409a4c2 0x00000001")),  # bit 10 set: action 2
        (144, line),
    ]:
        found = classify_event(xid, text)
        assert found is not None and (found.bucket, found.action, found.decoded) == (
            "WORKFLOW_NVLINK5_ERR",
            "reset GPU",
            "",
        ), (xid, text)
    # the same line with the action-1 mask and errorStatus 0x1 is the sheet's IGNORE row
    assert decode(145, line.replace("0x00000008", "0x00000001")).bucket == "IGNORE"  # type: ignore[union-attr]
