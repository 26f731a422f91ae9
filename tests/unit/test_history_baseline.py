"""--baseline history:N on recorded real runs: per value the median of the last N runs healthy for
it, its interval the range of theirs; a healthy run passes the gate, a slow rank regresses."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from history_runs import HEALTHY, SLOW_RANK, real_run

from pytest_gpucluster.options.gate import HistoryRuns, _baseline
from pytest_gpucluster.results.baseline import compare_runs, settings_of
from pytest_gpucluster.results.gate import latest_by_key
from pytest_gpucluster.results.history.baseline import history_baseline
from pytest_gpucluster.results.history.store import HistoryError, HistoryStore

T0 = 1_800_000_000.0


def _store(tmp_path, names):
    store = HistoryStore.open(tmp_path / "h.db")
    for i, name in enumerate(names):
        store.append(dataclasses.replace(real_run(name), started_at=T0 + i))
    return store


def test_history_n_parses_and_a_path_stays_a_path():
    assert _baseline("history:5") == HistoryRuns(5) and str(HistoryRuns(5)) == "history:5"
    assert str(_baseline("runs/a/results.json")) == "runs/a/results.json"
    for bad in ("history:", "history:0", "history:five"):
        with pytest.raises(ValueError, match="expected history:N"):
            _baseline(bad)


def test_each_value_is_the_median_of_the_last_n_healthy_runs(tmp_path):
    # oldest first: healthy_1, a slow-rank run, healthy_2..4, another slow-rank run (newest)
    names = [HEALTHY[0], SLOW_RANK[0], *HEALTHY[1:], SLOW_RANK[1]]
    with _store(tmp_path, names) as store:
        found = history_baseline(store, 3, profile="cpu-local")
    runs = {n: latest_by_key(real_run(n).measurements) for n in names}
    slow_newest = runs[SLOW_RANK[1]]
    by_key = {m.key: m for m in found.results.measurements}
    checked = set()
    for key, m in by_key.items():
        named_vm = "host=vm" in key
        failed_there = real_run(SLOW_RANK[1]).outcomes
        test_failed = any(
            o.test_id == slow_newest[key].test_id and o.outcome == "failed" for o in failed_there
        )
        # the slow-rank runs named vm (findings) or failed this test: the three healthy runs before;
        # else its test passed in the newest run too, which counts
        sources = HEALTHY[1:] if named_vm or test_failed else (HEALTHY[2], HEALTHY[3], SLOW_RANK[1])
        values = [runs[n][key].value for n in sources]
        assert m.value == pytest.approx(statistics.median(values)), key
        assert m.spread is not None and m.spread.n == 3
        assert m.spread.min <= min(values) and m.spread.max >= max(values)
        checked.add("vm" if named_vm else "failed test" if test_failed else "passed test")
    assert checked == {"vm", "failed test", "passed test"}
    assert "burnin.cpu_matmul|" in " ".join(k for k in by_key if "rank=1" in k)
    assert found.runs_used == (3, 4, 5, 6)
    assert found.summary() == "median of the last 3 healthy runs per value (runs #3, #4, #5, #6)"


def test_short_history_says_so_and_an_empty_one_is_an_error(tmp_path):
    with _store(tmp_path, [HEALTHY[0], SLOW_RANK[0]]) as store:
        found = history_baseline(store, 5, profile="cpu-local")
        assert found.fewest == 1 and "some values from only 1" in found.summary()
        with pytest.raises(HistoryError, match="no healthy run of profile h100"):
            history_baseline(store, 5, profile="h100")


def test_the_gate_passes_a_healthy_run_and_names_the_slow_rank(tmp_path):
    with _store(tmp_path, HEALTHY[:3]) as store:
        baseline = history_baseline(store, 3, profile="cpu-local").results
    healthy = real_run(HEALTHY[3])
    tolerances, _ = settings_of(healthy)
    judged = compare_runs(baseline, healthy, tolerances)
    assert judged.regressions == ()
    assert sum(c.status in ("ok", "improved") for c in judged.changes) >= 4  # gated values were compared
    slow = real_run(SLOW_RANK[0])
    regressed = {
        (c.metric, c.labels.get("rank")) for c in compare_runs(baseline, slow, tolerances).regressions
    }
    assert ("burnin.cpu_matmul", 1) in regressed
    assert not any(rank == 0 for _, rank in regressed)
