"""--gpucluster-retest-suspects on a real cpu-local run of the burn-in health test.

The health job's rank 1 is slowed in the first job only (``tests/data/history/slow_rank_plugin.py``
with ``GPUCLUSTER_TEST_SLOW_TESTS=1``: the workload's own ``slow_ranks`` option): rank 1 misses its
CPU floors, the burn-in's suspect list names host vm, and the test runs again on vm alone. Both
measurements are in results.json (the retest's as ``attempt`` 3) and in the report. No speed is asserted: whether the unslowed retest
passes depends on the machine's load, so the test checks that the verdict follows the retest's
own values. With ``--gpucluster-drain`` (a stand-in ``scontrol`` on PATH records its calls), the
burn-in test leaves the drain to the end of the session, where the findings (after the retest)
decide: vm is drained only for a finding whose action drains it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_burnin_acceptance import FAKE_SCONTROL

from pytest_gpucluster.burnin.drain import DRAINING_ACTIONS

REPO = Path(__file__).resolve().parents[2]
TEST = "acceptance/test_burnin.py::test_rank_health_cpu"


def test_a_transient_slow_rank_is_retested_and_judged_on_the_retest(tmp_path):
    out = tmp_path / "run"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    log = tmp_path / "scontrol.log"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER_", "PYTEST_"))
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "data" / "history")]),
        GPUCLUSTER_TEST_SLOW_TESTS="1",
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        SCONTROL_LOG=str(log),
    )
    argv = [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider", "-p", "slow_rank_plugin",
            "--gpucluster-retest-suspects", "--gpucluster-drain", f"--results-dir={out}"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "retest of suspect(s) vm: running again test_rank_health_cpu" in done.stdout, done.stdout[-3000:]
    data = json.loads((out / "results.json").read_text())
    values = [
        m for m in data["measurements"] if m["metric"] == "burnin.cpu_matmul" and m["labels"]["rank"] == 1
    ]
    first, again = values[0], values[-1]
    assert first.get("attempt", 1) == 1 and first["verdict"] == "fail"  # the slowed job
    assert again["attempt"] == 3  # the retest on vm
    record = data["retest"]
    assert record["suspects"] == ["vm"] and record["tests"] == [TEST]
    assert record["tier"] == "burnin"  # the run's tier is standard: the retest takes the next longer one
    assert "with the burnin tier's durations (the run's: standard)" in done.stdout
    retested = [m for m in data["measurements"] if m.get("attempt") == 3]
    confirmed = any(m["verdict"] == "fail" and m["labels"].get("host") == "vm" for m in retested)
    assert record["confirmed"] == (["vm"] if confirmed else [])
    assert record["cleared"] == ([] if confirmed else ["vm"])
    # the drain list follows the findings (one judgement): vm is drained only if a finding drains it
    # (here, 1 of 2 ranks below a floor is "threshold; rerun" whether or not the retest confirmed it)
    drains = any(f.get("host") == "vm" and f["action"] in DRAINING_ACTIONS for f in data["findings"])
    drain = json.loads((out / "suspects.json").read_text())
    assert any(c[2] == "NodeName=vm" for c in drain["drain_commands"]) == drains
    report = (out / "report.md").read_text()
    assert "## Retest of suspects: confirmed" in report
    row = next(line for line in report.splitlines() if line.startswith("| vm | rank 1 | burnin.cpu_matmul |"))
    assert first_shown(first) in row
    # vm's finding is "threshold; rerun": its retest is that rerun, and the row and line say so
    assert record["reruns"] == ["vm"] and "the rerun its finding asked for" in row
    assert "(vm: the rerun its finding asked for, threshold; rerun)" in done.stdout
    summary = done.stdout
    assert f"retest of suspects vm: confirmed {'vm' if confirmed else 'none'}" in summary
    # nothing drained before the retest; the end of the session drained vm only if a finding drains it
    calls = [c for c in (log.read_text() if log.exists() else "").split("--\n") if c.strip()]
    assert len(calls) == (1 if drains else 0), calls
    assert ("done: scontrol update NodeName=vm State=DRAIN" in summary) == drains


def first_shown(m: dict) -> str:
    from pytest_gpucluster.results.text import format_value

    return format_value(m["value"], m["unit"])
