"""The history store: one SQLite file that every run appends to, and the queries read.

**Atomic appends.** A run is written in one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``): a
run killed mid-append (SIGKILL, a node losing power) leaves a hot rollback journal that the next
opener rolls back, so the store holds every earlier run and nothing of the killed one. The
rollback journal (SQLite's default) is used rather than WAL on purpose: WAL's shared-memory
index only works between processes of one machine, and a fleet's history often lives on a
shared filesystem that several login nodes append to. ``synchronous=FULL`` makes a commit
durable before `append` returns.

**Concurrent writers.** ``BEGIN IMMEDIATE`` takes the write lock before the first write, so two
appending runs queue for it instead of deadlocking on a lock upgrade; the busy timeout
(`BUSY_TIMEOUT_S`) is how long one waits for the other before its append fails with a sentence.

**Versions.** The schema version is SQLite's ``PRAGMA user_version``. `MIGRATIONS` holds, per
version, the statements that bring a store of the previous version to it; opening a store runs
the missing ones in one transaction. A store written by a newer plugin is refused, never
downgraded.

Standard library only (``sqlite3``); no pytest. Rows come from ``history/rows.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.baseline import RunResults
from pytest_gpucluster.results.history.rows import RunRows, run_rows

__all__ = [
    "BUSY_TIMEOUT_S",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AppendResult",
    "HistoryError",
    "HistoryStore",
    "StoredRun",
]

BUSY_TIMEOUT_S = 60.0
"""How long an append waits for another run's append to finish (each holds the lock for well
under a second: one transaction of a few thousand rows)."""

_V1 = (
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        run_key TEXT NOT NULL UNIQUE,
        source TEXT NOT NULL,
        started_at REAL,
        added_at REAL NOT NULL,
        profile TEXT,
        hosts TEXT NOT NULL,
        tests_failed INTEGER NOT NULL,
        tests_total INTEGER NOT NULL,
        checks_failed INTEGER NOT NULL,
        results_schema INTEGER NOT NULL,
        header TEXT NOT NULL
    )""",
    """CREATE TABLE measurements (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        key TEXT NOT NULL,
        metric TEXT NOT NULL,
        host TEXT,
        component TEXT,
        value REAL,
        unit TEXT NOT NULL,
        threshold REAL,
        verdict TEXT NOT NULL,
        test_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    "CREATE INDEX measurements_metric ON measurements(metric, host)",
    "CREATE INDEX measurements_failed ON measurements(verdict, host)",
    """CREATE TABLE outcomes (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        test_id TEXT NOT NULL,
        outcome TEXT NOT NULL,
        category TEXT NOT NULL,
        duration_s REAL NOT NULL,
        message TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    """CREATE TABLE findings (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        host TEXT,
        component TEXT,
        metric TEXT,
        reason_class TEXT,
        action TEXT,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    "CREATE INDEX findings_host ON findings(host)",
)

_V2 = (
    """CREATE TABLE fabric_scans (
        id INTEGER PRIMARY KEY,
        scan_key TEXT NOT NULL UNIQUE,
        source TEXT NOT NULL,
        scanned_at REAL,
        added_at REAL NOT NULL,
        cables INTEGER NOT NULL
    )""",
    """CREATE TABLE cable_findings (
        scan_id INTEGER NOT NULL REFERENCES fabric_scans(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        cable TEXT NOT NULL,
        kind TEXT NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (scan_id, seq)
    )""",
    "CREATE INDEX cable_findings_cable ON cable_findings(cable)",
)
"""Version 2: `gpucluster fabric scan` results, one row per scan and one per finding, keyed by the
cable (both ends, sorted) so that `gpucluster history cables` finds the ones that keep failing."""

MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2)
"""``MIGRATIONS[i]`` brings a store of version ``i`` to version ``i + 1`` (version 0: a new file).
Append a tuple for a new version; never edit a released one."""

SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(GpuClusterError):
    """The history store cannot be opened, read or appended to."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    run_id: int
    added: bool
    """False when the same run (its started_at, host and profile) was in the store already."""
    measurements: int = 0

    def sentence(self, db: Path) -> str:
        if not self.added:
            return f"history {db}: this run is stored already (run #{self.run_id})"
        return f"history {db}: appended run #{self.run_id} ({self.measurements} measurements)"


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run as the store holds it (the summary columns; `HistoryStore.results` has the rest)."""

    id: int
    source: str
    started_at: float | None
    profile: str | None
    hosts: tuple[str, ...]
    tests_failed: int
    tests_total: int
    checks_failed: int

    @property
    def healthy(self) -> bool:
        """No test failed and no check missed its threshold."""
        return self.tests_failed == 0 and self.checks_failed == 0


class HistoryStore:
    """An open history store (`open`); use it as a context manager or `close` it."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection

    @classmethod
    def open(cls, path: Path | str, *, create: bool = True) -> HistoryStore:
        """Open (and with ``create``, create) the store at ``path``, migrated to `SCHEMA_VERSION`."""
        path = Path(path).expanduser()
        if not create and not path.is_file():
            raise HistoryError(f"no history store at {path} (a run with --gpucluster-history creates one)")
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"cannot create the directory of {path}: {exc.strerror or exc}") from None
        try:
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute("PRAGMA synchronous = FULL")
            store = cls(path, connection)
            store._migrate()
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{path} is not a readable history store: {exc}") from None
        return store

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    @property
    def version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything in it lands, or nothing does."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise HistoryError(
                f"{self.path}: could not lock the store for writing within {BUSY_TIMEOUT_S:g} s ({exc}); "
                "another run may be appending, or a process holds the file open"
            ) from None
        try:
            yield self._db
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:  # a full disk, an I/O error: nothing of this transaction lands
            self._rollback()
            raise HistoryError(f"{self.path}: the write was rolled back: {exc}") from None
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _migrate(self) -> None:
        version = self.version
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"{self.path} has history schema version {version}; this pytest-gpucluster knows up to "
                f"{SCHEMA_VERSION} (upgrade the plugin to use this store)"
            )
        if version == SCHEMA_VERSION:
            return
        with self._write() as db:
            version = self.version  # another process may have migrated while this one waited
            for step in MIGRATIONS[version:]:
                for statement in step:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------------------ writing

    def append(self, run: RunResults) -> AppendResult:
        """Store ``run`` (and its findings) in one transaction; a run already stored (same key) is
        not added twice."""
        rows = run_rows(run)
        with self._write() as db:
            found = db.execute("SELECT id FROM runs WHERE run_key = ?", (rows.run_key,)).fetchone()
            if found is not None:
                return AppendResult(int(found[0]), added=False)
            run_id = self._insert(db, rows)
        return AppendResult(run_id, added=True, measurements=len(rows.measurements))

    def append_fabric_scan(
        self,
        scan_key: str,
        source: str,
        scanned_at: float | None,
        cables: int,
        findings: Sequence[tuple[str, str, str]],
    ) -> AppendResult:
        """Store one fabric scan's findings, each (cable, kind, line); a scan stored already is not added twice."""
        import time

        with self._write() as db:
            found = db.execute("SELECT id FROM fabric_scans WHERE scan_key = ?", (scan_key,)).fetchone()
            if found is not None:
                return AppendResult(int(found[0]), added=False)
            cursor = db.execute(
                "INSERT INTO fabric_scans (scan_key, source, scanned_at, added_at, cables) VALUES (?,?,?,?,?)",
                (scan_key, source, scanned_at, time.time(), cables),
            )
            scan_id = int(cursor.lastrowid or 0)
            db.executemany(
                "INSERT INTO cable_findings (scan_id, seq, cable, kind, line) VALUES (?,?,?,?,?)",
                ((scan_id, seq, *row) for seq, row in enumerate(findings)),
            )
        return AppendResult(scan_id, added=True, measurements=len(findings))

    @staticmethod
    def _insert(db: sqlite3.Connection, rows: RunRows) -> int:
        cursor = db.execute(
            "INSERT INTO runs (run_key, source, started_at, added_at, profile, hosts, tests_failed, "
            "tests_total, checks_failed, results_schema, header) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            rows.run,
        )
        run_id = int(cursor.lastrowid or 0)
        db.executemany(
            "INSERT INTO measurements (run_id, seq, key, metric, host, component, value, unit, threshold, "
            "verdict, test_id, attempt, data) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            ((run_id, seq, *row) for seq, row in enumerate(rows.measurements)),
        )
        db.executemany(
            "INSERT INTO outcomes (run_id, seq, test_id, outcome, category, duration_s, message) "
            "VALUES (?,?,?,?,?,?,?)",
            ((run_id, seq, *row) for seq, row in enumerate(rows.outcomes)),
        )
        db.executemany(
            "INSERT INTO findings (run_id, seq, host, component, metric, reason_class, action, data) "
            "VALUES (?,?,?,?,?,?,?,?)",
            ((run_id, seq, *row) for seq, row in enumerate(rows.findings)),
        )
        return run_id

    # ------------------------------------------------------------------------------ reading

    def runs(self, last: int | None = None) -> list[StoredRun]:
        """The stored runs, oldest first (by start time, then by when they were added); ``last``:
        only the newest that many."""
        query = (
            "SELECT id, source, started_at, profile, hosts, tests_failed, tests_total, checks_failed "
            "FROM runs ORDER BY COALESCE(started_at, added_at) DESC, id DESC"
        )
        params: Sequence[Any] = ()
        if last is not None:
            query += " LIMIT ?"
            params = (last,)
        rows = self.query(query, params)
        return [
            StoredRun(r[0], r[1], r[2], r[3], tuple(json.loads(r[4])), r[5], r[6], r[7])
            for r in reversed(rows)
        ]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only query (the analyses in ``history/`` use it)."""
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.path} cannot be read: {exc}") from None

    def results(self, run_id: int) -> RunResults:
        """A stored run as `RunResults` again (measurements, outcomes and header), for the gate."""
        found = self.query("SELECT source, header FROM runs WHERE id = ?", (run_id,))
        if not found:
            raise HistoryError(f"{self.path} holds no run #{run_id}")
        source, header_text = found[0]
        measurements = [
            json.loads(data)
            for (data,) in self.query(
                "SELECT data FROM measurements WHERE run_id = ? ORDER BY seq", (run_id,)
            )
        ]
        outcomes = [
            {"test_id": r[0], "outcome": r[1], "category": r[2], "duration_s": r[3], "message": r[4]}
            for r in self.query(
                "SELECT test_id, outcome, category, duration_s, message FROM outcomes WHERE run_id = ? "
                "ORDER BY seq",
                (run_id,),
            )
        ]
        data = {**json.loads(header_text), "measurements": measurements, "outcomes": outcomes}
        return RunResults.from_json(data, f"history run #{run_id} ({source})")

    def integrity(self) -> str:
        """SQLite's own check of the file: ``ok``, or what is broken."""
        return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])
