"""Which transport each channel used, whether NVLS was set up, and whether the network path uses GDR.

One job: read connection, NVLS and GPUDirect-RDMA lines into :class:`~.model.Connection` values and
facts, and decide GDR and NVLS use from them. Imports only the standard library and ``model``.

Connection lines, NCCL 2.3 to 2.28::

    Ring 00 : 0[0] -> 1[1] via P2P/IPC                                  (2.3-2.6)
    Channel 00 : 0[3000] -> 1[3000] [send] via NET/IB/0                 (2.7)
    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read                      (2.12+; /0 is the connection)
    Channel 01 : 12[8d000] -> 4[89000] [receive] via NET/IB/0/GDRDMA
    Channel 00 : 5[8e000] -> 4[89000] via P2P/direct pointer/read      (one process driving both GPUs)
    Channel 00 : 0[1] -> 1[2] via SHM/direct/direct                     (older: "via direct shared memory")
    CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA               (2.7: "Coll 00 : ...")

NVLS (NVLink SHARP) has two questions, kept apart: is it *supported* (``NVLS multicast support is
available on dev 0``, 2.17+) and was it *used* -- set up for this job's communicators: ``NVLS comm
0x... headRank ...``, ``NVLS Head  0:  0  8``, ``Connected NVLS tree``, ``16 nvls channels`` (a
line saying ``0 nvls channels`` is a job that did not use it). NCCL_P2P_DISABLE=1 does not turn NVLS
off, so a "slow path without NVLink" run must be checked for both P2P and NVLS connections.

GPUDirect RDMA is *in use for a network path* only where NCCL says so for one: a ``NET/<name>/<dev>/
GDRDMA`` or ``COLLNET/.../GDRDMA`` channel, ``GPU Direct RDMA Enabled for GPU <id> / HCA <n>``
(the per-GPU decision) or ``NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'``. Network channels
without ``GDRDMA`` mean it is not, whatever the other lines say. The ``GDR 1`` of 2.27's ``Connected
all rings, use ring PXN 0 GDR 1`` is not read: NCCL prints it on single-node jobs with no RDMA
network at all. Nor is ``GDRCOPY enabled`` (a different library).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from pytest_gpucluster.parsers.nccl_log.model import Connection, Evidence, Fact

__all__ = ["GdrLines", "decide_gdr", "nvls_line", "read_connection"]

_VIA = re.compile(r"^(?:Channel|Ring|Tree|CollNet|Coll|NVLS)\b.*?\bvia (\S.*?)\s*$")
_CHANNEL = re.compile(r"^(?:Channel|Ring|Tree|CollNet|Coll|NVLS) (\d+)")
_PEERS = re.compile(r"(\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[")
_NET_TAIL = re.compile(r"(.+?)/\d+(?:\(\d+\))?(/.*)?$")

_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available")
_NVLS_CHANNELS = re.compile(r"\b(\d+) nvls channels\b")
_NVLS_SETUP = re.compile(r"^NVLS comm |^NVLS Head\b|^Connected NVLS\b")

_GDR_PER_GPU = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for GPU\b")
_GDR_PER_HCA = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for HCA\b")
_GDR_OFI_OFF = re.compile(r"disabling GDR|GDR not supported|GDR disabled")


def transport_of(via: str) -> str:
    """``NET/IB/3(1)/GDRDMA`` -> ``NET/IB/GDRDMA``; ``P2P/CUMEM/read`` -> ``P2P/CUMEM``; ``SHM/direct/direct`` -> ``SHM``."""
    head, _, rest = via.partition("/")
    if head in ("NET", "COLLNET"):
        m = _NET_TAIL.match(rest)
        name, tail = (m.group(1), m.group(2) or "") if m else (rest.split("/")[0], rest)
        return ("NET/" if head == "NET" else "CollNet/") + name + ("/GDRDMA" if "GDRDMA" in tail else "")
    if head == "P2P":
        return "P2P/" + rest.split("/")[0]
    if head == "SHM" or "shared memory" in via:
        return "SHM"
    return head


def read_connection(msg: str, ev: Evidence) -> Connection | None:
    """The connection a channel line describes, or None for any other message."""
    if " via " not in msg or not (m := _VIA.search(msg)):
        return None
    channel = _CHANNEL.match(msg)
    peers = _PEERS.search(msg)
    return Connection(
        transport_of(m.group(1)),
        ev,
        int(channel.group(1)) if channel else None,
        (int(peers.group(1)), int(peers.group(2))) if peers else None,
    )


def nvls_line(msg: str, ev: Evidence) -> tuple[str, Fact] | None:
    """``("support", Fact(bool))`` or ``("used", Fact(bool))`` for an NVLS line, else None."""
    if "nvls" not in msg and "NVLS" not in msg:
        return None
    if m := _NVLS_SUPPORT.search(msg):
        return "support", Fact(m.group(1) is None, ev)
    if m := _NVLS_CHANNELS.search(msg):
        count = int(m.group(1))
        return "used", Fact(count > 0, ev, f"{count} NVLS channels")
    if _NVLS_SETUP.search(msg):
        return "used", Fact(True, ev, "NVLS set up")
    return None


@dataclass
class GdrLines:
    """GPUDirect RDMA lines of one rank, strongest kind first; the first line of each kind counts."""

    per_gpu: Fact | None = None
    per_hca: Fact | None = None
    ofi_off: Fact | None = None

    def read(self, msg: str, ev: Evidence) -> bool:
        """Record a GDR line; True when the message was one."""
        if "GDR" not in msg and "GPU Direct" not in msg:
            return False
        if m := _GDR_PER_GPU.search(msg):
            self.per_gpu = self.per_gpu or Fact(m.group(1) == "Enabled", ev)
        elif m := _GDR_PER_HCA.search(msg):
            self.per_hca = self.per_hca or Fact(m.group(1) == "Enabled", ev)
        elif _GDR_OFI_OFF.search(msg):
            self.ofi_off = self.ofi_off or Fact(False, ev)
        else:
            return False
        return True

    def absorb(self, other: GdrLines) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) or getattr(other, f.name))


def decide_gdr(connections: list[Connection], lines: GdrLines) -> Fact | None:
    """GDR in use for a network path: the channel lines decide when there are any, then NCCL's statements."""
    network = [c for c in connections if c.family in ("NET", "CollNet")]
    if gdr := next((c for c in network if c.gdr), None):
        return Fact(True, gdr.evidence, "a channel uses GDRDMA")
    stated = [f for f in (lines.per_gpu, lines.ofi_off, lines.per_hca) if f is not None]
    if network:  # not in use; quote NCCL's reason when it gave one
        reason = next((f for f in stated if not f.value), None)
        return reason or Fact(False, network[0].evidence, "network channels without GDRDMA")
    return stated[0] if stated else None
