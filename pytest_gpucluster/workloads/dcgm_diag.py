"""Rank side: run ``dcgmi diag -r <level> -j`` on this node and hand back what it printed.

Workload ``pytest_gpucluster.workloads.dcgm_diag:diag``, one rank per node (no process group).
Options: ``level`` (1-4), ``timeout_s``, ``dcgmi`` (the program, default ``dcgmi`` on PATH).

Where ``dcgmi`` is not on PATH the value says so (``available: False`` and why) instead of
raising: the parent decides whether a node without DCGM is a skip (no node has it) or a finding
(others have it). ``dcgmi`` exits non-zero when a test fails (226 on DCGM 4.x), so its exit code
is reported, not judged; parsing the JSON is the parent's job (``parsers/dcgm_diag.py``).
The command is an argv list; nothing goes through a shell.

Standard library only, and the job runs with ``pick_device=False`` and no process group: the rank
imports no torch and holds no CUDA context, so ``dcgmi diag`` has every GPU to itself (under
``EXCLUSIVE_PROCESS`` compute mode a context of ours on GPU 0 fails DCGM's test of GPU 0). The
value says whether torch was loaded in the rank (``torch_in_rank``), for the test that holds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from typing import Any

__all__ = ["MAX_OUTPUT", "diag", "diag_argv"]

MAX_OUTPUT = 2_000_000
"""Characters of stdout kept (a level-4 JSON of 8 GPUs is well under 1 MB)."""


def diag_argv(dcgmi: str, level: int) -> list[str]:
    if not 1 <= level <= 4:
        raise ValueError(f"dcgmi diag level must be 1 to 4, got {level}")
    return [dcgmi, "diag", "-r", str(level), "-j"]


def diag(ctx: Any) -> dict[str, Any]:
    """This node's ``dcgmi diag`` output, or why there is none (see the module doc)."""
    options = ctx.options
    program = str(options.get("dcgmi", "dcgmi"))
    found = shutil.which(program)
    base = {"host": ctx.host, "rank": ctx.rank, "torch_in_rank": "torch" in sys.modules}
    if found is None:
        return {
            **base,
            "available": False,
            "reason": f"'{program}' is not on PATH on {ctx.host} (DCGM is not installed there)",
        }
    argv = diag_argv(found, int(options.get("level", 2)))
    timeout = float(options.get("timeout_s", 1200.0))
    ctx.progress(f"# dcgmi diag -r {argv[3]} on {ctx.host} (up to {timeout:.0f} s)")
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return {
            **base,
            "available": True,
            "argv": argv,
            "returncode": None,
            "stdout": out[-MAX_OUTPUT:],
            "stderr": "",
            "seconds": time.monotonic() - start,
            "error": f"'{' '.join(argv)}' did not finish within {timeout:.0f} s",
        }
    return {
        **base,
        "available": True,
        "argv": argv,
        "returncode": done.returncode,
        "stdout": done.stdout[-MAX_OUTPUT:],
        "stderr": done.stderr[-4000:],
        "seconds": time.monotonic() - start,
    }
