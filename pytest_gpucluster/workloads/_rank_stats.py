"""What a rank measures about itself while it trains: its GPU's utilisation (NVML, sampled in a
background thread) and its peak memory (CUDA's allocator on a GPU, the resident set on a CPU).

The resident-set peak is read as ``VmHWM``, which a job of several workloads resets before each
part (``workloads/bundle.py``), so each part's peak is its own. Rank-side: standard library,
torch and (lazily) nvidia-ml-py only.
"""

from __future__ import annotations

import os
import resource
import threading
from typing import Any

from pytest_gpucluster.workloads._runtime import RankContext

__all__ = ["GpuUtilSampler", "peak_memory", "peak_rss_bytes", "start_sampler"]


def peak_rss_bytes() -> int | None:
    """This process's peak resident set since start or the last reset (Linux ``VmHWM``); None elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class GpuUtilSampler:
    """Polls NVML utilisation (and memory used) of this rank's GPU in a background thread."""

    def __init__(self, torch_index: int, interval_s: float) -> None:
        import pynvml  # nvidia-ml-py; ImportError tells the caller why there is no figure
        import torch

        pynvml.nvmlInit()
        self._nvml = pynvml
        uuid = str(getattr(torch.cuda.get_device_properties(torch_index), "uuid", ""))
        if uuid:
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
        else:  # older torch: map through CUDA_VISIBLE_DEVICES by hand
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            physical = int(visible[torch_index]) if visible[0] and torch_index < len(visible) else torch_index
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(physical)
        self._interval = interval_s
        self._util: list[float] = []
        self._mem_used = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-util-sampler", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                self._util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
                self._mem_used = max(self._mem_used, used)
        except Exception as exc:  # keep the samples so far; say why they end
            self.error = f"NVML failed while sampling ({type(exc).__name__}: {exc})"

    def start(self) -> None:
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> tuple[dict[str, Any] | None, int]:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()
        if not self._util:
            return None, self._mem_used
        util = {"mean": sum(self._util) / len(self._util), "min": min(self._util), "max": max(self._util)}
        return {**util, "samples": len(self._util), "interval_s": self._interval}, self._mem_used


def start_sampler(ctx: RankContext, interval_s: float) -> tuple[GpuUtilSampler | None, str | None]:
    if not ctx.is_cuda:
        return None, "not sampled: this rank runs on CPU"
    try:
        sampler = GpuUtilSampler(int(ctx.device.split(":")[1]), interval_s)
    except ImportError:
        return None, "not sampled: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    except Exception as exc:  # an NVML error must not cost the training measurements
        return None, f"not sampled: NVML failed ({type(exc).__name__}: {exc})"
    sampler.start()
    return sampler, None


def peak_memory(ctx: RankContext, nvml_used: int) -> dict[str, Any]:
    # VmHWM, which a bundle of several workloads resets per part; ru_maxrss (KiB on Linux) elsewhere.
    rss = peak_rss_bytes() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not ctx.is_cuda:
        return {"peak_memory_bytes": rss, "peak_memory_kind": "cpu_max_rss", "cpu_max_rss_bytes": rss}
    import torch

    reserved = int(torch.cuda.max_memory_reserved(ctx.device))
    return {
        "peak_memory_bytes": reserved,
        "peak_memory_kind": "cuda_max_reserved",
        "cuda_max_allocated_bytes": int(torch.cuda.max_memory_allocated(ctx.device)),
        "cuda_max_reserved_bytes": reserved,
        "nvml_max_used_bytes": nvml_used or None,
        "cpu_max_rss_bytes": rss,
    }
