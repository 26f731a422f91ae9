"""``pytest acceptance/test_numerics.py`` as a user runs it, on this machine's 2 local ranks.

One real run under a copy of cpu-local whose FLOP/s floors are opened (`open_gates`: this test is
about what is recorded and named, never about this machine's speed; under load the fp32 floor has
only 3x margin): every verdict passes per rank and dtype, results.json holds the ``numerics.*``
measurements of each rank and dtype (agreement, stability, known answer, FLOP/s with its spread), and the injected-corruption self-test names the rank that flipped a bit, with its
host and dtype; the self-test is never written to the drain list.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from open_gates import open_gates_profile

from pytest_gpucluster.launch import get_launcher

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

REPO = Path(__file__).resolve().parents[2]


def test_numerics_run_records_each_rank_and_dtype_and_names_the_injected_corruption(tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    argv = [
        sys.executable, "-m", "pytest", "acceptance/test_numerics.py", "-p", "no:cacheprovider", "-rs",
        "--hw", str(open_gates_profile(tmp_path / "profiles")), f"--results-dir={results}",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    host = socket.gethostname()
    assert proc.returncode == 0, out

    data = json.loads((results / "results.json").read_text())
    outcomes = {o["test_id"].rpartition("::")[2]: o["outcome"] for o in data["outcomes"]}
    assert outcomes == {
        "test_numerics_agreement": "passed",
        "test_numerics_repeat_stability": "passed",
        "test_numerics_known_answer": "passed",
        "test_numerics_throughput": "passed",
        "test_injected_corruption_is_named": "passed",
    }
    measured = {
        (m["metric"], m["labels"].get("rank"), m["labels"].get("dtype")): m for m in data["measurements"]
    }
    for metric in ("agreement", "repeat_stability", "known_answer", "matmul_flops"):
        for rank in (0, 1):
            for dtype in ("fp32", "bf16"):
                m = measured[(f"numerics.{metric}", rank, dtype)]
                assert m["labels"]["host"] == host
                if metric == "matmul_flops":
                    assert m["value"] > 0 and m["spread"]["n"] >= 6  # 3 seeds x 2 runs at least
                else:
                    assert m["verdict"] == "pass", m

    # The self-test: rank 1 flipped one bit of its first dtype (fp32) and only it was named.
    assert f"numerics self-test: named rank 1 on {host} fp32" in out, out
    self_test = measured[("numerics.self_test_named", 1, "fp32")]
    assert self_test["value"] == 1 and self_test["labels"]["injected"] is True
    assert json.loads((results / "suspects.json").read_text())["suspects"] == []
