"""Readings handed from one test to a later one through the results directory
(`results/handoff.py`), and the pairwise burn-in's join with the fabric model (`fabric_join`):
another process's record is read, another run's is not, a before test that is not in the run or
left no reading gives a sentence for the NOT MEASURED instead of a silent None."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from test_fabric_path import HOSTS, MODEL, runner

from pytest_gpucluster.burnin.pairwise import localize
from pytest_gpucluster.checks.burnin.fabric_path import fabric_join
from pytest_gpucluster.fabric_scan import model_of_record
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.handoff import Absent, Handoff, await_handoff, read_handoff, write_handoff
from pytest_gpucluster.results.model import Measurement

TAG = "vm:100:1.0"
WRITER = "test_fabric_before"


def test_a_reading_written_by_another_process_is_read_and_another_runs_is_not(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pytest_gpucluster.results.handoff import write_handoff; "
        "write_handoff(Path(sys.argv[1]), 'ports', sys.argv[2], 'acceptance/t.py::test_fabric_before', "
        "[{'node': 'n1', 'ports': 3}])"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), TAG], check=True, timeout=60)
    got = read_handoff(tmp_path, "ports", TAG, WRITER)
    assert isinstance(got, Handoff) and got.value == [{"node": "n1", "ports": 3}]
    assert got.written_by == "acceptance/t.py::test_fabric_before" and got.pid > 0
    assert read_handoff(tmp_path, "ports", "vm:200:2.0", WRITER) is None  # a reused results directory
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temp file left


def test_a_before_test_that_is_not_in_the_run_is_said_at_once() -> None:
    got = await_handoff(Path("/nonexistent"), "ports", TAG, WRITER, selected=False, deadline_s=600)
    assert isinstance(got, Absent)
    assert got.why.startswith("test_fabric_before is not among this run's tests (deselected")


def test_a_selected_before_test_is_waited_for_until_its_record_or_the_deadline(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 3.0:  # the other worker's test_fabric_before finishes 3 s into the wait
            write_handoff(tmp_path, "ports", TAG, "w::test_fabric_before", {"n": 1})

    got = await_handoff(
        tmp_path, "ports", TAG, WRITER, selected=True, deadline_s=10, clock=lambda: now[0], sleep=sleep
    )
    assert isinstance(got, Handoff) and got.value == {"n": 1} and now[0] == 3.0

    now[0] = 0.0
    late = await_handoff(
        tmp_path, "scan", TAG, WRITER, selected=True, deadline_s=10, clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )  # fmt: skip
    assert isinstance(late, Absent) and "left no record" in late.why and "within 10 s" in late.why


def test_a_before_test_that_failed_or_skipped_says_so_and_a_damaged_file_names_itself(tmp_path: Path) -> None:
    write_handoff(
        tmp_path, "ports", TAG, "w::test_fabric_before", missing="test_fabric_before failed: job 7 hung"
    )
    got = await_handoff(tmp_path, "ports", TAG, WRITER, selected=True, deadline_s=600)
    assert isinstance(got, Absent)
    assert got.why == "test_fabric_before recorded no reading: test_fabric_before failed: job 7 hung"
    (tmp_path / "scan.json").write_text("{half")
    bad = read_handoff(tmp_path, "scan", TAG, WRITER)
    assert isinstance(bad, Absent) and str(tmp_path / "scan.json") in bad.why and "cannot be read" in bad.why


UNDER = {"gpu-node-005", "gpu-node-006"}


def test_the_join_names_the_leaf_with_a_model_and_is_not_measured_without_a_record() -> None:
    slow = localize(HOSTS, runner(lambda a, b: bool(UNDER & {a, b})), tolerance=0.25)
    record = json.loads(json.dumps({"model": MODEL.to_json(), "why": None}))  # as the file holds it
    model, why = model_of_record(record)
    assert model is not None and why is None
    joined = fabric_join(model, slow)
    assert joined.path is not None and joined.path.verdict.element == "leaf leaf-r0-03"
    assert joined.line.startswith("fabric localization: pairs joined with the before-scan's model (8 HCA(s)")
    assert joined.not_measured is None

    none = fabric_join(None, slow, unreachable="InfiniBand fabric scan skipped: not installed: ibnetdiscover")
    assert none.path is None and none.not_measured is None
    assert "no fabric model (InfiniBand fabric scan skipped" in none.line

    gap = fabric_join(None, slow, missing="test_fabric_before is not among this run's tests")
    check = gap.not_measured
    assert (
        gap.path is None and check is not None and math.isnan(check.value) and check.problem == "not measured"
    )
    assert "3 slow pair(s)" in check.hint and "test_fabric_before is not among this run's tests" in check.hint
    (finding,) = findings_of([Measurement.of(check, test_id="t", time=0.0)])
    assert (finding.reason, finding.action) == ("not measured", "rerun")

    healthy = localize(HOSTS, runner(lambda a, b: False), tolerance=0.25)
    quiet = fabric_join(None, healthy, missing="test_fabric_before is not among this run's tests")
    assert (
        quiet.not_measured is None and "no fabric before-scan: test_fabric_before is not among" in quiet.line
    )


def test_a_not_measured_join_is_a_finding_of_its_own_beside_the_nodes_the_pairs_named() -> None:
    """As test_pairwise_localization records it: the NOT MEASURED first, then the pairs' counts, the
    nodes as suspects. The gap is not swallowed as the count the suspects explain."""
    from dataclasses import replace

    from pytest_gpucluster.checks.burnin.peers import pairwise_checks

    test = "acceptance/test_burnin.py::test_pairwise_localization"
    slow = localize(HOSTS, runner(lambda a, b: bool(UNDER & {a, b})), tolerance=0.25)
    gap = fabric_join(None, slow, missing="test_fabric_before is not among this run's tests").not_measured
    assert gap is not None
    checks = [gap, *pairwise_checks(slow, 6)]
    found = findings_of(
        [Measurement.of(c, test_id=test, time=0.0) for c in checks],
        suspects=[replace(s, source=test) for s in slow.suspects],
    )
    mine = [(f.metric, f.reason, f.action, f.host) for f in found]
    assert ("fabric.ib.path", "not measured", "rerun", None) in mine
    nodes = sorted(f.host for f in found if f.reason == "hardware")
    assert nodes == sorted(UNDER) and all(f.metric != "fabric.ib.path" for f in found if f.host)
