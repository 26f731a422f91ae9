"""Rank side of the soak: the gated collectives, repeated in timed samples until the time is up.

``soak(ctx)`` runs on every rank (workload ``pytest_gpucluster.workloads.soak:soak``). Its options:

- ``points``: ``[{"collective", "size_bytes", "scope", "dtype"}]``, the sizes the profile gates
  (``plans/soak.py`` picks them); ``scope`` is ``intra-node``, ``inter-node`` or ``full``;
- ``duration_s``: how long to soak; ``sample_s``: each sample times back-to-back collectives for
  about this long (the count per sample is fixed once, from a calibration call, so every sample of
  a series does the same work); ``progress_s``: how often rank 0 prints a progress line.

Who talks to whom, per scope: **intra-node**, every node's ranks at once, one group per node with
2+ ranks; **inter-node**, every disjoint node pair at once (``(0,1), (2,3)...``; with an odd count
the last node pairs with node 0 in a second phase), so each pair is a series of its own;
**full**, every rank. Nodes are told apart by host name (``all_gather_object``), in rank order.

One round runs each point once on each of its phases; after every round rank 0 broadcasts whether
to stop, so the ranks always agree on the number of rounds, and a link that slows down half-way
only makes the last round late, never hangs the others. Every ``progress_s``, the ranks agree
(all_reduce MIN) on the slowest group's latest busbw per point for rank 0's progress line.

Returned per rank: the samples of the groups it is in, ``[(t_s, time_us)]`` each, ``t_s`` from
the soak's start (after a barrier); the parent (``checks/burnin/soak.py``) takes each sample's
slowest rank. Depends on the standard library, torch and ``maths`` only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.maths.metrics import busbw
from pytest_gpucluster.maths.sweep import DTYPE_SIZES, canonical_dtype, layout
from pytest_gpucluster.workloads._runtime import RankContext

__all__ = ["Phase", "node_pairs", "phases_of", "soak"]

SCOPES = ("intra-node", "inter-node", "full")
MAX_ITERS = 100_000
WARMUP = 2


def node_pairs(nnodes: int) -> list[list[tuple[int, int]]]:
    """Phases of disjoint node pairs that cover every node: ``[[(0, 1), (2, 3)]]`` for 4 nodes,
    ``[[(0, 1)], [(2, 0)]]`` for 3 (the odd node out pairs with node 0 in a second phase)."""
    first = [(i, i + 1) for i in range(0, nnodes - 1, 2)]
    phases = [first] if first else []
    if nnodes % 2 == 1 and nnodes > 1:
        phases.append([(nnodes - 1, 0)])
    return phases


@dataclass(frozen=True, slots=True)
class Phase:
    """Groups of one scope that run at the same time (disjoint), each a list of global ranks."""

    scope: str
    groups: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    """What each group is called in the results: a host, ``a<->b`` for a pair, ``all N nodes``."""


def phases_of(scope: str, hosts: Sequence[str]) -> tuple[list[Phase], str | None]:
    """The phases of ``scope`` for ranks on ``hosts`` (rank order); ([], why) when it cannot run."""
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    names = list(nodes)
    if scope == "intra-node":
        multi = [(h, tuple(r)) for h, r in nodes.items() if len(r) >= 2]
        if not multi:
            return [], "every node runs 1 rank, so there is no intra-node traffic to soak"
        return [Phase(scope, tuple(g for _, g in multi), tuple(h for h, _ in multi))], None
    if scope == "inter-node":
        if len(names) < 2:
            return [], f"inter-node soak needs 2+ nodes; the job has {len(names)}"
        out = []
        for phase in node_pairs(len(names)):
            pairs = [(names[a], names[b]) for a, b in phase]
            groups = tuple(tuple(sorted(nodes[a] + nodes[b])) for a, b in pairs)
            out.append(Phase(scope, groups, tuple(f"{a}<->{b}" for a, b in pairs)))
        return out, None
    if scope == "full":
        return [Phase(scope, (tuple(range(len(hosts))),), (f"all {len(names)} nodes",))], None
    raise ValueError(f"unknown soak scope {scope!r}; known: {', '.join(SCOPES)}")


class _Runner:
    """One point on one group this rank is in: its buffers, its call, its samples."""

    def __init__(
        self, torch: Any, dist: Any, ctx: RankContext, point: dict[str, Any], members: Sequence[int]
    ):
        self.dist, self.ctx = dist, ctx
        self.members = tuple(members)
        self.group = dist.new_group(list(members)) if len(members) < ctx.world_size else None
        self.collective = str(point["collective"])
        dtype = canonical_dtype(str(point.get("dtype", "float32")))
        self.lay = layout(self.collective, int(point["size_bytes"]), DTYPE_SIZES[dtype], len(members))
        count = max(self.lay.send_count, self.lay.recv_count, 1)
        self.send = torch.ones(count, dtype=getattr(torch, dtype), device=ctx.device)
        self.recv = torch.zeros(count, dtype=getattr(torch, dtype), device=ctx.device)
        self.call = self._call()
        self.iters = 1
        self.samples: list[tuple[float, float]] = []

    def _call(self) -> Callable[[], None]:
        dist, g, lay, n = self.dist, self.group, self.lay, len(self.members)
        send, recv, root = self.send[: lay.send_count], self.recv[: lay.recv_count], self.members[0]
        if self.collective == "all_reduce":
            return lambda: dist.all_reduce(recv, group=g)
        if self.collective == "all_gather":
            return lambda: dist.all_gather_into_tensor(recv, send, group=g)
        if self.collective == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(recv, send, group=g)
        if self.collective == "alltoall":
            return lambda: dist.all_to_all_single(recv, send, group=g)
        if self.collective == "broadcast":
            return lambda: dist.broadcast(recv, src=root, group=g)
        if self.collective == "reduce":
            return lambda: dist.reduce(recv, dst=root, group=g)
        me = self.members.index(self.ctx.rank)
        nxt, prv = self.members[(me + 1) % n], self.members[(me - 1) % n]

        def sendrecv() -> None:
            ops = [dist.P2POp(dist.isend, send, nxt, group=g), dist.P2POp(dist.irecv, recv, prv, group=g)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return sendrecv

    def timed(self, iters: int) -> float:
        """Seconds per call over ``iters`` back-to-back calls, after a barrier of the group."""
        self.dist.barrier(group=self.group)
        start = time.perf_counter()
        for _ in range(iters):
            self.call()
        self.ctx.synchronize()
        return (time.perf_counter() - start) / iters

    def sample(self, t0: float) -> float:
        at = time.perf_counter() - t0
        per_call = self.timed(self.iters)
        self.samples.append((round(at, 4), per_call * 1e6))
        return per_call

    def busbw(self, per_call: float) -> float:
        return busbw(self.collective, self.lay.size_bytes, per_call, len(self.members))


@dataclass
class _Slot:
    """One (point, phase): the runner of this rank's group in it, if any."""

    point: int
    label: str
    """``all_reduce 16 MiB inter-node``, for the progress line."""
    phase: Phase
    runner: _Runner | None
    name: str | None


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _slots(torch: Any, dist: Any, ctx: RankContext, points: Sequence[dict[str, Any]], hosts: Sequence[str]):
    """Every (point, phase) in order, with this rank's runner; groups are created on every rank in
    the same order, as ``new_group`` requires. Also the points that cannot run, with why."""
    slots: list[_Slot] = []
    skipped: dict[str, str] = {}
    for index, point in enumerate(points):
        phases, why = phases_of(str(point["scope"]), hosts)
        if why is not None:
            skipped[str(index)] = why
        for phase in phases:
            mine = [(g, n) for g, n in zip(phase.groups, phase.names, strict=True) if ctx.rank in g]
            runner = None
            for group, _name in zip(phase.groups, phase.names, strict=True):
                made = _Runner(torch, dist, ctx, point, group) if ctx.rank in group else None
                if made is None and len(group) < ctx.world_size:
                    dist.new_group(list(group))  # every rank takes part in creating every group
                runner = runner or made
            label = f"{point['collective']} {_size(int(point['size_bytes']))} {phase.scope}"
            slots.append(_Slot(index, label, phase, runner, mine[0][1] if mine else None))
    return slots, skipped


