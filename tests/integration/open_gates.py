"""A copy of cpu-local whose speed gates no working machine misses, for tests about something else.

A test that runs the real suite to check plumbing (a plan, a health check's exit code, what a run
records) must not fail because CI's 2 cores are shared with the other xdist worker: cpu-local's
floors are calibrated so that a machine 2.5-3x slower than a quiet one fails, and a loaded CI VM
is that slow (thresholds/cpu-local.yaml: health matmul 13.7-40.6 GFLOP/s under load against a
28 GFLOP/s floor). `open_gates_profile` writes a profile that ``extends: cpu-local`` and opens
every speed gate of the quick tier and of acceptance/test_numerics.py by orders of magnitude;
what is not about speed (a rank that crashes, a wrong digest, a missing GPU) still fails as in
cpu-local. The acceptance suite in CI keeps showing that cpu-local's own floors pass.

Not for a test of the plan's numbers: estimates and deadlines are derived from the floors, so the
copy plans longer jobs than cpu-local does.
"""

from __future__ import annotations

from pathlib import Path

OPEN_GATES = """\
name: {name}
description: cpu-local with every speed gate opened (a loaded test machine meets them; the plumbing is under test)
extends: cpu-local
collectives:
  checks:  # replaces cpu-local's list: intra-node busbw only, no latency ceiling
    - {{collective: all_reduce, scope: intra-node, size: 16MiB, min_busbw: 0.001GB/s,
       source: "opened: ~500x below a loaded 2-core VM"}}
burnin:
  min_cpu_matmul: 0.1GFLOP/s          # loaded VM 13.7-40.6 GFLOP/s per rank
  min_cpu_memory_bandwidth: 0.01GB/s  # loaded VM 1.5-4.7 GB/s per rank
numerics:
  min_flops:  # 20x and more below the loaded medians (not lower: the job's deadline is planned at the floor)
    fp32: 1GFLOP/s  # loaded VM medians 20.9-73.4 GFLOP/s
    bf16: 1GFLOP/s  # loaded VM medians 138-165 GFLOP/s
"""


def open_gates_profile(directory: Path, name: str = "cpu-local-open") -> Path:
    """Write the profile ``name`` into ``directory`` (for ``--thresholds-dir``); its path (for ``--hw``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(OPEN_GATES.format(name=name), encoding="utf-8")
    return path
