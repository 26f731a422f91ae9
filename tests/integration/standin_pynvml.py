"""The stand-in NVML (``standin_nvml/pynvml.py``) from a test's side: describe a node's GPUs, point
a process at them, and lose a GPU at a chosen moment.

- `write_node` writes the description the stand-in reads on every call;
- `env` is what a process (and the ranks it launches: the launch forwards PYTHONPATH) needs to
  import the stand-in instead of nvidia-ml-py;
- as a pytest plugin (``-p standin_pynvml``) with ``GPUCLUSTER_STANDIN_LOSE=<test name>=<bus id>``
  it marks that GPU lost right after that test's call, as a GPU falling off the bus between two
  tests would: the real suite's next reading finds it gone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

DIR = Path(__file__).parent / "standin_nvml"
"""Put first on PYTHONPATH: it holds only ``pynvml.py``."""
H200_MEMORY = 150_754_820_096
"""143771 MiB: what NVML reports as the real H200's total (tests/data/gpu_session/h200_2026_11_28)."""


def gpu(
    index: int, bus_id: str, name: str = "NVIDIA H200", memory_bytes: int = H200_MEMORY
) -> dict[str, Any]:
    return {"name": name, "uuid": f"GPU-5fa1e0c0-0000-4000-8000-{index:012x}", "bus_id": bus_id,
            "memory_bytes": memory_bytes}  # fmt: skip


def gpus(bus_ids: Sequence[str], name: str = "NVIDIA H200") -> list[dict[str, Any]]:
    return [gpu(i, bus, name) for i, bus in enumerate(bus_ids)]


def write_node(
    path: Path, gpu_list: Sequence[dict[str, Any]], *, lost: Iterable[str] = (), xid_queue: str | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"driver": "580.159.04", "cuda_driver": 13000, "gpus": list(gpu_list),
                            "lost": list(lost)}  # fmt: skip
    if xid_queue is not None:
        body["xid_queue"] = xid_queue
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1), encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file
    return path


def lose(path: Path, bus_id: str) -> None:
    """Mark one GPU of a described node lost (NVML answers GpuIsLost from now on)."""
    body = json.loads(path.read_text(encoding="utf-8"))
    write_node(path, body["gpus"], lost=[*body.get("lost", ()), bus_id], xid_queue=body.get("xid_queue"))


def env(template: str | Path, pythonpath: Sequence[str | Path] = ()) -> dict[str, str]:
    """``PYTHONPATH`` with the stand-in first (then ``pythonpath``), and the description's path
    (``{host}`` replaced by each process's hostname)."""
    return {
        "PYTHONPATH": os.pathsep.join(str(p) for p in [DIR, *pythonpath]),
        "GPUCLUSTER_STANDIN_NVML": str(template),
    }


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    spec = os.environ.get("GPUCLUSTER_STANDIN_LOSE", "")
    test, _, bus_id = spec.partition("=")
    template = os.environ.get("GPUCLUSTER_STANDIN_NVML", "")
    if not (test and bus_id and template) or report.when != "call" or not report.passed:
        return
    if report.nodeid.split("[")[0].endswith(f"::{test}"):
        lose(Path(template.replace("{host}", os.uname().nodename)), bus_id)
