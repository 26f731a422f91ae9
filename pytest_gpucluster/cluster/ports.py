"""Rendezvous ports that concurrent jobs (pytest-xdist workers, parallel sessions) never share.

A fixed port collides as soon as two jobs start together: 3 of 8 concurrent launches failed
with ``EADDRINUSE`` or ``RendezvousConnectionError`` on one machine (FEASIBILITY §8), and two
jobs can even silently join each other's c10d store. Two defences, combined:

- every process draws from its own block of ports **below the kernel's ephemeral range**, so
  no port the kernel hands out to an outgoing connection (or to a ``bind(0)``) lands in it:
  xdist worker ``gwN`` owns block ``N``; a process outside xdist owns a block chosen from its
  pid among the remaining ones;
- a port is probed with a local ``bind`` before it is used, which catches a port held by
  something else on this machine (the rendezvous host is often this machine).

A remote rendezvous host cannot be probed from here; the per-process block is what keeps two
of our own jobs apart there. Single-node jobs don't need a port at all (``--standalone``
lets the kernel pick one).

Standard library only.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

__all__ = ["PortAllocator", "ephemeral_range", "next_port", "port_block", "probe_free"]

BASE_PORT = 20000
BLOCK_SIZE = 100
XDIST_BLOCKS = 64
"""Blocks 0..63 belong to xdist workers gw0..gw63; the rest are shared out by pid."""


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for ephemeral ports (32768-60999 on Linux by default)."""
    try:
        with open(path, encoding="ascii") as handle:
            low, high = (int(part) for part in handle.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def port_block(
    worker: str | None = None,
    pid: int | None = None,
    *,
    base: int = BASE_PORT,
    size: int = BLOCK_SIZE,
    ceiling: int | None = None,
) -> range:
    """This process's block of ports, from its xdist worker name (``gw3``) or its pid."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") if worker is None else worker
    ceiling = ephemeral_range()[0] if ceiling is None else ceiling
    nblocks = max((ceiling - base) // size, 1)
    index: int | None = None
    if worker and worker.startswith("gw") and worker[2:].isdigit():
        index = int(worker[2:]) % min(XDIST_BLOCKS, nblocks)
    if index is None:
        shared = nblocks - XDIST_BLOCKS
        pid = os.getpid() if pid is None else pid
        index = XDIST_BLOCKS + pid % shared if shared > 0 else pid % nblocks
    start = base + index * size
    return range(start, start + size)


def probe_free(port: int, host: str = "") -> bool:
    """True when ``port`` can be bound here right now (SO_REUSEADDR, as the c10d store binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortAllocator:
    """Hands out the ports of one block in turn, skipping those busy on this machine."""

    def __init__(self, block: range | None = None) -> None:
        self.block = port_block() if block is None else block
        self._cycle = itertools.cycle(self.block)
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            for _ in range(len(self.block)):
                port = next(self._cycle)
                if probe_free(port):
                    return port
        # Every port of the block is busy here: fall back to one the kernel picks.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])


_default: PortAllocator | None = None


def next_port() -> int:
    """A rendezvous port for the next job of this process."""
    global _default
    if _default is None:
        _default = PortAllocator()
    return _default.next()
