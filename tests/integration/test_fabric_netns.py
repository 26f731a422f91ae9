"""A drop counter that grows for real between two network-namespace "nodes", read by the fabric probe.

Two namespaces on a bridge stand in for two nodes (`pytest_gpucluster.testbed.netns`). Node A's link
gets a deliberately tiny ``tbf`` queue (``rate 1mbit burst 1024 limit 1024``, both ways); UDP sent
from A to B overflows it. The probe
runs inside each namespace exactly as on a node (``ip netns exec NS python -m
pytest_gpucluster.workloads.fabric_probe --qdisc``), before and after, and the diff must report the
growth as an *error* naming the node (the namespace) and the interface.

On this project's VM (kernel 6.18) the drops are counted by the qdisc only; the interface's
``statistics/tx_dropped`` does not move (see ``workloads/fabric_probe.py``). The test prints both,
so a kernel that behaves otherwise shows it.

Names are unique per xdist worker and process; the testbed removes the namespaces afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.parsers.fabric_diff import diff_snapshots
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, parse_snapshot
from pytest_gpucluster.testbed.netns import INTERFACE, TestbedError

IFACE = INTERFACE
BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, sent = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    s.sendto(b"x" * 100, (sys.argv[1], 9))
    sent += 1
print(sent)
"""


@dataclass(frozen=True)
class TwoNodes:
    a: str
    b: str
    addr_b: str


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    with netns_bed_or_skip(2) as bed:
        try:  # node A's link: a tiny queue that UDP from A overflows
            bed.set_rate(bed.nodes[0], "1mbit", burst=1024, limit=1024)
        except TestbedError as exc:
            pytest.skip(f"tc refused the tbf qdisc ({exc}), so no queue drops can be made")
        yield TwoNodes(bed.names[0], bed.names[1], bed.nodes[1].address)


def probe(ns: str) -> FabricSnapshot:
    """Run the rank-side reader inside the namespace, as on a node, and parse what it printed."""
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "pytest_gpucluster.workloads.fabric_probe"]
    done = _run([*argv, "--qdisc", "--node", ns, "--interface", IFACE], timeout=60)
    assert done.returncode == 0, done.stderr
    return parse_snapshot(json.loads(done.stdout), source=f"probe in {ns}")


def test_tbf_queue_drops_between_two_namespace_nodes_are_an_error_naming_node_and_interface(two_nodes):
    before_a, before_b = probe(two_nodes.a), probe(two_nodes.b)
    blast = _run(["ip", "netns", "exec", two_nodes.a, sys.executable, "-c", BLAST, two_nodes.addr_b, "2"], 60)
    assert blast.returncode == 0, blast.stderr
    after_a, after_b = probe(two_nodes.a), probe(two_nodes.b)

    diff = diff_snapshots(before_a, after_a)
    print(f"sent {blast.stdout.strip()} datagrams from {two_nodes.a}")
    print("\n".join(c.describe() for c in diff.changes))

    errors = diff.errors()
    assert errors, f"no error counter grew on {two_nodes.a}/{IFACE}: " + "; ".join(
        c.describe() for c in diff.changes
    )
    drops = next(c for c in errors if c.counter == "qdisc_drops")
    assert (drops.node, drops.device, drops.port, drops.kind) == (two_nodes.a, IFACE, None, "error")
    assert drops.increase is not None and drops.increase > 0
    assert drops.describe().startswith(f"{two_nodes.a} {IFACE}: qdisc_drops +")
    # Traffic did flow (tbf let some through), and is not counted as an error.
    assert any(c.counter == "tx_packets" and c.kind == "traffic" for c in diff.changes)

    (iface,) = after_a.interfaces
    print(
        f"{two_nodes.a}/{IFACE}: statistics tx_dropped={iface.counters.get('tx_dropped')}, "
        f"tx_errors={iface.counters.get('tx_errors')}, qdisc_drops={iface.counters['qdisc_drops']}"
    )
    # The receiving node saw no errors: the drops happened in A's queue, not on the wire.
    assert diff_snapshots(before_b, after_b).errors() == ()
