"""Rank side of the burn-in: this rank's own health numbers, its node's versions, and pair tests.

Workloads (``pytest_gpucluster.workloads.health:<name>``):

- ``health``   per rank: float32 matmul FLOP/s and memory bandwidth on the CPU; on a GPU also
  dense bf16 matmul FLOP/s, device memory bandwidth and pinned host-to-device copy bandwidth,
  then more bf16 matmul until the load has lasted ``load_s`` (default 5 s). Throughout that load
  a thread samples NVML (``under_load``: temperature, power, clocks, PCIe generation and width,
  clock reasons, every ``sample_interval_s``), NVML's cumulative violation and energy counters
  are read around it, and NVML's XID events are listened to. Then the NVML readings after the
  load (ECC mode and counts, retired pages, remapped rows; ``nvidia-smi -q -d ECC`` text where
  NVML gives no ECC mode), the node's XID events from its kernel log, an all_reduce among the
  ranks of each node at once (the intra-node phase of the pairwise localization), and the
  version fingerprint. A part that cannot run here is left out and its reason put under
  ``skipped`` (no NVML, no GPU...): the parent says exactly what is missing.
- ``counters`` only the ECC / retired-page / remapped-row counters and XID events, cheap enough
  to read before and after the whole acceptance run. XID events that no log lets this rank read
  are reported as such (``skipped["xid"]``), which the parent records as a check that fails.
- ``pair_allreduce`` the timed all_reduce of one node-pair test.
- ``pair_groups`` where nodes cannot be made: each rank stands for a node, and each pair of
  ranks in ``pairs`` runs the pair test in its own subgroup, all pairs at once.

Bandwidth conventions: a memory copy counts the bytes read plus the bytes written (STREAM's
"copy"), a host-to-device copy the bytes moved. Times are medians over ``repeat`` timed spans;
``matmul_best_s`` is the best span, which stragglers are judged on: other load on a node only
ever adds time, so a rank that is slow even at its best is slow itself.

A synthetic straggler for the tests: ``inject_delay_s`` with ``inject_rank`` sleeps inside every
timed iteration of that rank; ``slow_hosts: {host: seconds}`` does the same on every rank of
those hosts (a slow node, keyed by hostname because node ranks are assigned at rendezvous);
``slow_ranks: {"3": seconds}`` on single ranks (where each rank stands for a node).

Like the rest of ``workloads/``, this runs inside a rank: standard library, torch and (lazily)
pynvml only. The node's NVML readings, XID events and versions are read by ``_node_facts.py``.
"""

from __future__ import annotations

import getpass
import os
import statistics
import time
from typing import Any

from pytest_gpucluster.workloads import xid_watch
from pytest_gpucluster.workloads._gpu_health import ecc_smi_text, gpu_under_load
from pytest_gpucluster.workloads._node_facts import nvml_readings, versions, xid_events
from pytest_gpucluster.workloads._runtime import RankContext
from pytest_gpucluster.workloads._timing import timed_median, timed_spans

__all__ = ["counters", "health", "pair_allreduce", "pair_groups"]


def _delay(ctx: RankContext) -> float:
    opts = ctx.options
    slow = opts.get("slow_hosts") or {}
    delay = float(slow.get(ctx.host, 0.0))
    delay += float((opts.get("slow_ranks") or {}).get(str(ctx.rank), 0.0))
    if opts.get("inject_rank") is not None and int(opts["inject_rank"]) == ctx.rank:
        delay += float(opts.get("inject_delay_s", 0.0))
    return delay


# ----------------------------------------------------------------------------------- CPU part


