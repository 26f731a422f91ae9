"""How the two sides of a benchmark are launched.

- The reference: a script under ``benchmarks/reference/`` started by plain
  ``python -m torch.distributed.run --standalone --nproc-per-node=N script ...`` — what a user
  types, with nothing of this package on the way (:func:`run_plain_torchrun`).
- The harness: the acceptance path, ``Cluster.run`` of a workload on a local `Cluster`, built as
  the plugin's session builds it for ``--hw=cpu-local`` (:func:`local_cluster`).

Both are timed with the same clock around the whole job, start to exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE_DIR", "REPO", "local_cluster", "run_plain_torchrun", "torchrun_argv"]

REPO = Path(__file__).resolve().parents[1]
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


def torchrun_argv(script: Path, nproc: int, args: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script),
        *args,
    ]


def run_plain_torchrun(
    script: Path,
    nproc: int,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> float:
    """Run the reference job; its wall time in seconds. SystemExit with the end of its output
    when it fails or overruns (a benchmark cannot go on without its reference)."""
    argv = torchrun_argv(script, nproc, args)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(
            f"the reference job {script.name} ran past {timeout_s:.0f} s: {' '.join(argv)}"
        ) from exc
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise SystemExit(f"the reference job failed (exit code {done.returncode}): {' '.join(argv)}\n{tail}")
    return elapsed


def local_cluster(nproc: int, backend: str, results_dir: Path) -> Any:
    """The `Cluster` the plugin builds for a one-node session (torchrun launcher)."""
    from pytest_gpucluster.cluster.spec import ClusterSpec
    from pytest_gpucluster.launch import get_launcher
    from pytest_gpucluster.launch.job import Cluster

    return Cluster(ClusterSpec.from_local(nproc, backend=backend), get_launcher("torchrun"), results_dir)
