"""Which processes hold a GPU on this node, as NVML lists them (rank side).

`gpu_compute_processes` asks NVML, GPU by GPU, for its compute processes
(``nvmlDeviceGetComputeRunningProcesses``: every process with a CUDA context there; graphics-only
clients are not listed) and returns plain records the parent judges
(`pytest_gpucluster.cluster.gpu_occupancy`):

``{"gpu": 0, "uuid": "GPU-...", "pid": 9980, "used_bytes": 6498025472, "name": "python"}``

``used_bytes`` is None where NVML cannot tell (``NVML_VALUE_NOT_AVAILABLE``: under MIG, or
without the right to see other users' processes), ``name`` where the process name cannot be
read. Pids are as NVML sees them: the host's, even inside a container.

Without NVML (no pynvml, no driver, a CPU node) the records are empty and the second value
says why, for a skip that names what is missing. `probe` is the same as a workload, for one
rank per node. Standard library only; pynvml is imported lazily.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext
from pytest_gpucluster.workloads.nvlink_probe import load_nvml

__all__ = ["gpu_compute_processes", "probe"]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _name(nvml: Any, pid: int) -> str | None:
    try:
        return _text(nvml.nvmlSystemGetProcessName(pid))
    except Exception:  # NVMLError_NotFound (it just ended), NoPermission
        return None


def gpu_compute_processes(nvml: Any = None) -> tuple[list[dict[str, Any]], str | None]:
    """``(records, None)``, or ``([], why NVML could not be asked)``.

    ``nvml``: an initialised pynvml module (default: import and initialise it here, and shut it
    down afterwards).
    """
    owned = nvml is None
    if owned:
        nvml, why = load_nvml()
        if nvml is None:
            return [], why
    records: list[dict[str, Any]] = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(process, "usedGpuMemory", None)
                records.append(
                    {
                        "gpu": index,
                        "uuid": uuid,
                        "pid": int(process.pid),
                        "used_bytes": None if used is None else int(used),
                        "name": _name(nvml, int(process.pid)),
                    }
                )
    except Exception as exc:  # an NVML error half way: say so rather than return half a list
        return [], f"NVML could not list the GPUs' processes ({type(exc).__name__}: {exc})"
    finally:
        if owned:
            with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
                nvml.nvmlShutdown()
    return records, None


def probe(ctx: RankContext) -> dict[str, Any]:
    """A workload: this node's GPU compute processes, and this rank's own pid (not foreign)."""
    records, skipped = gpu_compute_processes()
    return {"host": ctx.host, "pid": os.getpid(), "processes": records, "skipped": skipped}
