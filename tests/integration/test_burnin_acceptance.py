"""``pytest acceptance/ -m burnin`` as a user runs it, on this machine's 2 local ranks.

One run of acceptance/test_burnin.py under a strict profile (an impossible CPU matmul floor) with
``--gpucluster-drain`` and a stand-in ``scontrol`` on PATH that records its arguments: the per-rank
CPU checks run on both ranks and fail, naming rank and host; the injected straggler is named with
its rank and host; suspects.json holds the failing node. Every rank misses the floor alike, so the
run's findings call it ``threshold; rerun`` (the profile's number, not a node), and the drain list
follows the findings (ARCHITECTURE: one judgement): the suspects stay listed, nothing is drained,
scontrol is never called. (A drain command reaching scontrol as one argv: tests/unit/test_drain.py;
a suspect that drains: tests/unit/test_drain_judged.py.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

REPO = Path(__file__).resolve().parents[2]
STRICT = """\
name: cpu-burnin-strict
description: cpu-local with a CPU matmul floor no CPU meets (tests the burn-in failure path)
extends: cpu-local
burnin:
  min_cpu_matmul: 1000TFLOP/s   # ~30000x what a CI core does: every rank fails
  min_cpu_memory_bandwidth: 1MB/s  # opened wide: on a loaded machine the 5 GB/s floor failed too
"""
# The straggler checks keep cpu-local's settings (a 3x slower rank, 1 ms of lag): measured with two
# busy loops beside this test (load average 6-8, 3 runs) the two ranks' matmul times were 1.06-1.32x
# apart, the healthy ranks' collective lag 1.5-4.7 us and the injected rank's 20.1-20.3 ms, so no
# healthy rank is named a straggler and the injected one always is.
FAKE_SCONTROL = """\
#!/bin/sh
# Records each invocation's arguments, one per line, then a separator.
for arg in "$@"; do printf '%s\\n' "$arg" >> "$SCONTROL_LOG"; done
printf -- '--\\n' >> "$SCONTROL_LOG"
echo "pretend-drained"
"""


def test_burnin_run_checks_each_rank_names_the_injected_straggler_and_drains_what_its_findings_drain(
    tmp_path: Path,
) -> None:
    thresholds = tmp_path / "thresholds"
    thresholds.mkdir()
    (thresholds / "cpu-burnin-strict.yaml").write_text(STRICT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL)
    scontrol.chmod(0o755)
    log = tmp_path / "scontrol.log"
    results = tmp_path / "results"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SCONTROL_LOG": str(log),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    argv = [
        sys.executable, "-m", "pytest", "acceptance/test_burnin.py", "-m", "burnin", "-p", "no:cacheprovider",
        "-rs", "--hw", "cpu-burnin-strict", "--thresholds-dir", str(thresholds),
        f"--results-dir={results}", "--gpucluster-drain",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    host = socket.gethostname()

    assert proc.returncode == 1, out
    # Per-rank CPU checks on both ranks, each named.
    assert f"rank 0 on {host}: CPU float32 matmul" in out, out
    assert f"rank 1 on {host}: CPU float32 matmul" in out, out
    # One failure listing both ranks' misses, each with its profile key.
    assert out.count("burnin.cpu_matmul (host=") >= 2 and "expected at least" in out
    assert "threshold from profile cpu-burnin-strict: burnin.min_cpu_matmul" in out
    # The injected straggler (the last rank) is named with its host, and it passed.
    assert f"burn-in self-test: suspect rank 1 on {host}: time outside the all_reduce per iteration" in out
    outcomes = {
        o["test_id"].rpartition("::")[2]: o["outcome"]
        for o in json.loads((results / "results.json").read_text())["outcomes"]
    }
    assert outcomes["test_injected_straggler_is_named"] == "passed", outcomes
    assert outcomes["test_rank_health_cpu"] == "failed"
    assert outcomes["test_collective_stragglers"] == "passed"
    # The slow pairwise part is skipped on one node, saying why.
    assert "needs multi-node: the cluster has 1 node" in out

    suspects = json.loads((results / "suspects.json").read_text())["suspects"]
    assert [(s["node"], s["rank"], s["check"]) for s in suspects] == [
        (host, 0, "health"),
        (host, 1, "health"),
    ]
    assert all(s["evidence"]["metric"] == "burnin.cpu_matmul" for s in suspects)

    # The findings judge the misses: every rank alike is the threshold's, so the drain list drains nothing.
    data = json.loads((results / "results.json").read_text())
    matmul = [f for f in data["findings"] if f["metric"] == "burnin.cpu_matmul"]
    assert matmul and {(f["host"], f["reason"], f["action"]) for f in matmul} == {
        (host, "threshold", "rerun")
    }
    drain = json.loads((results / "suspects.json").read_text())
    assert drain["drain_commands"] == [] and not any(s["drained"] for s in drain["suspects"])
    assert all(s["judged"].startswith("threshold; rerun") for s in drain["suspects"])
    assert "burn-in: the run's findings decide at the end of the session which hosts are drained" in out
    assert "drain (--gpucluster-drain): no host to drain" in out
    assert not log.exists() or not log.read_text().strip(), log.read_text()
