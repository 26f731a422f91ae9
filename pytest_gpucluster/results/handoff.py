"""Readings one test hands to a later test of the same run, through the results directory.

The acceptance suite reads some things first and judges them later: the ECC/XID counters and the
fabric ports before the run (test_counters_before, test_fabric_before) for the after tests, the
InfiniBand before-scan for the fabric after-scan and for the pairwise burn-in's fabric join. Kept
in pytest's stash, such a reading lives in one process only: under ``pytest -n N`` the later test
may run in another worker and silently find nothing. Here the earlier test writes it to
``<results dir>/<name>.json`` (atomically, with the session's tag: a file left by another run in
the same directory is not this run's) and the later test reads it from there, in any process.

Every outcome of the earlier test leaves a record: the reading, or why there is none (it failed,
or skipped, saying why). The later test gets either the reading or a sentence saying why it has
none, for its NOT MEASURED (`Absent`); it waits for the record only while the earlier test is
selected in this run and has not yet written it (another worker), up to a deadline.

No pytest; file I/O only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.atomic import write_atomic

__all__ = ["Absent", "Handoff", "await_handoff", "handoff_path", "read_handoff", "write_handoff"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Handoff:
    """The earlier test's reading (``value``: plain JSON, as it wrote it)."""

    name: str
    value: Any
    written_by: str
    """The node id of the test that wrote it."""
    pid: int
    """The process that wrote it (an xdist worker's, or the only pytest's)."""


@dataclass(frozen=True, slots=True)
class Absent:
    """No reading to join, and why (one sentence, for a NOT MEASURED)."""

    name: str
    why: str


def handoff_path(results_dir: Path, name: str) -> Path:
    return results_dir / f"{name}.json"


def write_handoff(
    results_dir: Path,
    name: str,
    session: str,
    written_by: str,
    value: Any = None,
    *,
    missing: str | None = None,
) -> Path:
    """Record ``value`` (JSON-able) for later tests, or with ``missing`` the reason there is none
    (the earlier test failed or skipped). Atomic: a reader never sees half a file."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = handoff_path(results_dir, name)
    record = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "session": session,
        "written_by": written_by,
        "pid": os.getpid(),
        "written_at": time.time(),
        "value": value,
        "missing": missing,
    }
    write_atomic(path, json.dumps(record, indent=1))
    return path


def read_handoff(results_dir: Path, name: str, session: str, writer: str) -> Handoff | Absent | None:
    """This session's record of ``name``: the `Handoff`, an `Absent` saying why the writer left no
    reading (or why the file cannot be read), or None when this session wrote none yet. ``writer``
    names the earlier test in the sentences."""
    path = handoff_path(results_dir, name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return Absent(name, f"{path} cannot be read ({exc}); {writer}'s reading is lost")
    if not isinstance(data, dict) or data.get("name") != name:
        return Absent(name, f"{path} is not a reading of {name} written by {writer}")
    if data.get("session") != session:
        return None  # another run's file in a reused results directory: not this run's reading
    if data.get("missing"):
        return Absent(name, f"{writer} recorded no reading: {data['missing']}")
    return Handoff(name, data.get("value"), str(data.get("written_by", "")), int(data.get("pid", 0)))


def await_handoff(
    results_dir: Path,
    name: str,
    session: str,
    writer: str,
    *,
    selected: bool,
    deadline_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Handoff | Absent:
    """The reading of ``name`` for a later test. ``selected``: the earlier test ``writer`` is among
    this run's tests; then its record is waited for (it may be running in another xdist worker) for
    up to ``deadline_s``. Never a silent None: an `Absent` says why there is no reading."""
    end = clock() + deadline_s
    while True:
        found = read_handoff(results_dir, name, session, writer)
        if found is not None:
            return found
        if not selected:
            return Absent(
                name,
                f"{writer} is not among this run's tests (deselected by -k/-m or a test id), so there is "
                "no before-reading to join; run it in the same pytest",
            )
        if clock() >= end:
            return Absent(
                name,
                f"{writer} is selected but left no record in {handoff_path(results_dir, name)} within "
                f"{deadline_s:g} s (it has not run yet in another pytest-xdist worker, or its worker died); "
                "the plugin groups the two with --dist loadgroup, so pass -n with --dist load/loadgroup",
            )
        sleep(poll_s)
