"""Cable history: `gpucluster fabric scan` findings kept per cable in the history store, and the
cables that keep failing (``gpucluster history cables``), as lemons does for nodes.

A cable is named by its two ends as the scan prints them, sorted, so the same cable seen from
either end (a counter counted at the switch port or at the HCA) is one cable. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.history.store import AppendResult, HistoryStore

__all__ = ["CableRecord", "add_fabric_scan", "cable_key", "failing_cables"]

CABLE_KINDS = frozenset(
    {"link-width", "link-speed", "missing-cable", "moved-cable", "extra-cable", "rail", "counter"}
)
"""Findings about one cable (the rest name a switch, a host or the SM)."""


def cable_key(where: str) -> str:
    """``a <-> b`` with its ends sorted; a finding that names no cable keeps its text."""
    ends = where.split(" <-> ")
    return " <-> ".join(sorted(ends)) if len(ends) == 2 else where


def add_fabric_scan(store: HistoryStore, path: Path) -> AppendResult:
    """Store the findings of a scan's fabric.json (each scan once: keyed by the file's content)."""
    try:
        text = path.read_text()
        data: dict[str, Any] = json.loads(text)
        findings = [(cable_key(f["where"]), f["kind"], f["line"]) for f in data["findings"]]
        cables = len(data["model"]["links"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GpuClusterError(
            f"{path}: not a fabric scan's fabric.json ({type(exc).__name__}: {exc})"
        ) from None
    key = hashlib.sha256(text.encode()).hexdigest()
    return store.append_fabric_scan(key, str(path), data.get("scanned_at"), cables, findings)


@dataclass(frozen=True, slots=True)
class CableRecord:
    cable: str
    scans: int
    """How many of the window's scans found something on this cable."""
    of: int
    lines: tuple[str, ...]
    """The latest finding of each of those scans, oldest first."""

    def line(self) -> str:
        return f"{self.cable}: failed in {self.scans} of the last {self.of} scans"


def failing_cables(store: HistoryStore, window: int = 20, recurring: int = 2) -> list[CableRecord]:
    """Cables with a cable finding in ``recurring`` or more of the last ``window`` scans, worst first."""
    scans = [r[0] for r in store.query("SELECT id FROM fabric_scans ORDER BY id DESC LIMIT ?", (window,))]
    if not scans:
        return []
    marks = ",".join("?" * len(scans))
    rows = store.query(
        f"SELECT scan_id, cable, kind, line FROM cable_findings WHERE scan_id IN ({marks}) ORDER BY scan_id, seq",
        scans,
    )
    by_cable: dict[str, dict[int, str]] = defaultdict(dict)
    for scan_id, cable, kind, line in rows:
        if kind in CABLE_KINDS:
            by_cable[cable][scan_id] = line
    out = [
        CableRecord(cable, len(seen), len(scans), tuple(seen[s] for s in sorted(seen)))
        for cable, seen in by_cable.items()
        if len(seen) >= recurring
    ]
    return sorted(out, key=lambda c: (-c.scans, c.cable))
