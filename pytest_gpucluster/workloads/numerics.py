"""Rank side of the numerics check: does this GPU (or CPU) compute the same bits as its peers,
the right answer, and the same bits every time — and how fast, per dtype?

Workload ``pytest_gpucluster.workloads.numerics:run``. Every rank, for each dtype its device runs
(`_numerics_chain.select_dtypes`):

1. the small known-answer problem against float64 on the host (`_numerics_chain.known_answer`);
2. one untimed chain (warm-up), then the chain of every seed in turn, again and again, until the
   dtype's share of ``duration_s`` is spent and every seed has run at least ``min_repeats``
   times: each run timed (throughput) and digested (`_numerics_chain.digest`).

The inputs are made on the device from the seed, so every rank of one part computes the same
thing and nothing large crosses the network; the parent compares the digests across ranks and
repeats (``checks/numerics.py``). On a GPU the run is made deterministic first, as cuBLAS
documents its bit-wise reproducibility (same architecture and SM count, a fixed workspace
configuration, no atomics): ``CUBLAS_WORKSPACE_CONFIG`` (set by the launch, ``plans/numerics.py``;
set here too if missing, which works only if no cuBLAS handle exists yet) and
``torch.use_deterministic_algorithms(True)``, restored afterwards with cuBLAS's TF32 switch, since
other parts of a shared job run in the same process.

Options (``plans/numerics.py`` writes them): ``dtypes`` (None: the device's), ``seeds``,
``duration_s``, ``min_repeats``, ``matmul_n``, ``depth``, ``known_answer_k``, ``threads`` (CPU), and
the self-test's ``inject: {"rank": r, "dtype": d | None, "bit": b}``: rank ``r`` flips bit ``b`` of
the first element of dtype ``d``'s output (None: its first dtype's, fp32, which every device runs)
in the first run of the first seed, before the digest, as a transient silent data corruption would.

Rank-side: standard library and torch only.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from typing import Any

from pytest_gpucluster.workloads import _numerics_chain as nc
from pytest_gpucluster.workloads._runtime import RankContext

__all__ = ["CUBLAS_WORKSPACE", "run"]

CUBLAS_WORKSPACE = ":4096:8"
"""The workspace configuration cuBLAS's reproducibility section names (cuBLAS docs, "Results
reproducibility"; torch's "Reproducibility" notes ask for ``:4096:8`` or ``:16:8``)."""
_PROGRESS_S = 30.0
"""Rank 0 says how far a dtype has got this often."""
_KEPT_RATES = 100
"""Rates kept per dtype in the rank's record (evenly spaced): enough to draw the spread."""


def _platform(torch: Any, ctx: RankContext, dev: Any) -> dict[str, Any]:
    """What decides the bits: ranks whose ``key`` differs are not expected to agree."""
    info: dict[str, Any] = {"torch": torch.__version__}
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(dev)
        info.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            cuda=torch.version.cuda,
            driver_cuda=_driver_cuda(torch),
            cublas_workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            cublas=cublas_version(),
        )
        key = (
            f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}, driver CUDA {info['driver_cuda']}, cuBLAS {info['cublas']}"
        )
    else:
        info.update(
            name=platform.processor() or platform.machine(),
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            threads=torch.get_num_threads(),
        )
        key = (
            f"CPU {info['cpu_capability']} ({platform.machine()}), {info['threads']} threads, "
            f"torch {torch.__version__}"
        )
    info["key"] = key
    return info


_CUBLAS_SO = re.compile(r"libcublas\.so(?:\.(\d+(?:\.\d+)*))?$")


