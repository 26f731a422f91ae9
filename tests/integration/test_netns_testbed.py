"""The network-namespace testbed itself: nodes reach each other by name from their own hostnames,
a controller namespace reaches them, a node's link rate caps a real TCP transfer and can be changed
while the testbed runs, the interface counters count it, and closing leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from netns_bed import netns_bed_or_skip

# Receives one connection on port 5001 and prints how many bytes came, and how long from the
# first byte to the last (the receiver's clock: what the link let through).
RECEIVER = """
import json, socket, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 5001))
server.listen()
print("listening", flush=True)
conn, _ = server.accept()
first = last = None
total = 0
while True:
    data = conn.recv(1 << 16)
    if not data:
        break
    now = time.monotonic()
    first = first or now
    last = now
    total += len(data)
print(json.dumps({"bytes": total, "seconds": (last or 0) - (first or 0)}), flush=True)
"""


@pytest.fixture(scope="module")
def bed():
    with netns_bed_or_skip(2, controller=True, rates={1: "20mbit"}) as testbed:
        yield testbed


def _run_in(bed, node, code: str) -> str:
    done = subprocess.run(
        bed.exec_argv(node, [sys.executable, "-c", code]), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _send(bed, sender: str, receiver: str, size: int) -> dict:
    server = subprocess.Popen(
        bed.exec_argv(receiver, [sys.executable, "-c", RECEIVER]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout.readline().strip() == "listening"
        _run_in(
            bed,
            sender,
            f"import socket; s = socket.create_connection(({receiver!r}, 5001)); s.sendall(b'x' * {size}); s.close()",
        )
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    return json.loads(out.strip().splitlines()[-1])


def test_nodes_have_their_own_hostnames_and_reach_each_other_by_name(bed):
    assert len(bed.names) == 2 and len(set(bed.names)) == 2
    for name in (*bed.names, bed.controller.name):
        assert _run_in(bed, name, "import socket; print(socket.gethostname())").strip() == name
    # The controller (a login node) resolves and reaches a node through the bridge.
    code = f"import socket; print(socket.gethostbyname({bed.names[0]!r}))"
    assert _run_in(bed, bed.controller, code).strip() == bed.nodes[0].address
    assert bed.hostfile_text(2) == f"{bed.names[0]} slots=2\n{bed.names[1]} slots=2\n"


def test_a_throttled_link_caps_a_transfer_and_its_rate_changes_at_runtime(bed):
    size = 1_000_000
    before = bed.counters(bed.names[1])
    got = _send(bed, bed.names[1], bed.names[0], size)
    after = bed.counters(bed.names[1])
    assert got["bytes"] == size
    # 8 Mbit through a 20 Mbit/s bucket: 0.4 s, less the 32 KiB the bucket lets through at once.
    # A slower machine can only make it slower; the limit is what makes it this slow.
    assert got["seconds"] >= 0.3, got
    assert after.tx_bytes - before.tx_bytes >= size
    assert after.tx_packets > before.tx_packets

    bed.set_rate(bed.names[1], "2gbit")
    shown = subprocess.run(
        ["tc", "-n", bed.names[1], "qdisc", "show", "dev", "gpc0"], capture_output=True, text=True
    )
    assert "rate 2Gbit" in shown.stdout
    switch_side = subprocess.run(
        ["tc", "-n", bed.switch, "qdisc", "show", "dev", bed.nodes[1].switch_port],
        capture_output=True,
        text=True,
    )
    assert "rate 2Gbit" in switch_side.stdout  # both directions of the link
    bed.set_rate(bed.names[1], None)
    shown = subprocess.run(
        ["tc", "-n", bed.names[1], "qdisc", "show", "dev", "gpc0"], capture_output=True, text=True
    )
    assert "tbf" not in shown.stdout
    bed.set_rate(bed.names[1], "20mbit")


def test_closing_removes_the_namespaces_their_hosts_files_and_what_runs_inside():
    with netns_bed_or_skip(1) as testbed:
        names = [testbed.switch, *testbed.names]
        sleeper = subprocess.Popen(testbed.exec_argv(testbed.names[0], ["sleep", "300"]))
    assert sleeper.wait(timeout=10) < 0  # killed by close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    assert not Path(f"/etc/netns/{testbed.names[0]}").exists()
