"""How the two sides of a benchmark are launched.

- The reference: a script under ``benchmarks/reference/`` started by plain
  ``python -m torch.distributed.run --standalone --nproc-per-node=N script ...`` — what a user
  types, with nothing of this package on the way (:func:`run_plain_torchrun`).
- The harness: the acceptance path, ``Cluster.run`` of a workload on a local `Cluster`, built as
  the plugin's session builds it for ``--hw=cpu-local`` (:func:`local_cluster`).

Both are timed with the same clock around the whole job, start to exit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RANK_SCHED_CHOICES",
    "REFERENCE_DIR",
    "REPO",
    "local_cluster",
    "rank_sched",
    "run_plain_torchrun",
    "torchrun_argv",
]

REPO = Path(__file__).resolve().parents[1]
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
RANK_SCHED_DIR = Path(__file__).resolve().parent / "rank_sched"
RANK_SCHED_CHOICES = ("quiet", "none")


@contextlib.contextmanager
def rank_sched(mode: str) -> Iterator[str]:
    """Every rank either side starts inside runs as ``mode`` says; yields a line saying how.

    ``quiet``: ``rank_sched/`` goes first on this process's ``PYTHONPATH``, which both sides'
    ranks inherit (plain torchrun passes the environment on; the harness's launcher keeps it
    behind its own entry), so its ``sitecustomize.py`` pins rank i to core i and runs it
    SCHED_FIFO; and one ``keep_awake.py`` spinner per core, at SCHED_IDLE, keeps the VM's vCPUs
    from halting for the whole run. Before anything is measured one interpreter starts as a rank
    would, and the benchmark exits with the reason when that rank could not be pinned (not
    root): a benchmark whose sides ran differently would mean nothing. ``none`` changes nothing.
    """
    if mode == "none":
        yield "ranks: scheduled as the OS likes (--rank-sched none)"
        return
    if mode != "quiet":
        raise SystemExit(f"--rank-sched {mode!r}: choose from {', '.join(RANK_SCHED_CHOICES)}")
    saved = os.environ.get("PYTHONPATH")
    path = os.pathsep.join(p for p in (str(RANK_SCHED_DIR), saved or "") if p)
    probe = subprocess.run(
        [sys.executable, "-c", "pass"],
        env={**os.environ, "PYTHONPATH": path, "LOCAL_RANK": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        raise SystemExit(f"--rank-sched quiet cannot run here: {probe.stderr.strip()}")
    cores = sorted(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen([sys.executable, str(RANK_SCHED_DIR / "keep_awake.py"), str(core), str(os.getpid())])
        for core in cores
    ]
    os.environ["PYTHONPATH"] = path
    try:
        yield (
            f"ranks: rank i pinned to core i mod {len(cores)} and SCHED_FIFO (rank_sched/sitecustomize.py);"
            f" {len(cores)} SCHED_IDLE spinners keep the cores from halting (rank_sched/keep_awake.py)"
        )
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


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