def cublas_version(maps: str = "/proc/self/maps") -> str | None:
    """The cuBLAS library this process loaded: its file's version (``libcublas.so.12.8.4.1``, read
    from ``maps`` after a matmul loaded it), else the ``nvidia-cublas*`` wheel installed beside
    torch. Two nodes with one torch and different cuBLAS builds may round differently: a different
    platform, not silent data corruption. None where neither says."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                path = line.split()[-1] if line.strip() else ""
                name = os.path.basename(path)
                if name.startswith("libcublas.so"):
                    real = os.path.basename(os.path.realpath(path))
                    found = _CUBLAS_SO.search(real) or _CUBLAS_SO.search(name)
                    if found and found.group(1) and found.group(1).count(".") >= 2:
                        return found.group(1)
    except OSError:
        pass
    from importlib import metadata

    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-cublas"):
            return f"{name} {dist.version}"
    return None


def _driver_cuda(torch: Any) -> str | None:
    """The CUDA version the node's driver supports (``12080`` -> ``12.8``): a driver that JIT-compiles
    a kernel differently is a different platform, not a faulty GPU. None where torch hides it."""
    try:
        version = int(torch._C._cuda_getDriverVersion())
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _gpu_label(torch: Any, ctx: RankContext, dev: Any) -> str | None:
    if not ctx.is_cuda:
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        device = getattr(props, "pci_device_id", 0)
        return f"GPU {index} ({domain:08X}:{bus:02X}:{device:02X}.0)"
    uuid = getattr(props, "uuid", None)
    return f"GPU {index}" + (f" (GPU-{uuid})" if uuid else "")


class _Determinism:
    """Deterministic algorithms and cuBLAS's TF32 switch for one dtype, restored on exit.

    Only one of torch's two TF32 APIs is touched: torch 2.9+ raises once both have been used
    (``fp32_precision`` where it exists, else the legacy ``allow_tf32``)."""

    def __init__(self, torch: Any, is_cuda: bool) -> None:
        self.torch, self.is_cuda = torch, is_cuda
        self.matmul = torch.backends.cuda.matmul
        self.new_api = hasattr(self.matmul, "fp32_precision")
        self.saved = (
            torch.are_deterministic_algorithms_enabled(),
            self.matmul.fp32_precision if self.new_api else self.matmul.allow_tf32,
        )

    def start(self) -> None:
        if self.is_cuda:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            self.torch.use_deterministic_algorithms(True)

    def precision(self, dtype: str) -> None:
        tf32 = dtype == "tf32"
        if self.new_api:
            self.matmul.fp32_precision = "tf32" if tf32 else "ieee"
        else:
            self.matmul.allow_tf32 = tf32

    def restore(self) -> None:
        deterministic, tf32 = self.saved
        self.torch.use_deterministic_algorithms(deterministic)
        if self.new_api:
            self.matmul.fp32_precision = tf32
        else:
            self.matmul.allow_tf32 = tf32


def _rates_summary(rates: list[float]) -> dict[str, Any]:
    median = statistics.median(rates)
    step = max(1, len(rates) // _KEPT_RATES)
    return {
        "flops": median,
        "flops_min": min(rates),
        "flops_max": max(rates),
        "flops_mad": statistics.median(abs(r - median) for r in rates),
        "runs": len(rates),
        "rates": rates[::step][:_KEPT_RATES],
    }


def _one_dtype(
    torch: Any, ctx: RankContext, spec: nc.DTypeSpec, budget_s: float, inject: dict[str, Any] | None
) -> dict[str, Any]:
    opts = ctx.options
    seeds = [int(s) for s in opts.get("seeds", [1, 2, 3])]
    n, depth = int(opts.get("matmul_n", 256)), int(opts.get("depth", 4))
    min_repeats = int(opts.get("min_repeats", 2))
    known = nc.known_answer(torch, spec, int(opts.get("known_answer_k", 64)), seeds[0] + 7919, ctx.device)
    inputs = {seed: nc.chain_inputs(torch, spec, n, seed, ctx.device) for seed in seeds}
    nc.chain(torch, spec, *inputs[seeds[0]], depth, ctx.device)  # warm-up: kernels chosen, clocks up
    ctx.synchronize()
    digests: dict[str, dict[str, int]] = {str(s): {} for s in seeds}
    first_change: dict[str, int] = {}
    rates: list[float] = []
    flops = depth * 2.0 * n**3
    started = time.monotonic()
    until, said = started + budget_s, started
    repeat = 0
    while repeat < min_repeats or time.monotonic() < until:
        if time.monotonic() - said >= _PROGRESS_S:  # a burn-in's minutes are not silent
            said = time.monotonic()
            ctx.progress(
                f"numerics {spec.name}: {repeat} repeats, {said - started:.0f} of {budget_s:.0f} s, "
                f"{statistics.median(rates) / 1e12:.4g} TFLOP/s so far"
            )
        for seed in seeds:
            start = time.perf_counter()
            out, sums = nc.chain(torch, spec, *inputs[seed], depth, ctx.device)
            ctx.synchronize()
            rates.append(flops / (time.perf_counter() - start))
            if inject is not None and repeat == 0 and seed == seeds[0]:
                nc.flip_bit(torch, out, int(inject.get("bit", 0)))
                sums = out.float().sum(dim=1)
            seen = digests[str(seed)]
            value = nc.digest(torch, out, sums)
            if seen and value not in seen and str(seed) not in first_change:
                first_change[str(seed)] = repeat
            seen[value] = seen.get(value, 0) + 1
        repeat += 1
    del inputs
    return {
        "matmul_n": n,
        "depth": depth,
        "chain_flops": flops,
        "repeats": repeat,
        "digests": digests,
        "first_change": first_change,
        "known_answer": known,
        **_rates_summary(rates),
    }


def _set_threads(torch: Any, ctx: RankContext) -> None:
    threads = ctx.options.get("threads")
    if not ctx.is_cuda:
        torch.set_num_threads(
            int(threads) if threads else max(1, (os.cpu_count() or 1) // ctx.local_world_size)
        )


def run(ctx: RankContext) -> dict[str, Any]:
    """Every dtype's known answer, digests per seed and throughput on this rank (module doc)."""
    import torch

    _set_threads(torch, ctx)
    dev = torch.device(ctx.device)
    capability = torch.cuda.get_device_capability(dev) if ctx.is_cuda else None
    names, skipped = nc.select_dtypes(ctx.is_cuda, capability, nc.has_fp8(torch), ctx.options.get("dtypes"))
    inject = ctx.options.get("inject")
    inject_here = inject is not None and int(inject["rank"]) == ctx.rank
    inject_dtype = (inject or {}).get("dtype") or (names[0] if names else None)
    budget = float(ctx.options.get("duration_s", 5.0)) / max(len(names), 1)
    determinism = _Determinism(torch, ctx.is_cuda)
    result: dict[str, Any] = {
        "rank": ctx.rank,
        "host": ctx.host,
        "local_rank": ctx.local_rank,
        "device": ctx.device,
        "gpu": _gpu_label(torch, ctx, dev),
        "platform": _platform(torch, ctx, dev),
        "dtypes": {},
        "skipped": skipped,
        "injected": None,
    }
    determinism.start()
    try:
        result["deterministic"] = torch.are_deterministic_algorithms_enabled()
        for name in names:
            determinism.precision(name)
            here = inject if inject_here and name == inject_dtype else None
            started = time.monotonic()
            try:
                result["dtypes"][name] = _one_dtype(torch, ctx, nc.DTYPES[name], budget, here)
            except (RuntimeError, NotImplementedError, TypeError) as exc:
                if name != "fp8":
                    raise  # a GEMM every part has failed: the rank fails, naming it
                # torch._scaled_mm is private and changed its signature across releases; a build
                # or part without it is said, not fatal
                skipped[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                continue
            if here is not None:
                seed = int((ctx.options.get("seeds") or [1])[0])
                result["injected"] = {
                    "dtype": name,
                    "seed": seed,
                    "repeat": 0,
                    "bit": int(here.get("bit", 0)),
                }
            done = result["dtypes"][name]
            ctx.progress(
                f"numerics {name}: {done['repeats']} repeats of {len(done['digests'])} seeds in "
                f"{time.monotonic() - started:.1f} s, {done['flops'] / 1e12:.4g} TFLOP/s, "
                f"known answer at {done['known_answer']['ratio']:.3g} of its bound"
            )
    finally:
        determinism.restore()
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    return result