def _cpu(torch: Any, ctx: RankContext, delay: float) -> dict[str, Any]:
    opts = ctx.options
    n = int(opts.get("cpu_matmul_n", 512))
    # Many short spans: the best of 7 is what a rank can do when nothing else runs on its core.
    iters, repeat = int(opts.get("cpu_iters", 5)), int(opts.get("cpu_repeat", 7))
    a = torch.rand(n, n, dtype=torch.float32)
    b = torch.rand(n, n, dtype=torch.float32)
    out = torch.empty(n, n, dtype=torch.float32)
    spans = timed_spans(lambda: torch.mm(a, b, out=out), iters, repeat, lambda: None, delay)
    matmul_s = statistics.median(spans)
    nbytes = int(opts.get("cpu_copy_bytes", 32 << 20))
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copies = timed_spans(lambda: dst.copy_(src), iters, 3, lambda: None, delay)
    copy_s = statistics.median(copies)
    return {
        "threads": torch.get_num_threads(),
        "matmul_n": n,
        "matmul_s": matmul_s,
        "matmul_best_s": min(spans),
        "matmul_flops": 2 * n**3 / matmul_s,
        "copy_bytes": src.numel() * 4,
        "memory_bandwidth": 2 * src.numel() * 4 / copy_s,
        # each span's figure: the spread the regression gate compares beyond (results/gate.py)
        "matmul_flops_spans": [2 * n**3 / s for s in spans],
        "memory_bandwidth_spans": [2 * src.numel() * 4 / s for s in copies],
    }


# ------------------------------------------------------------------------------ workloads


