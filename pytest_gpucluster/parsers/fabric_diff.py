"""What changed on the fabric between two snapshots: per-port counter increases, errors named as such.

The burn-in reads every port before and after the collective work; :func:`diff_snapshots` says which
counters grew, by how much, and whether that counter is an *error* (symbol errors, link downed,
receive errors, drops...), *traffic* (data, packets) or *other* (wait time, congestion signals,
configuration values such as ``hw_counters/lifespan``). Three cases are explicit, never silent:

- a counter that went **down** (reset by ``perfquery -R``, a driver reload, a 32-bit wrap): its
  increase is unknown; ``went_down`` is set and ``at_least`` is the value after (what has certainly
  happened since the reset);
- a counter **pinned at its maximum** (IB error counters saturate: ``link_downed`` at 255,
  ``port_xmit_discards`` at 65535): growth during the window cannot be seen; ``saturated`` is set;
- a port or interface present in one snapshot only: listed in ``appeared``/``disappeared``.

Pure: no I/O, no pytest/torch imports. The verdict (how many errors are allowed) belongs to checks/.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, IbPort, NetInterface

__all__ = [
    "COUNTER_CLASSES",
    "ERROR_COUNTERS",
    "SATURATING_BITS",
    "TRAFFIC_COUNTERS",
    "CounterChange",
    "FabricDiff",
    "counter_class",
    "counter_kind",
    "diff_ports",
    "diff_snapshots",
]

CounterKind = Literal["error", "traffic", "other"]
CounterClass = Literal["link", "ber", "transport", "retransmit", "drop", "traffic", "other"]
"""How growth of a counter is judged (``checks/fabric.py``; docs/explanation/faults-by-cause.md):
``link`` — a fault of the link or the port's integrity: gated at zero growth; ``ber`` — symbol
errors, judged as a rate per bit the port received against a bit-error-rate floor
(``fabric.max_bit_error_rate``, 1e-12 by default), never at zero; ``transport`` — a work request
completed in error (a completion, remote-access or RNR-retry error): a healthy NIC counts these
when its peer is killed mid-transfer, so they are judged at zero growth only in a window where the
suite killed no job, and recorded with a warning otherwise; ``retransmit`` —
the transport recovered by resending (or reordering): gated as a rate per GB the port moved;
``drop`` — packets dropped by design on healthy hosts too: recorded and shown, gated only where a
profile sets an allowance; ``traffic`` and ``other``: recorded only."""

COUNTER_CLASSES: Mapping[str, CounterClass] = {
    # IBTA PortCounters (sysfs counters/): symbol and link errors, recoveries, integrity
    # (IBTA vol. 1, 16.1.3.5 PortCounters; Linux Documentation/ABI/stable/sysfs-class-infiniband).
    # After FEC on EDR/HDR/NDR links ("symbol errors ... are the actual errors seen by the application
    # level after error correction": NVIDIA ibdiagnet user manual, "Bit Error Rate (BER)", whose BER
    # test's default threshold is 10^-12): a rate per bit, not a count at zero.
    "symbol_error": "ber",
    "link_error_recovery": "link",
    "link_downed": "link",
    "port_rcv_errors": "link",
    "port_rcv_remote_physical_errors": "link",
    "port_rcv_switch_relay_errors": "link",
    "port_xmit_constraint_errors": "link",
    "port_rcv_constraint_errors": "link",
    "local_link_integrity_errors": "link",
    "excessive_buffer_overrun_errors": "link",
    # mlx5 hw_counters/ that mean a corrupt packet: NVIDIA "Understanding mlx5 Linux Counters".
    "hw_rx_icrc_encapsulated": "link",
    # mlx5 hw_counters/ of a failed transport operation (a work request completed in error; the same
    # NVIDIA page; Linux drivers/infiniband/hw/mlx5/counters.c). A peer killed mid-transfer makes a
    # healthy NIC count them, as does an RNR NAK retried past the QP's limit (rnr_nak_retry_err:
    # "the number of received RNR NAK packets that exceeded the retry limit": the operation failed,
    # it was not recovered).
    "hw_req_cqe_error": "transport",
    "hw_resp_cqe_error": "transport",
    "hw_req_remote_access_errors": "transport",
    "hw_resp_remote_access_errors": "transport",
    "hw_req_remote_invalid_request": "transport",
    "hw_resp_local_length_error": "transport",
    "hw_rnr_nak_retry_err": "transport",
    # mlx5 hw_counters/ the transport recovers from by retransmitting, or that count reordering,
    # which adaptive routing causes by design ("The QP retry limit was not exceeded": the same
    # NVIDIA page; MLNX_OFED "Out-of-Order (OOO) Data Placement" for adaptive routing).
    "hw_local_ack_timeout_err": "retransmit",
    "hw_packet_seq_err": "retransmit",
    "hw_out_of_sequence": "retransmit",
    "hw_implied_nak_seq_err": "retransmit",
    "hw_duplicate_request": "retransmit",
    "hw_roce_adp_retrans": "retransmit",
    "hw_roce_adp_retrans_to": "retransmit",
    # Drops: IBTA PortXmitDiscards (port down or congested), VL15 (subnet-management packets),
    # mlx5 out_of_buffer (no receive WQE posted); Linux netdev rx_dropped/tx_dropped grow on
    # healthy hosts (frames of an unknown protocol such as LLDP, a bad VLAN tag: if_link.h
    # "rx_dropped ... packets dropped ... e.g. due to lack of buffer space, unsupported protocol");
    # rx_missed_errors is folded into rx_dropped (if_link.h); the root qdisc's drops (tc -s).
    "port_xmit_discards": "drop",
    "VL15_dropped": "drop",
    "hw_out_of_buffer": "drop",
    "rx_dropped": "drop",
    "tx_dropped": "drop",
    "rx_missed_errors": "drop",
    "qdisc_drops": "drop",
    # /sys/class/net/<if>/statistics/ errors (if_link.h: the *_errors below are folded into
    # rx_errors/tx_errors, which count frames lost to a fault of the link or the NIC).
    "rx_errors": "link",
    "tx_errors": "link",
    "rx_crc_errors": "link",
    "rx_frame_errors": "link",
    "rx_fifo_errors": "link",
    "rx_over_errors": "link",
    "rx_length_errors": "link",
    "tx_aborted_errors": "link",
    "tx_carrier_errors": "link",
    "tx_fifo_errors": "link",
    "tx_heartbeat_errors": "link",
    "tx_window_errors": "link",
    "collisions": "link",
}
"""The class of every counter that is judged; the table of docs/explanation/counters-and-xids.md is this one. ``hw_*_flush_error``
counters are left out on purpose (``other``): they count work requests flushed when a queue pair
is torn down, which follows any error and also a clean teardown with work outstanding."""

ERROR_COUNTERS: frozenset[str] = frozenset(
    name for name, cls in COUNTER_CLASSES.items() if cls in ("link", "ber", "transport", "retransmit", "drop")
)
"""Counters whose growth needs a look (``FabricDiff.errors``): every counter of a judged class."""

TRAFFIC_COUNTERS: frozenset[str] = frozenset(
    {
        "port_xmit_data",  # in units of 4 bytes (IB "octets divided by 4")
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
        "rx_bytes",
        "tx_bytes",
        "rx_packets",
        "tx_packets",
        "multicast",
        "rx_compressed",
        "tx_compressed",
        "hw_rx_write_requests",
        "hw_rx_read_requests",
        "hw_rx_atomic_requests",
    }
)

SATURATING_BITS: Mapping[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}
"""IBTA PortCounters widths. These counters stop at their maximum instead of wrapping, so a counter
read at 2**bits - 1 can no longer show growth (gpud's recorded H100 port: link_downed 255,
port_xmit_discards 65535, excessive_buffer_overrun_errors 15). Only IB ports: netdev names differ."""


def counter_class(name: str) -> CounterClass:
    """The class of a counter (:data:`COUNTER_CLASSES`), ``traffic`` or ``other``."""
    if name in COUNTER_CLASSES:
        return COUNTER_CLASSES[name]
    return "traffic" if name in TRAFFIC_COUNTERS else "other"


def counter_kind(name: str) -> CounterKind:
    """``"error"``, ``"traffic"`` or ``"other"`` for a counter name as the parsers key it."""
    if name in ERROR_COUNTERS:
        return "error"
    if name in TRAFFIC_COUNTERS:
        return "traffic"
    return "other"


@dataclass(frozen=True, slots=True)
class CounterChange:
    """One counter of one port that changed (or could not be compared) between two readings."""

    node: str | None
    device: str
    port: int | None  # None for a network interface
    counter: str
    kind: CounterKind
    before: int
    after: int
    increase: int | None  # None when the counter went down: the true increase is unknown
    went_down: bool = False
    saturated: bool = False

    @property
    def counter_class(self) -> CounterClass:
        return counter_class(self.counter)

    @property
    def at_least(self) -> int:
        """What certainly happened in the window: the increase, or after a reset the value since it."""
        return self.increase if self.increase is not None else self.after

    @property
    def where(self) -> str:
        port = "" if self.port is None else f" port {self.port}"
        node = f"{self.node} " if self.node else ""
        return f"{node}{self.device}{port}"

    def describe(self) -> str:
        if self.went_down:
            return (
                f"{self.where}: {self.counter} went down from {self.before} to {self.after} "
                "(reset or wrap): the increase in the window is unknown"
            )
        text = f"{self.where}: {self.counter} +{self.increase} ({self.before} -> {self.after})"
        if self.saturated:
            text += f"; it is pinned at its maximum {self.after}, so further growth cannot be seen"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "device": self.device,
            "port": self.port,
            "counter": self.counter,
            "kind": self.kind,
            "class": self.counter_class,
            "before": self.before,
            "after": self.after,
            "increase": self.increase,
            "went_down": self.went_down,
            "saturated": self.saturated,
        }


@dataclass(frozen=True, slots=True)
class FabricDiff:
    """Counter changes between two snapshots, and the ports found in one of them only."""

    changes: tuple[CounterChange, ...]
    appeared: tuple[str, ...] = ()
    disappeared: tuple[str, ...] = ()

    def errors(self) -> tuple[CounterChange, ...]:
        """Error counters that grew, went down (unknown growth) or sit saturated: each needs a look."""
        return tuple(
            c for c in self.changes if c.kind == "error" and (c.at_least > 0 or c.went_down or c.saturated)
        )

    def of_kind(self, kind: CounterKind) -> tuple[CounterChange, ...]:
        return tuple(c for c in self.changes if c.kind == kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": [c.to_json() for c in self.changes],
            "errors": [c.describe() for c in self.errors()],
            "appeared": list(self.appeared),
            "disappeared": list(self.disappeared),
        }


def _compare(
    node: str | None,
    device: str,
    port: int | None,
    before: Mapping[str, int],
    after: Mapping[str, int],
    ib: bool,
) -> list[CounterChange]:
    out: list[CounterChange] = []
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        bits = SATURATING_BITS.get(name) if ib else None
        saturated = bits is not None and new >= (1 << bits) - 1
        if old == new and not saturated:
            continue
        went_down = new < old
        out.append(
            CounterChange(
                node=node,
                device=device,
                port=port,
                counter=name,
                kind=counter_kind(name),
                before=old,
                after=new,
                increase=None if went_down else new - old,
                went_down=went_down,
                saturated=saturated,
            )
        )
    return out


def diff_ports(before: Iterable[IbPort | NetInterface], after: Iterable[IbPort | NetInterface]) -> FabricDiff:
    """Compare ports matched by (node, device, port); interfaces by (node, name)."""
    old = {(type(p).__name__, *p.key): p for p in before}
    new = {(type(p).__name__, *p.key): p for p in after}
    changes: list[CounterChange] = []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        if isinstance(a, IbPort):
            changes += _compare(a.node, a.device, a.port, a.counters, b.counters, ib=True)
        else:
            changes += _compare(a.node, a.name, None, a.counters, b.counters, ib=False)

    def label(key: tuple[str, ...]) -> str:
        _kind, node, device, port = key
        return f"{node + ' ' if node else ''}{device}{' port ' + port if port else ''}"

    return FabricDiff(
        changes=tuple(changes),
        appeared=tuple(label(k) for k in sorted(set(new) - set(old))),
        disappeared=tuple(label(k) for k in sorted(set(old) - set(new))),
    )


def diff_snapshots(before: FabricSnapshot, after: FabricSnapshot) -> FabricDiff:
    """Per-port counter changes between two snapshots of the same node (or of many, matched by node)."""
    return diff_ports((*before.ib_ports, *before.interfaces), (*after.ib_ports, *after.interfaces))