def _calibrate(torch: Any, dist: Any, ctx: RankContext, slots: Sequence[_Slot], sample_s: float) -> None:
    """Calls per sample, the same on every rank of a group: ``sample_s`` over the slowest rank's
    time of one call (after ``WARMUP`` untimed calls)."""
    times = torch.zeros(max(len(slots), 1), dtype=torch.float64, device=ctx.device)
    for i, slot in enumerate(slots):
        if slot.runner is not None:
            for _ in range(WARMUP):
                slot.runner.call()
            times[i] = slot.runner.timed(1)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    for i, slot in enumerate(slots):
        if slot.runner is not None:
            slot.runner.iters = max(1, min(MAX_ITERS, math.ceil(sample_s / max(float(times[i]), 1e-9))))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _report(torch: Any, dist: Any, ctx: RankContext, slots: Sequence[_Slot], latest: dict[int, float]) -> str:
    """Every rank's latest busbw per slot, MIN over the ranks: the slowest group's, for rank 0."""
    values = torch.full((max(len(slots), 1),), math.inf, dtype=torch.float64, device=ctx.device)
    for i, value in latest.items():
        values[i] = value
    dist.all_reduce(values, op=dist.ReduceOp.MIN)
    parts = []
    for i, slot in enumerate(slots):
        if math.isfinite(float(values[i])):
            count = len(slot.phase.groups)
            who = f" (slowest of {count} groups)" if count > 1 else f" ({slot.phase.names[0]})"
            parts.append(f"{slot.label} {float(values[i]) / 1e9:.3g} GB/s{who}")
    return "; ".join(parts)


