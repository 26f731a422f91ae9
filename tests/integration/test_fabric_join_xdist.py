"""The pairwise burn-in's fabric join on the real acceptance suite under ``pytest -n 2``, with the
before-scan and the localization in different xdist workers, and without the before-scan.

Four network-namespace nodes joined with an ibsim fabric whose HCAs belong to those hosts (as
test_fabric_localize_netns: nodes 0 and 1 under leaf-r0-01, nodes 2 and 3 under leaf-r0-02, whose
links are throttled with ``tc tbf``). ``acceptance/test_fabric.py::test_fabric_before`` and
``acceptance/test_burnin.py::test_pairwise_localization`` run as a user runs them (a pytest of
their own, ``--hostfile`` naming the namespaces, ``GPUCLUSTER_IB_TOOL_PREFIX`` the simulator's):

- ``-n 2 --dist loadscope`` puts each module in its own worker, so the model written by
  test_fabric_before in one process reaches the localization in the other only through the
  results directory (``results/handoff.py``; pytest's stash, as before, would not): the run
  records ``fabric.ib.path`` naming leaf-r0-02 and drains neither of its nodes.
- the localization alone (one process: where the tests run does not matter once one of them is
  not in the run): slow pairs and no before-scan to join them with are a NOT MEASURED
  ``fabric.ib.path`` saying that test_fabric_before is not in the run; never a silent
  localization without the model.

The profile is cpu-local with the pairwise tolerance at 300%, as test_fabric_localize_netns
measured it (a throttled pair runs ~12x below the slowest healthy pair seen on a loaded CI VM).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_bed import netns_bed_or_skip

from pytest_gpucluster.fabric_scan import TOOL_PREFIX_ENV
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate
from pytest_gpucluster.testbed.ibsim import IbSim, missing_tools
from pytest_gpucluster.testbed.netns import NetnsTestbed, TestbedError

pytestmark = [
    pytest.mark.skipif(
        bool(missing_tools()), reason=f"no simulated IB fabric: not installed: {', '.join(missing_tools())}"
    ),
    pytest.mark.skipif(get_launcher("torchrun").available() is not None, reason="torch is not installed"),
]

REPO = Path(__file__).resolve().parents[2]
RATE = "100mbit"
PROFILE = """\
name: cpu-fabric-join
description: cpu-local with the pairwise tolerance measured for throttled namespace links
extends: cpu-local
burnin:
  straggler_tolerance: 300%
  load_duration: 1s   # the health job only feeds the pairwise test's "slow alone" check here
"""
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")
PAIRWISE = "acceptance/test_burnin.py::test_pairwise_localization"
BEFORE = "acceptance/test_fabric.py::test_fabric_before"


@pytest.fixture
def bed() -> Iterator[NetnsTestbed]:
    with netns_bed_or_skip(4) as bed:
        yield bed


def _acceptance(
    bed: NetnsTestbed, tmp_path: Path, prefix: list[str], name: str, *args: str, xdist: bool = True
) -> tuple[str, dict]:
    thresholds = tmp_path / "thresholds"
    thresholds.mkdir(exist_ok=True)
    (thresholds / "cpu-fabric-join.yaml").write_text(PROFILE)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(bed.hostfile_text(slots=1))
    results = tmp_path / name
    argv = [
        sys.executable, "-m", "pytest", "acceptance/test_fabric.py", "acceptance/test_burnin.py",
        "-m", "burnin", *(("-n", "2") if xdist else ("-p", "no:xdist")), "-v", "-rA", "-p", "no:cacheprovider",
        "--hw=cpu-fabric-join",
        f"--thresholds-dir={thresholds}", f"--hostfile={hostfile}", "--nproc-per-node=1",
        f"--remote-exec={shlex.join(bed.remote_exec_template)}", f"--results-dir={results}", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    env.update(PYTHONPATH=str(REPO), **{TOOL_PREFIX_ENV: shlex.join(prefix)})
    start = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=540, check=False)
    out = done.stdout + done.stderr
    print(f"{name}: exit {done.returncode} in {time.monotonic() - start:.0f} s")
    path = results / "results.json"
    assert path.exists(), out[-4000:]
    return out, json.loads(path.read_text())


def _worker(out: str, test: str) -> str:
    """The xdist worker that ran ``test`` (``-v`` prints ``[gw0] PASSED <node id>``)."""
    line = next((x for x in out.splitlines() if test in x and x.startswith("[gw")), "")
    assert line, f"no worker line for {test} in:\n{out[-4000:]}"
    return line.split("]", 1)[0] + "]"


def _rows(data: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [m for m in data["measurements"] if m["metric"] == metric]


def test_the_before_scan_reaches_the_localization_in_another_worker_and_its_absence_is_not_measured(
    bed: NetnsTestbed, tmp_path: Path
) -> None:
    names = list(bed.names)
    spec = TopologySpec(nodes=4, rails=1, nodes_per_leaf=2, spines=2, speed=4, hosts=tuple(names))
    try:
        for node in names[2:]:
            bed.set_rate(node, RATE)
    except TestbedError as exc:
        pytest.skip(f"cannot throttle the namespace links here: {exc}")
    with IbSim(generate(spec).text(), tmp_path / "ibsim", sm=False) as sim:
        out, data = _acceptance(
            bed, tmp_path, list(sim.prefix), "joined", "--dist", "loadscope",
            "-k", "fabric_before or pairwise_localization",
        )  # fmt: skip
        # the two tests ran in different processes: the join went through the results directory
        assert _worker(out, BEFORE) != _worker(out, PAIRWISE), out[-4000:]
        record = json.loads((tmp_path / "joined" / "fabric-scan-before.json").read_text())
        assert record["written_by"] == BEFORE and record["value"]["model"] is not None
        (path,) = _rows(data, "fabric.ib.path")
        print(
            f"{BEFORE} in {_worker(out, BEFORE)}, {PAIRWISE} in {_worker(out, PAIRWISE)}: {path.get('hint')}"
        )
        assert (path["verdict"], path["labels"]) == ("fail", {"device": "leaf leaf-r0-02"}), out[-4000:]
        outcomes = {o["test_id"].split("@")[0]: o["outcome"] for o in data["outcomes"]}
        assert outcomes[BEFORE] == "passed" and outcomes[PAIRWISE] == "failed"
        leaf = [f for f in data["findings"] if f["metric"] == "fabric.ib.path"]
        assert [(f["reason"], f["action"]) for f in leaf] == [("hardware", "reseat/replace cable or NIC")]
        drain = json.loads((tmp_path / "joined" / "suspects.json").read_text())
        assert drain["drain_commands"] == [] and drain["suspects"] == []  # the leaf, not its nodes

        # the localization alone: the same slow pairs, no before-scan to join them with
        # (in one process: where the two tests run does not matter when one of them is not in the run)
        out, data = _acceptance(
            bed, tmp_path, list(sim.prefix), "alone", "-k", "pairwise_localization", xdist=False
        )
    (gap,) = _rows(data, "fabric.ib.path")
    assert gap["verdict"] == "fail" and gap.get("problem") == "not measured", gap
    assert "no fabric before-scan: test_fabric_before is not among this run's tests" in gap["hint"]
    print(f"without {BEFORE}: fabric.ib.path NOT MEASURED: {gap['hint']}")
    (finding,) = [f for f in data["findings"] if f["metric"] == "fabric.ib.path"]
    assert (finding["reason"], finding["action"]) == ("not measured", "rerun")
    assert "fabric localization NOT MEASURED" in out  # the warning, in the controller's summary
    assert not (tmp_path / "alone" / "fabric-scan-before.json").exists()