def _set_threads(torch: Any, ctx: RankContext) -> None:
    threads = ctx.options.get("threads")
    torch.set_num_threads(int(threads) if threads else max(1, (os.cpu_count() or 1) // ctx.local_world_size))


def _node_groups(ctx: RankContext) -> Any:
    """A process group of the ranks of this rank's host (every rank creates every group)."""
    import torch.distributed as dist

    hosts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(hosts, ctx.host)
    mine = None
    for host in sorted(set(hosts)):
        group = dist.new_group([r for r, h in enumerate(hosts) if h == host])
        if host == ctx.host:
            mine = group
    return mine, hosts.count(ctx.host)


def _intra_node(torch: Any, ctx: RankContext, delay: float) -> tuple[dict[str, Any] | None, str | None]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return None, "no process group"
    group, local = _node_groups(ctx)
    if local < 2:
        return None, f"{ctx.host} runs 1 rank, so there is no intra-node traffic to measure"
    nbytes = int(ctx.options.get("intra_bytes", 4 << 20))
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    sync = ctx.synchronize
    per_call = timed_median(lambda: dist.all_reduce(tensor, group=group), 5, 3, sync, delay)
    slowest = torch.tensor([per_call], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    t = float(slowest.item())
    return {"ranks": local, "bytes": nbytes, "time_s": t, "busbw": nbytes / t * 2 * (local - 1) / local}, None


def health(ctx: RankContext) -> dict[str, Any]:
    """Every health number of this rank (see the module doc); parts that cannot run are skipped."""
    import torch

    _set_threads(torch, ctx)
    delay = _delay(ctx)
    skipped: dict[str, str] = {}
    result: dict[str, Any] = {
        "rank": ctx.rank,
        "host": ctx.host,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "device": ctx.device,
        "cpu": _cpu(torch, ctx, delay),
    }
    if ctx.is_cuda:
        result["gpu"], result["under_load"], load_skipped = gpu_under_load(torch, ctx, delay)
        skipped.update(load_skipped)
        nvml, nvml_skipped = nvml_readings(torch, ctx, full=True)
        result["nvml"] = nvml
        skipped.update(nvml_skipped)
        if "ecc_mode" not in nvml:
            result["ecc_smi"], why = ecc_smi_text(nvml.get("pci_bus_id"))
            if why:
                skipped["ecc_smi"] = why
        if ctx.local_rank == 0:
            _add_xids(ctx, result, skipped)
    else:
        why = f"{ctx.host} has no CUDA device (torch {torch.__version__}, device {ctx.device})"
        skipped.update(gpu=why, nvml=why, xid=why)
    intra, why = _intra_node(torch, ctx, delay)
    if intra is None:
        skipped["intra_node"] = why or "unknown"
    else:
        result["intra_node"] = intra
    result["versions"] = versions()
    result["skipped"] = skipped
    return result


def counters(ctx: RankContext) -> dict[str, Any]:
    """ECC, retired-page and remapped-row counters of this rank's GPU, and its node's XID events."""
    import torch

    result: dict[str, Any] = {
        "rank": ctx.rank, "host": ctx.host, "local_rank": ctx.local_rank, "taken_at": time.time(),
        "user": getpass.getuser(),
    }  # fmt: skip
    if not ctx.is_cuda:
        why = f"{ctx.host} has no CUDA device, so there are no ECC or XID counters to read"
        result["skipped"] = {"nvml": why, "xid": why}
        return result
    nvml, skipped = nvml_readings(torch, ctx, full=False)
    result["nvml"] = nvml
    if ctx.local_rank == 0:
        _add_xids(ctx, result, skipped)
        _xid_watch(ctx, result, skipped)
    result["skipped"] = skipped
    return result


def _add_xids(ctx: RankContext, result: dict[str, Any], skipped: dict[str, str]) -> None:
    """The node's XID events and where they were read, or why no log could be (node's first rank)."""
    xids, source, why = xid_events(ctx)
    if xids is None:
        skipped["xid"] = why or f"XID events not readable on {ctx.host}"
    else:
        result["xid_events"], result["xid_source"] = xids, source


def _xid_watch(ctx: RankContext, result: dict[str, Any], skipped: dict[str, str]) -> None:
    """The node's session-spanning NVML XID listener (``workloads/xid_watch.py``): started by the
    first reading (``phase`` before), read and stopped by the last (after)."""
    watch = ctx.options.get("xid_watch") or {}
    if not watch.get("dir"):
        return
    if watch.get("phase") == "before":
        if watch.get("held"):  # the controller's own step listens (launch/xid_step.py)
            ok, why = xid_watch.held(watch["dir"])
        else:
            ok, why = xid_watch.start(watch["dir"], float(watch.get("max_s", 86400.0)))
        if ok:
            result["xid_watch"] = xid_watch.HELD_SOURCE if watch.get("held") else xid_watch.SOURCE
        else:
            skipped["xid_watch"] = f"{ctx.host}: {why}"
        return
    events, why = xid_watch.collect(watch["dir"])
    if events is None:
        skipped["xid_watch"] = f"{ctx.host}: {why}"
    else:
        result["xid_watch"], result["xid_watch_events"] = xid_watch.SOURCE, events


def pair_allreduce(ctx: RankContext) -> dict[str, Any]:
    """One pair test: ``iters`` all_reduce calls of ``size_bytes``; every rank returns the
    slowest rank's time per call and the bus bandwidth it gives."""
    import torch

    _set_threads(torch, ctx)
    t, nbytes = _timed_pair(torch, ctx, None, _delay(ctx))
    n = ctx.world_size
    return {
        "rank": ctx.rank,
        "host": ctx.host,
        "nranks": n,
        "size_bytes": nbytes,
        "iters": int(ctx.options.get("iters", 10)),
        "time_s": t,
        "busbw": nbytes / t * 2 * (n - 1) / n,
    }


def _timed_pair(torch: Any, ctx: RankContext, group: Any, delay: float) -> tuple[float, int]:
    """Seconds per all_reduce of the slowest rank of ``group`` (None: the world), and bytes."""
    import torch.distributed as dist

    opts = ctx.options
    nbytes = int(opts.get("size_bytes", 4 << 20))
    iters, warmup = int(opts.get("iters", 10)), int(opts.get("warmup", 2))
    tensor = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    ctx.synchronize()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        if delay:
            time.sleep(delay)
        dist.all_reduce(tensor, group=group)
    ctx.synchronize()
    slowest = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return float(slowest.item()), tensor.numel() * 4


def pair_groups(ctx: RankContext) -> dict[str, Any]:
    """Each pair ``[i, j]`` of ``options["pairs"]`` runs the pair test in its own subgroup."""
    import torch
    import torch.distributed as dist

    _set_threads(torch, ctx)
    pairs = [tuple(int(r) for r in pair) for pair in ctx.options.get("pairs") or []]
    mine, mine_pair = None, None
    for pair in pairs:  # every rank creates every group, in the same order
        group = dist.new_group(list(pair))
        if ctx.rank in pair:
            mine, mine_pair = group, pair
    out: dict[str, Any] = {"rank": ctx.rank, "host": ctx.host, "pair": mine_pair}
    if mine is not None:
        t, nbytes = _timed_pair(torch, ctx, mine, _delay(ctx))
        out.update(time_s=t, size_bytes=nbytes, busbw=nbytes / t)  # 2 ranks: bus factor 2(n-1)/n = 1
    dist.barrier()
    return out
