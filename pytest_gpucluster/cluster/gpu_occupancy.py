"""Is anyone else on this run's GPUs? The parent's judgement of NVML's per-node process lists.

Each node's probe rank returns `workloads.gpu_processes` records (every process NVML lists
with a CUDA context, per GPU). `foreign_gpu_use` keeps the processes that are not this run's
own (the probe's pid, the job's ranks) and groups them per GPU, so a test can name the GPU
before it measures anything on it: a GPU shared with a leftover rank or someone's notebook
gives garbage numbers.

NVML answers that cannot be true are named too (`ScrambledAnswer`): a pid above Linux's
``PID_MAX_LIMIT`` (4194304) or below 1 means the Python bindings and the driver disagree on the
layout of ``nvmlProcessInfo_t`` (gpuopenanalytics/pynvml#50: pid and memory swapped or
shuffled), and the list cannot be trusted.

Pure: records in, dataclasses out. No pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.errors import ParseError

__all__ = [
    "PID_MAX_LIMIT",
    "ForeignGpuUse",
    "GpuProcess",
    "ScrambledAnswer",
    "foreign_gpu_use",
    "gpu_processes",
]

PID_MAX_LIMIT = 4 * 1024 * 1024
"""The largest pid a 64-bit Linux can hand out (``PID_MAX_LIMIT`` in <linux/threads.h>)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    host: str
    gpu: int
    uuid: str
    pid: int
    used_bytes: int | None
    name: str | None = None

    def text(self) -> str:
        memory = "memory unknown" if self.used_bytes is None else f"{self.used_bytes / 2**30:.2f} GiB"
        return f"pid {self.pid}{f' ({self.name})' if self.name else ''}, {memory}"


@dataclass(frozen=True, slots=True)
class ForeignGpuUse:
    """Processes that are not this run's on one GPU of one node."""

    host: str
    gpu: int
    uuid: str
    processes: tuple[GpuProcess, ...]

    def sentence(self) -> str:
        who = "; ".join(p.text() for p in self.processes)
        return (
            f"GPU {self.gpu} ({self.uuid}) on {self.host} is in use by {len(self.processes)} process(es) "
            f"that are not part of this run: {who}. Measurements there would be shared with them; "
            f"stop them (pytest --gpucluster-reap ends leftovers of earlier runs) or leave the node out."
        )


@dataclass(frozen=True, slots=True)
class ScrambledAnswer:
    """NVML's list from one node holds a pid no Linux process can have."""

    host: str
    gpu: int
    pid: int

    def sentence(self) -> str:
        return (
            f"NVML's process list for GPU {self.gpu} on {self.host} holds pid {self.pid}, which no Linux "
            f"process can have (1..{PID_MAX_LIMIT}): the pynvml bindings and the driver disagree on "
            "nvmlProcessInfo_t (see gpuopenanalytics/pynvml#50); upgrade nvidia-ml-py to match the driver"
        )


_KEYS = {"gpu": int, "uuid": str, "pid": int}


def gpu_processes(host: str, records: Sequence[Mapping[str, Any]]) -> list[GpuProcess]:
    """Records from `workloads.gpu_processes` as `GpuProcess`; a malformed one raises
    `ParseError` naming the host, the record's position and the key."""
    out = []
    for i, record in enumerate(records):
        where = f"GPU process record {i} from {host}"
        if not isinstance(record, Mapping):
            raise ParseError(f"{where} is a {type(record).__name__}, expected a mapping")
        for key, kind in _KEYS.items():
            if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
                raise ParseError(f"{where}: '{key}' is {record.get(key)!r}, expected {kind.__name__}")
        used = record.get("used_bytes")
        if used is not None and (not isinstance(used, int) or isinstance(used, bool) or used < 0):
            raise ParseError(f"{where}: 'used_bytes' is {used!r}, expected a byte count or null")
        name = record.get("name")
        out.append(
            GpuProcess(
                host=host, gpu=record["gpu"], uuid=record["uuid"], pid=record["pid"],
                used_bytes=used, name=str(name) if name else None,
            )
        )  # fmt: skip
    return out


def foreign_gpu_use(
    per_node: Mapping[str, Sequence[Mapping[str, Any]]],
    own_pids: Mapping[str, Collection[int]],
) -> tuple[list[ForeignGpuUse], list[ScrambledAnswer]]:
    """``per_node``: host -> its probe's records; ``own_pids``: host -> this run's pids there.

    Returns the GPUs with foreign processes (by host, then GPU), and the impossible entries.
    """
    foreign: list[ForeignGpuUse] = []
    scrambled: list[ScrambledAnswer] = []
    for host in sorted(per_node):
        ours = set(own_pids.get(host, ()))
        by_gpu: dict[tuple[int, str], list[GpuProcess]] = {}
        for process in gpu_processes(host, per_node[host]):
            if not 1 <= process.pid <= PID_MAX_LIMIT:
                scrambled.append(ScrambledAnswer(host=host, gpu=process.gpu, pid=process.pid))
            elif process.pid not in ours:
                by_gpu.setdefault((process.gpu, process.uuid), []).append(process)
        foreign += [
            ForeignGpuUse(host=host, gpu=gpu, uuid=uuid, processes=tuple(processes))
            for (gpu, uuid), processes in sorted(by_gpu.items())
        ]
    return foreign, scrambled
