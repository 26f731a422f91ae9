"""The health job's GPU part: bf16 matmul, device memory and pinned host-to-device copy bandwidth,
then more matmul until the load has lasted ``load_s``, with NVML sampled on a thread throughout
(``_load_sampler``), NVML's cumulative counters read around it and its XID events listened to;
and the ``nvidia-smi -q -d ECC`` text where NVML gives no ECC mode.

Rank-side: standard library, torch and (lazily) pynvml only.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Any

from pytest_gpucluster.workloads._load_sampler import LoadSampler, counter_deltas
from pytest_gpucluster.workloads._node_facts import nvml_cumulative, nvml_sample_reader, open_nvml
from pytest_gpucluster.workloads._runtime import RankContext
from pytest_gpucluster.workloads._timing import timed_median, timed_spans
from pytest_gpucluster.workloads._xid import NvmlXidListener

__all__ = ["ecc_smi_text", "gpu_under_load"]


def _gpu_matmul(torch: Any, dev: Any, n: int, iters: int, repeat: int, delay: float) -> list[float]:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
    return timed_spans(lambda: torch.mm(a, b, out=out), iters, repeat, torch.cuda.synchronize, delay)


def _gpu_copy(torch: Any, dev: Any, nbytes: int, iters: int, repeat: int, delay: float) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    return timed_median(lambda: dst.copy_(src), iters, repeat, torch.cuda.synchronize, delay)


def _h2d_copy(torch: Any, dev: Any, nbytes: int, iters: int, repeat: int, delay: float) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    target = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    return timed_median(
        lambda: target.copy_(host, non_blocking=True), iters, repeat, torch.cuda.synchronize, delay
    )


def _sustain(torch: Any, dev: Any, n: int, until: float) -> int:
    """More bf16 matmul (untimed) until ``until`` (monotonic): the sampled load lasts long enough to
    heat the GPU and hold its clocks and link at load levels. Returns the matmuls run."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
    done = 0
    while time.monotonic() < until:
        for _ in range(10):
            torch.mm(a, a, out=out)
        torch.cuda.synchronize()
        done += 10
    return done


def _gpu(torch: Any, ctx: RankContext, delay: float, until: float = 0.0) -> dict[str, Any]:
    opts = ctx.options
    dev = torch.device(ctx.device)
    n = int(opts.get("gpu_matmul_n", 8192))
    iters, repeat = int(opts.get("gpu_iters", 20)), int(opts.get("gpu_repeat", 5))
    nbytes = int(opts.get("gpu_copy_bytes", 1 << 30))
    h2d_bytes = int(opts.get("h2d_bytes", 256 << 20))
    spans = _gpu_matmul(torch, dev, n, iters, repeat, delay)
    matmul_s = statistics.median(spans)
    copy_s = _gpu_copy(torch, dev, nbytes, iters, repeat, delay)
    h2d_s = _h2d_copy(torch, dev, h2d_bytes, max(iters // 2, 1), repeat, delay)
    sustained = _sustain(torch, dev, n, until)
    torch.cuda.empty_cache()
    return {
        "name": torch.cuda.get_device_properties(dev).name,
        "matmul_n": n,
        "matmul_s": matmul_s,
        "matmul_best_s": min(spans),
        "matmul_flops": 2 * n**3 / matmul_s,
        "copy_bytes": nbytes,
        "memory_bandwidth": 2 * nbytes / copy_s,
        "h2d_bytes": h2d_bytes,
        "h2d_bandwidth": h2d_bytes / h2d_s,
        "sustained_matmuls": sustained,
    }


def gpu_under_load(
    torch: Any, ctx: RankContext, delay: float
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The GPU part with NVML sampled on a thread throughout its load: ``(gpu, under_load, skipped)``.

    ``under_load`` holds the samples' summary (``_load_sampler.summarize_samples``), the growth of
    NVML's violation and energy counters (``counters``) and the XID events NVML reported during the
    load (``xids``). Without NVML the load still runs and ``skipped["under_load"]`` says why."""
    load_s = float(ctx.options.get("load_s", 5.0))
    interval = float(ctx.options.get("sample_interval_s", 0.1))
    nvml = open_nvml(torch, ctx)
    if isinstance(nvml, str):
        return _gpu(torch, ctx, delay, time.monotonic() + load_s), {}, {"under_load": nvml}
    pynvml, handle = nvml
    reader = nvml_sample_reader(pynvml, handle)
    before, skipped = nvml_cumulative(pynvml, handle)
    try:
        listener: NvmlXidListener | None = NvmlXidListener(pynvml, handle)
    except Exception as exc:
        listener, skipped["xid_during_load"] = None, f"NVML XID events: {type(exc).__name__}: {exc}"
    sampler = LoadSampler(reader, interval).start()
    try:
        gpu = _gpu(torch, ctx, delay, time.monotonic() + load_s)
    finally:
        summary = sampler.stop()
    after, _ = nvml_cumulative(pynvml, handle)
    under_load: dict[str, Any] = {**summary, "counters": counter_deltas(before, after)}
    skipped.update({f"under_load.{name}": why for name, why in reader.errors.items()})
    if listener is not None:
        try:
            under_load["xids"] = listener.drain()
        except Exception as exc:
            skipped["xid_during_load"] = f"NVML XID events: {type(exc).__name__}: {exc}"
        finally:
            listener.close()
    return gpu, under_load, skipped


def ecc_smi_text(bus_id: str | None) -> tuple[str | None, str | None]:
    """``nvidia-smi -q -d ECC`` for this GPU (parsed by the parent), where NVML gave no ECC mode."""
    argv = ["nvidia-smi", "-q", "-d", "ECC"] + (["-i", bus_id] if bus_id else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(argv)}: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return (
            None,
            f"{' '.join(argv)}: exit {done.returncode}: {' '.join((done.stdout + done.stderr).split())[:200]}",
        )
    return done.stdout, None
