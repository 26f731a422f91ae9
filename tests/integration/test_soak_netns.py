"""``pytest acceptance/test_fabric.py -m burnin --gpucluster-soak D`` between two network-namespace nodes.

Each test runs the acceptance file as a user does (a pytest of its own, in a subprocess, with
``--hostfile`` naming two namespaces of `pytest_gpucluster.testbed.netns` and the ``netns``
remote-exec template, one gloo rank per node) and reads what that run wrote to results.json:

- **link cut half-way**: when rank 0's progress line says half the soak has gone, the first node's
  link is throttled to 500 Mbit/s (``tc tbf``, both ways). The soak fails naming the node pair, and
  the recorded series shows the drop: samples before the cut above the floor, samples after it at
  or below what 500 Mbit/s can carry;
- **drops during the soak**: the first node has a second interface (``gpc1``, up, so it counts as
  one NCCL may use) behind a deliberately tiny tbf queue; half-way through, a burst of UDP overflows
  it. The queue's drops (``qdisc_drops``: on this kernel tbf drops show only there, never in
  /sys/class/net statistics) grow, and test_fabric_after fails naming that node and ``gpc1``, while
  the soak itself, on ``gpc0``, passes, and so do the fabric counters of both nodes' ``gpc0``: this
  run is the healthy case too (a healthy run of its own cost CI another ~30 s).

The soak lasts ``GPUCLUSTER_TEST_SOAK`` (default 10s, to keep CI short; the issue's 1-minute version
is ``GPUCLUSTER_TEST_SOAK=1m``). Each run costs the soak plus ~45 s of launches on the 2-core VM.

The soak is judged by cpu-local's own floors, on purpose (a healthy link passing them is the
subject). Measured with two busy loops beside the tests (load average 6.0-7.5, 3 runs of all
three): healthy 0.5 s samples 0.31-0.78 GB/s against the 0.175 GB/s floor (1.8x margin at the
lowest), CV 0.10-0.19 against 0.5; after the cut to 500 Mbit/s 0.057-0.064 GB/s (2.7x below).
Names are unique per xdist worker and process; the testbed removes the namespaces afterwards, and
a run that outlives its deadline is killed by its own process group.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.testbed.netns import (
    INTERFACE,
    NetnsTestbed,
    TestbedError,
    parse_rate,
    tbf_args,
)

pytestmark = pytest.mark.skipif(
    get_launcher("torchrun").available() is not None, reason="torch is not installed"
)

REPO = Path(__file__).resolve().parents[2]
SOAK = os.environ.get("GPUCLUSTER_TEST_SOAK", "10s")
CUT_RATE = "500mbit"
SIDE = "gpc1"
"""The first node's second interface, behind the tiny queue."""
PROGRESS = re.compile(r"soak (\d+):(\d\d) of (\d+):(\d\d)")
RUN_DEADLINE_S = 540.0
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")
BLAST = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(2000):
    s.sendto(b"x" * 100, (sys.argv[1], 9))
