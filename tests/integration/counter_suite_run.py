"""acceptance/test_burnin.py's ECC/XID counter readings run as a user runs them, on this machine's
two stand-in GPUs, one of which may fall off the bus between the readings.

There is no GPU here, so the node is described to the stand-in NVML (`standin_pynvml`: two H200s
with their PCI addresses) and a launched rank's torch sees the same two GPUs
(`cuda_torch_standin_ranks`, through ``standin_site``); everything else is the suite's own: the
per-node probe reads NVML and ``--hw=auto`` picks the H200 profile, the counter jobs' ranks
(workloads/health.py) find their GPU in NVML by PCI bus id, test_counters_after compares the
readings (checks/burnin/lost.py), and the run writes its findings, suspects and sign-off.
Used by tests/integration/test_lost_gpu_suite.py and benchmarks/fault_campaign.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from standin_pynvml import env as nvml_env
from standin_pynvml import gpus, write_node

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
BUSES = ("00000000:18:00.0", "00000000:2A:00.0")
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_", "NCCL_", "CUDA_VISIBLE")


@dataclass(frozen=True)
class CounterRun:
    results: Path
    """The run's results directory (results.json, suspects.json, jobs/)."""
    data: dict | None
    """results.json, or None when the run wrote none (see ``out``)."""
    out: str


def counter_run(work: Path, *, lose: str | None) -> CounterRun:
    """``pytest acceptance/test_burnin.py -k 'counters_before or counters_after' --hw=auto`` here;
    ``lose``: the bus id that falls off the bus right after test_counters_before passes."""
    host = socket.gethostname()
    write_node(work / f"nvml-{host}.json", gpus(BUSES))
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    env |= nvml_env(work / "nvml-{host}.json", [HERE / "standin_site", HERE, REPO])
    env |= {"GPUCLUSTER_STANDIN_CUDA": "1", "GPUCLUSTER_STANDIN_CUDA_RANKS": "1"}
    if lose:
        env["GPUCLUSTER_STANDIN_LOSE"] = f"test_counters_before={lose}"
    results = work / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/test_burnin.py", "-k", "counters_before or counters_after",
         "--hw=auto", f"--results-dir={results}", "-p", "cuda_torch_standin", "-p", "standin_pynvml",
         "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    path = results / "results.json"
    data = json.loads(path.read_text()) if path.exists() else None
    return CounterRun(results, data, done.stdout + done.stderr)
