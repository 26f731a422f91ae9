"""From per-source accumulators to one :class:`~.model.NcclLog`: merge, freeze, agree across ranks.

One job: the whole-log view. Imports only the standard library and this package's modules.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter
from typing import Any

from pytest_gpucluster.parsers.nccl_log.model import (
    COUNT_FACTS,
    EVENT_FACTS,
    SCALAR_FACTS,
    SET_FACTS,
    Connection,
    Fact,
    Facts,
    NcclLog,
)
from pytest_gpucluster.parsers.nccl_log.reader import Accumulator
from pytest_gpucluster.parsers.nccl_log.records import Key

__all__ = ["p2p_or_nvls_connections", "summarise"]

_by_line = attrgetter("evidence.line_no")


def p2p_or_nvls_connections(facts: Facts) -> tuple[Connection, ...]:
    """Every connection over P2P (IPC, CUMEM, direct pointer...) or NVLS, in log order.

    What a run meant to keep GPU traffic off NVLink (``NCCL_P2P_DISABLE=1``, ``NCCL_NVLS_ENABLE=0``)
    must not show: each connection quotes its line. P2P can also run over PCIe; on a run that
    disabled P2P any of it is a setting that did not take.
    """
    return tuple(c for c in facts.connections if c.family in ("P2P", "NVLS"))


def summarise(sources: dict[Key | None, Accumulator], nccl_lines: int) -> NcclLog:
    """Freeze every source, then the facts the ranks agree on (or the most of them state)."""
    sources = _merge_glued_hosts(sources)
    # A proxy thread's "[Proxy Service] Device 1 CPU core 8" under device [0] states nothing: not a rank.
    said = {k: acc for k, acc in sources.items() if k is None or acc.hits or acc.warnings or acc.errors}
    ranks = [acc.freeze(f"{k[0]}:{k[1]}[{k[2]}]") for k, acc in said.items() if k is not None]
    ranks.sort(key=lambda r: (r.rank is None, r.rank.value if r.rank else 0, r.key))
    unattributed = said[None].freeze("(no host:pid prefix)") if None in said else None
    everyone = [*ranks, *([unattributed] if unattributed else [])]
    agreed: dict[str, Any] = {name: _consensus([getattr(r, name) for r in everyone]) for name in SCALAR_FACTS}
    stated = [r.network for r in everyone if r.network and not r.network.note]
    if stated:  # a rank that says "Using network X" outweighs ranks whose network was inferred
        agreed["network"] = _consensus(stated)
    used = sorted((r.nvls_used for r in everyone if r.nvls_used and r.nvls_used.value), key=_by_line)
    if used:  # one rank that set NVLS up is enough to say the job used it
        agreed["nvls_used"] = used[0]
    for name in COUNT_FACTS:
        agreed[name] = max(
            (getattr(r, name) for r in everyone if getattr(r, name)), key=lambda f: f.value, default=None
        )
    for name in SET_FACTS:
        agreed[name] = _union([getattr(r, name) for r in everyone])
    for name in EVENT_FACTS:
        agreed[name] = tuple(sorted((f for r in everyone for f in getattr(r, name)), key=_by_line))
    agreed["connections"] = tuple(sorted((c for r in everyone for c in r.connections), key=_by_line))
    return NcclLog(**agreed, per_rank=tuple(ranks), unattributed=unattributed, nccl_lines=nccl_lines)


def _merge_glued_hosts(sources: dict[Key | None, Accumulator]) -> dict[Key | None, Accumulator]:
    """One source per process even where a record glued to another's half line read its host too long.

    ``...send 0.000proxmox:1495820:1495820 [1] NCCL INFO ...`` names host ``0.000proxmox``; the same
    pid and device elsewhere name ``proxmox``, so the two are one source under the shorter name.
    """
    keys = [k for k in sources if k is not None]
    merged = dict(sources)
    for key in sorted(keys, key=lambda k: len(k[0])):
        if key not in merged:
            continue
        for other in keys:
            if other in merged and other != key and other[1:] == key[1:] and other[0].endswith(key[0]):
                merged[key].absorb(merged.pop(other))
    return merged


def _consensus(facts: list[Fact | None]) -> Fact | None:
    """The value most sources state (ties: the earliest line), with its first evidence."""
    known = sorted((f for f in facts if f is not None), key=_by_line)
    if not known:
        return None
    counts = Counter(f.value for f in known)
    best = max(counts.values())
    return next(f for f in known if counts[f.value] == best)


def _union(groups: list[tuple[Fact, ...]]) -> tuple[Fact, ...]:
    """Each distinct value once, with the earliest line that states it."""
    first: dict[Any, Fact] = {}
    for fact in sorted((f for g in groups for f in g), key=_by_line):
        first.setdefault(fact.value, fact)
    return tuple(first.values())
