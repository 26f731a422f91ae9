"""Lost GPUs: read before the run, missing or unreadable after it.

A GPU that falls off the bus during a burn-in (NVML ``GpuIsLost``, Xid 79) answers the first
counter reading and not the last. Comparing only the GPUs read twice would drop it, and a run
whose worst GPU vanished would pass its counter check. Here every GPU of the before reading (by
host and PCI address) must be read again after the run; one that is not is a lost GPU, named with
what its rank said instead, and its action: reset it (``nvidia-smi -r``), and return it (RMA) if
it does not come back.

Pure: the counter job's per-rank values in, suspects and one check out. No torch, no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.results.model import Check

__all__ = ["LOST_ACTION", "lost_check", "lost_gpus"]

LOST_ACTION = "reset the GPU (nvidia-smi -r -i <gpu>) on the drained node; if it does not come back, RMA"


def _gpu_of(value: Mapping[str, Any]) -> tuple[str, str] | None:
    nvml = value.get("nvml") or {}
    bus = nvml.get("pci_bus_id") if isinstance(nvml, Mapping) else None
    return (str(value["host"]), str(bus).lower()) if bus else None


def _why_not(host: str, rank: Any, after: Sequence[Mapping[str, Any]]) -> str:
    same = [v for v in after if str(v.get("host")) == host and v.get("rank") == rank]
    if not same:
        return f"rank {rank} on {host} returned no reading after the run"
    skipped = (same[0].get("skipped") or {}).get("nvml")
    return f"NVML said: {skipped}" if skipped else "NVML returned no reading for it after the run"


def lost_gpus(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[Suspect]:
    """Every GPU the before reading holds (host and PCI address) that the after reading lacks."""
    now = {key for v in after if (key := _gpu_of(v)) is not None}
    out = []
    for value in sorted(before, key=lambda v: (str(v.get("host")), int(v.get("rank", 0)))):
        key = _gpu_of(value)
        if key is None or key in now:
            continue
        host, bus = key
        gpu = (value.get("nvml") or {}).get("gpu") or f"the GPU at PCI {bus}"
        why = _why_not(host, value.get("rank"), after)
        out.append(
            Suspect(
                node=host,
                kind="gpu",
                gpu=str(gpu),
                rank=int(value["rank"]) if value.get("rank") is not None else None,
                check="counters",
                reason=f"lost GPU: read before the run, not after it ({why}); {LOST_ACTION}",
                evidence={"pci": bus, "lost": True},
            )
        )
    return out


def lost_check(lost: Sequence[Suspect]) -> Check:
    """The number of GPUs lost during the run (at most 0), each named in the hint."""
    return Check(
        "burnin.gpus_lost",
        float(len(lost)),
        "GPUs",
        0.0,
        "<=",
        hint="\n".join(s.line() for s in lost) or "every GPU read before the run was read again after it",
    )