def _loop(torch: Any, dist: Any, ctx: RankContext, slots: Sequence[_Slot], opts: dict[str, float]) -> int:
    """Rounds until rank 0 says the time is up; returns the number of rounds."""
    duration, progress_s = opts["duration_s"], opts["progress_s"]
    flags = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    ctx.barrier()
    t0 = time.perf_counter()
    last_report, rounds, latest = t0, 0, {}
    while True:
        for i, slot in enumerate(slots):
            if slot.runner is not None:
                latest[i] = slot.runner.busbw(slot.runner.sample(t0))
        rounds += 1
        now = time.perf_counter()
        if ctx.rank == 0:
            flags[0] = float(now - t0 >= duration)
            flags[1] = float(now - last_report >= progress_s or flags[0] == 1.0)
        dist.broadcast(flags, src=0)
        if flags[1] == 1.0:
            last_report = now
            line = _report(torch, dist, ctx, slots, latest)
            elapsed = now - t0
            eta = max(duration - elapsed, 0.0)
            ctx.progress(
                f"soak {_clock(elapsed)} of {_clock(duration)} (ETA {_clock(eta)}), round {rounds}: {line}"
            )
        if flags[0] == 1.0:
            return rounds


def _options(options: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    points = options.get("points")
    if not isinstance(points, list) or not points:
        raise ValueError(f"the soak needs options {{'points': [...], 'duration_s': S}}, got {options!r}")
    for point in points:
        missing = {"collective", "size_bytes", "scope"} - set(point)
        if missing:
            raise ValueError(f"soak point {point!r} lacks {', '.join(sorted(missing))}")
    duration = float(options.get("duration_s", 0))
    if duration <= 0:
        raise ValueError(f"soak duration_s must be positive, got {options.get('duration_s')!r}")
    sample_s = float(options.get("sample_s", 1.0))
    progress_s = float(options.get("progress_s", max(min(duration / 12, 30.0), 2.0)))
    return points, {"duration_s": duration, "sample_s": sample_s, "progress_s": progress_s}


def soak(ctx: RankContext) -> dict[str, Any]:
    """Repeat every point for ``duration_s``; this rank's samples per group (see the module doc)."""
    import torch
    import torch.distributed as dist

    points, opts = _options(ctx.options)
    hosts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(hosts, ctx.host)
    slots, skipped = _slots(torch, dist, ctx, points, hosts)
    _calibrate(torch, dist, ctx, slots, opts["sample_s"])
    started = time.time()
    rounds = _loop(torch, dist, ctx, slots, opts)
    series = [
        {
            "point": slot.point,
            "scope": slot.phase.scope,
            "name": slot.name,
            "group": list(slot.runner.members),
            "collective": slot.runner.collective,
            "size_bytes": slot.runner.lay.size_bytes,
            "iters": slot.runner.iters,
            "samples": slot.runner.samples,
        }
        for slot in slots
        if slot.runner is not None
    ]
    return {
        "rank": ctx.rank,
        "host": ctx.host,
        "hosts": hosts,
        "started_at": started,
        "rounds": rounds,
        **opts,
        "series": series,
        "skipped": skipped,
    }
