"""``tc -s -j qdisc show dev <if>``: the queueing disciplines of an interface and their drop counts.

Why this exists: on Linux a packet dropped by a qdisc (a full ``tbf`` queue, a policer) is counted
in the qdisc's own statistics only; ``/sys/class/net/<if>/statistics/tx_dropped`` does not move
(measured on this project's VM, kernel 6.18, veth + ``tbf``: see ``workloads/fabric_probe.py``).
So the fabric reader keeps the root qdisc's ``drops`` next to the interface counters.

Pure: text in, dataclasses out; no subprocess, no pytest/torch imports.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpucluster.errors import ParseError

__all__ = ["Qdisc", "parse_tc_qdisc_json", "root_drops"]

_COUNTERS = ("bytes", "packets", "drops", "overlimits", "requeues", "backlog", "qlen")


@dataclass(frozen=True, slots=True)
class Qdisc:
    """One qdisc line of ``tc -s -j``: its kind (``tbf``, ``noqueue``, ``mq``...) and its counters."""

    kind: str
    handle: str | None
    root: bool
    parent: str | None
    bytes: int
    packets: int
    drops: int
    overlimits: int
    requeues: int
    backlog: int
    qlen: int


def parse_tc_qdisc_json(text: str, source: str = "tc -s -j qdisc show") -> tuple[Qdisc, ...]:
    """Parse the JSON array ``tc -s -j qdisc show dev X`` prints (iproute2 >= 4.x).

    Counters absent from an entry read 0 (``tc`` omits them for qdiscs that keep no statistics).
    Raises :class:`ParseError` naming ``source`` when the text is not that array.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"{source}: not JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); "
            "expected the array printed by 'tc -s -j qdisc show dev <if>'"
        ) from None
    if not isinstance(data, list) or not all(isinstance(q, dict) for q in data):
        raise ParseError(f"{source}: expected a JSON array of qdisc objects, got {type(data).__name__}")
    out: list[Qdisc] = []
    for n, entry in enumerate(data):
        if not isinstance(entry.get("kind"), str):
            raise ParseError(f"{source}: qdisc #{n} has no 'kind'; got keys {sorted(entry)}")
        values = {}
        for key in _COUNTERS:
            value = entry.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ParseError(
                    f"{source}: qdisc #{n} ({entry['kind']}) {key!r} is {value!r}, expected an integer"
                )
            values[key] = value
        out.append(
            Qdisc(
                kind=entry["kind"],
                handle=entry.get("handle"),
                root=bool(entry.get("root", False)),
                parent=entry.get("parent"),
                **values,
            )
        )
    return tuple(out)


def root_drops(qdiscs: Sequence[Qdisc]) -> int | None:
    """Drops counted by the root qdisc, which include those of its children; None when there is no root.

    Summing every qdisc would count a child's drops twice under a classful root (``mq``, ``htb``).
    """
    roots = [q for q in qdiscs if q.root]
    return sum(q.drops for q in roots) if roots else None