"""


@dataclass(frozen=True)
class SoakRun:
    returncode: int | None
    output: str
    results: dict[str, Any]
    acted_at: float | None
    """The soak's elapsed seconds (rank 0's progress line) when the action began; None: it never did."""
    acted_until: float | None
    """The same, when the action had finished (``acted_at`` plus the action's own time)."""
    progress_after_action: bool
    """A progress line came after the action finished: it happened during the soak."""

    def outcome(self, test: str) -> str:
        return next(t["outcome"] for t in self.results["outcomes"] if t["test_id"].endswith(f"::{test}"))

    def rows(self, metric: str) -> list[dict[str, Any]]:
        return [m for m in self.results["measurements"] if m["metric"] == metric]


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


@pytest.fixture
def bed() -> Iterator[NetnsTestbed]:
    with netns_bed_or_skip(2) as testbed:
        yield testbed


def _soak(bed: NetnsTestbed, tmp_path: Path, action: Callable[[], None] | None = None) -> SoakRun:
    """Run acceptance/test_fabric.py with the soak on; call ``action`` once half the soak has gone."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(bed.hostfile_text(slots=1))
    results = tmp_path / "results"
    template = shlex.join(bed.remote_exec_template)
    argv = [
        sys.executable, "-m", "pytest", "acceptance/test_fabric.py", "-m", "burnin", "-p", "no:cacheprovider",
        "-p", "no:xdist", "-s", "-rA", "--hw=cpu-local", f"--hostfile={hostfile}", "--nproc-per-node=1",
        f"--remote-exec={template}", f"--gpucluster-soak={SOAK}", f"--results-dir={results}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    env["PYTHONUNBUFFERED"] = "1"  # progress lines arrive as printed: the action's timing rests on them
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    watchdog = threading.Timer(RUN_DEADLINE_S, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    acted_at = acted_until = None
    after = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = PROGRESS.search(line)
            if found is None:
                continue
            elapsed = int(found[1]) * 60 + int(found[2])
            if action is not None and acted_at is None and elapsed * 2 >= int(found[3]) * 60 + int(found[4]):
                began = time.monotonic()
                action()
                acted_at, acted_until = float(elapsed), elapsed + time.monotonic() - began
            elif acted_at is not None:
                after = True
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(lines)
    print(output)
    path = results / "results.json"
    assert path.exists(), f"the acceptance run wrote no results.json (exit {proc.returncode}):\n{output}"
    return SoakRun(proc.returncode, output, json.loads(path.read_text()), acted_at, acted_until, after)


def _pair(bed: NetnsTestbed) -> str:
    return f"{bed.names[0]}<->{bed.names[1]}"


def test_a_link_cut_half_way_fails_the_soak_naming_the_pair_and_the_series_shows_it(
    bed: NetnsTestbed, tmp_path: Path
) -> None:
    start = time.monotonic()
    run = _soak(bed, tmp_path, action=lambda: bed.set_rate(bed.nodes[0], CUT_RATE))
    print(f"--gpucluster-soak={SOAK}, {bed.names[0]}'s link cut to {CUT_RATE} at {run.acted_at} s: "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip

    assert run.acted_at is not None and run.acted_until is not None and run.progress_after_action
    assert run.outcome("test_soak") == "failed"
    (lowest,) = run.rows("burnin.soak.busbw_min")
    assert (lowest["verdict"], lowest["labels"]["pair"]) == ("fail", _pair(bed))
    assert f"pair={_pair(bed)}" in run.output
    floor, times, values = lowest["threshold"], lowest["spread"]["times"], lowest["spread"]["values"]
    series = list(zip(times, values, strict=True))
    before = [v for t, v in series if t < run.acted_at - 1.0]  # a sample lasts 0.5 s or more
    assert before and statistics.median(before) > floor, (series, floor)
    # The series falls below the floor when the link was cut, and stays there: a sample runs a fixed
    # number of calls, so after the cut one sample can take seconds (a 10 s soak sees one or two).
    first_low = next(t for t, v in series if v < floor)
    assert run.acted_at - 1.0 <= first_low <= run.acted_until + 1.0, (series, run.acted_at)
    assert all(v < floor for t, v in series if t >= first_low), series
    # A 2-rank all_reduce moves its whole buffer over the link: busbw cannot beat the link's rate.
    assert values[-1] < parse_rate(CUT_RATE) / 8 * 1.2, series


def _add_side_link(bed: NetnsTestbed) -> str:
    """A second interface on the first node, to the switch namespace (not bridged), behind a tiny
    tbf queue; returns the far end's address."""
    node, peer = bed.names[0], f"s{uuid.uuid4().hex[:8]}"  # under 15 characters, unique
    _run(["ip", "-n", node, "link", "add", SIDE, "type", "veth", "peer", "name", peer, "netns", bed.switch])
    _run(["ip", "-n", node, "addr", "add", "10.99.0.1/24", "dev", SIDE])
    _run(["ip", "-n", bed.switch, "addr", "add", "10.99.0.2/24", "dev", peer])
    _run(["ip", "-n", bed.switch, "link", "set", peer, "up"])
    _run(["ip", "-n", node, "link", "set", SIDE, "up"])
    shape = tbf_args("1mbit", burst=1024, limit=1024)
    _run(["tc", "-n", node, "qdisc", "replace", "dev", SIDE, "root", *shape])
    return "10.99.0.2"


def test_queue_drops_that_grow_during_the_soak_fail_naming_node_and_interface(
    bed: NetnsTestbed, tmp_path: Path
) -> None:
    try:
        far_end = _add_side_link(bed)
    except TestbedError as exc:
        pytest.skip(f"no second interface with a tiny tbf queue could be made ({exc})")
    node = bed.names[0]
    blast = bed.exec_argv(node, [sys.executable, "-c", BLAST, far_end])
    start = time.monotonic()
    run = _soak(bed, tmp_path, action=lambda: _run(blast))
    print(f"--gpucluster-soak={SOAK}, 2000 datagrams into {node}/{SIDE}'s tiny queue at {run.acted_at} s: "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip

    assert run.acted_at is not None and run.progress_after_action, "the blast did not run during the soak"
    # The healthy soak: the soak's own link (gpc0) stayed healthy, so the soak passes on the pair and
    # so does everything else but test_fabric_after (this run is the healthy case's too: a run of its
    # own, without the side link, would repeat it for another ~30 s of CI).
    assert run.outcome("test_soak") == "passed", run.output
    failed = [t["test_id"] for t in run.results["outcomes"] if t["outcome"] == "failed"]
    assert [t.rpartition("::")[2] for t in failed] == ["test_fabric_after"], failed
    (lowest,) = run.rows("burnin.soak.busbw_min")
    assert lowest["verdict"] == "pass" and lowest["labels"]["pair"] == _pair(bed)
    assert lowest["spread"]["n"] == len(lowest["spread"]["times"]) >= 5
    (cv,) = run.rows("burnin.soak.busbw_cv")
    assert cv["verdict"] == "pass"
    soak_link = [m for m in run.rows("fabric.error_increase") if m["labels"]["device"] == INTERFACE]
    assert sorted(m["labels"]["node"] for m in soak_link) == sorted(bed.names), soak_link
    fabric = {(m["labels"]["node"], m["labels"]["device"], m["labels"]["counter"]): m
              for m in run.rows("fabric.error_increase")}  # fmt: skip
    (drops,) = [m for m in run.rows("fabric.drops") if (m["labels"]["node"], m["labels"]["device"],
                m["labels"]["counter"]) == (node, SIDE, "qdisc_drops")]  # fmt: skip
    # a drop-class counter, gated because cpu-local allows qdisc_drops 0 (fabric.allowed_increase)
    assert drops["verdict"] == "fail" and drops["value"] > 0
    assert drops["ref"]["key_path"] == ["fabric", "allowed_increase", "qdisc_drops"]
    assert all(m["verdict"] == "pass" for m in fabric.values()), fabric
    assert f"node {node}, interface {SIDE}: drop counter qdisc_drops grew by" in run.output
