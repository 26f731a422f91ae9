"""Pins each rank to a core and runs it SCHED_FIFO: the quiet-machine condition of the side-by-side
benchmarks on a small CPU machine.

Python imports ``sitecustomize`` at start-up from ``sys.path``. The benchmarks put this folder on
``PYTHONPATH`` for both sides of a comparison (``sides.rank_sched_env``), so the harness's ranks
and the reference's ranks start under the same scheduling without either side's code knowing.
Only rank processes change: torchrun sets ``LOCAL_RANK`` for its workers, not for its agent, the
benchmark driver or anything else started with this path.

Why: on a 2-vCPU VM a gloo collective moves +-30% from one job to the next when the scheduler
shares the cores between the two ranks, their gloo threads, torchrun's agent and the driver.
Pinned (rank i on core i) and real-time, a rank is never preempted by the agent's monitor loop
or the driver, and a 16 MiB collective repeated within a job varies by 2-3% (was 6-9%).

What it does, nothing else: ``sched_setaffinity`` to core ``LOCAL_RANK mod cores`` and
``SCHED_FIFO`` at priority ``GPUCLUSTER_BENCH_FIFO_PRIORITY`` (default 10) for the process (the
threads it starts inherit both). The kernel's RT throttling (``sched_rt_runtime_us``, 95% by
default) still leaves the rest of the system 5% of each core. Where the process may not (not
root, no CAP_SYS_NICE), it says so on stderr and exits 3: the two sides must run alike or not at
all. Then a ``sitecustomize`` further down ``sys.path`` runs, as it would have without this one.

Standard library only; imports nothing from ``pytest_gpucluster``.
"""

from __future__ import annotations

import os
import sys


def _apply() -> None:
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or not local_rank.isdigit():
        return
    cores = sorted(os.sched_getaffinity(0))
    core = cores[int(local_rank) % len(cores)]
    priority = int(os.environ.get("GPUCLUSTER_BENCH_FIFO_PRIORITY", "10"))
    try:
        os.sched_setaffinity(0, {core})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        sys.stderr.write(
            f"rank_sched/sitecustomize.py: rank {local_rank} could not pin to core {core} and run"
            f" SCHED_FIFO {priority}: {exc}; run the benchmark as root (or with CAP_SYS_NICE),"
            " or with --rank-sched none\n"
        )
        sys.stderr.flush()
        os._exit(3)


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path``, the one this file shadows."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == here:
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_apply()
_chain()
