"""The history store under a real SIGKILL and under two runs appending at once.

A child process appends a large run (a real run's measurements, repeated so that the transaction
outgrows SQLite's page cache and spills into the database file) and is killed with SIGKILL once
its rollback journal exists and the file has grown: the store must open, pass SQLite's integrity
check, hold every earlier run whole and nothing of the killed one, and take the next append.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from history_runs import DATA, HEALTHY, real_run

from pytest_gpucluster.results.history.store import HistoryStore

REPO = Path(__file__).resolve().parents[2]

APPEND = textwrap.dedent(
    """
    import dataclasses, sys, time
    from pathlib import Path
    from pytest_gpucluster.results.baseline import read_results
    from pytest_gpucluster.results.history.store import HistoryStore

    db, source, copies, started_at, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    ready = sys.argv[6]
    run = read_results(Path(source))
    big = dataclasses.replace(run, started_at=started_at, measurements=run.measurements * copies)
    store = HistoryStore.open(db)
    if ready:
        Path(ready).touch()
    while go and not Path(go).exists():
        time.sleep(0.001)
    began = time.time()
    result = store.append(big)
    print(began, time.time(), result.run_id, len(big.measurements), flush=True)
    """
)


def _child(
    db: Path, source: str, copies: int, started_at: float, go: str = "", ready: str = ""
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", APPEND, str(db), str(DATA / f"{source}.json"), str(copies), str(started_at)]
    argv += [go, ready]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_append_leaves_every_earlier_run(tmp_path):
    db = tmp_path / "history.db"
    earlier = [real_run(name) for name in HEALTHY[:3]]
    with HistoryStore.open(db) as store:
        for run in earlier:
            store.append(run)
    size_before = db.stat().st_size
    journal = db.with_name(db.name + "-journal")
    child = _child(db, HEALTHY[3], 3000, started_at=2e9)
    deadline = time.monotonic() + 120
    killed_mid_append = False
    while time.monotonic() < deadline and child.poll() is None:
        if journal.exists() and db.stat().st_size > size_before:
            child.send_signal(signal.SIGKILL)
            killed_mid_append = True
            break
        time.sleep(0.001)
    child.wait(timeout=30)
    assert killed_mid_append, f"the append finished before it could be killed: {child.communicate()}"
    assert child.returncode == -signal.SIGKILL
    assert journal.exists(), "a killed transaction leaves its hot journal behind"
    with HistoryStore.open(db) as store:
        assert store.integrity() == "ok"
        runs = store.runs()
        assert [r.source for r in runs] == [r.source for r in earlier]
        for stored, run in zip(runs, earlier, strict=True):
            back = store.results(stored.id)
            assert [m.to_json() for m in back.measurements] == [m.to_json() for m in run.measurements]
        assert store.query("SELECT COUNT(*) FROM measurements") == [
            (sum(len(r.measurements) for r in earlier),)
        ]
        assert store.append(dataclasses.replace(real_run(HEALTHY[3]), started_at=2e9)).added


def test_two_runs_appending_at_once_both_land(tmp_path):
    db = tmp_path / "history.db"
    HistoryStore.open(db).close()
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    children = [
        _child(db, name, 400, started_at=2e9 + i, go=str(go), ready=str(ready[i]))
        for i, name in enumerate(HEALTHY[:2])
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both have opened the store: now they append at the same moment
    spans = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        began, ended, _run_id, count = out.split()
        spans.append((float(began), float(ended), int(count)))
    # they asked for the lock together: the second began before the first had committed
    assert max(s[0] for s in spans) < min(s[1] for s in spans)
    with HistoryStore.open(db) as store:
        assert store.integrity() == "ok"
        runs = store.runs()
        assert len(runs) == 2
        counts = store.query("SELECT run_id, COUNT(*) FROM measurements GROUP BY run_id ORDER BY run_id")
        assert sorted(c for _, c in counts) == sorted(s[2] for s in spans)
