"""Does the suite name every planted fault with the right node and action, and blame no healthy node?

Each fault class is planted through a real seam, and a healthy variation of the same class beside
it (the thing that looks like a fault and is not one), judged by the project's own functions:

- **XIDs** (checks/burnin/health.py): recorded kernel-log lines read by the real parser, matched to
  their GPU by PCI address; Xid 79 and Xid 109 planted, Xid 45 after a job the suite really killed
  (a real local job stopped at its deadline, its window recorded as results.json's ``jobs``) and
  Xid 13 as the healthy variations.
- **fabric counters** (checks/fabric.py): a recorded H100 node's sysfs tree read by the real probe,
  counters changed in a copy; completion errors with no kill and symbol errors at a bit error rate
  of 1.6e-10 planted; the same completion errors in a killed job's window, symbol errors at
  1.6e-14, and a saturated counter read without root (the probe run as uid 65534) as the healthy
  ones. Actions come from the findings ladder (results/findings.py), as the report gives them.
- **preflight** (cluster/preflight.py): recorded node readings; every selected HCA port DOWN on one
  node planted; a storage HCA outside NCCL_IB_HCA on the other.
- **health check** (``gpucluster health-check``, a subprocess, a recording ``scontrol`` on PATH):
  a recorded-node stand-in ``nvidia-smi`` with one GPU of eight cut out (drained); a timeout and an
  unknown ``--hw`` as the healthy variations (never drained).
- **a slow GPU and a cut link** (results fan-out, testbed/fanout.py): a real cpu-local results.json
  fanned out to 8 nodes x 8 GPUs, one GPU slowed to 0.6x and one port's error counter raised, then
  the report's findings; the same fan-out with nothing planted as the healthy variation.
- **a crashed rank** (network-namespace nodes, testbed/netns.py): a real 2-node job whose rank 1
  raises; the failed test's findings name that node. A clean job beside it. Skipped, and said, where
  namespaces cannot be made.
- **a lost GPU** (the real suite: acceptance/test_burnin.py's counter tests under ``--hw=auto``,
  tests/integration/counter_suite_run.py): this machine's node described to the stand-in NVML as
  two H200s, GPU 1 answering ``NVMLError_GpuIsLost`` after the before reading; named when the run's
  findings give this host and that GPU "reset GPU" and it signs NOT FIT. Every GPU read again is
  the healthy variation.
- **a GPU with no measurement, re-judged** (``gpucluster report``, results/rejudge.py): the real
  H200 quick run fanned out to 8 nodes, every measurement of node004's GPU 0 removed; named when
  the report signs NOT FIT, lists that GPU NOT MEASURED and its sign-off line names node004 with
  the ladder's rung for a value not measured, "rerun". The whole fan-out is the healthy variation.
- **before/after tests split across xdist workers** (the real suite's fabric pair,
  acceptance/test_fabric.py): the before reading reaches the after test through the results
  directory (results/handoff.py), so a split is healthy: ``-n 2`` (grouped by acceptance/conftest.py)
  and ``-n 2 --dist worksteal`` (which ignores the group and hands each worker one test) must both
  measure and sign FIT. Planted: the after test with its before test not in the run (``-k
  fabric_after`` under ``-n 2``): no reading to compare with, a fault of the run, not of a node, so
  it is named when the after test fails NOT MEASURED saying why, the sign-off is not FIT and the
  findings give it to the cluster (no host) with "rerun". In every run a finding naming this host
  blames it.

Printed, each on its own line ending with its ratio:

    fault naming ratio (faults named with the right node and action / faults planted) ...  goal 1.0
    healthy blame ratio (healthy nodes blamed / healthy nodes) ...  goal 0.0

    python benchmarks/fault_campaign.py [--keep DIR] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from pytest_gpucluster.checks.burnin.health import application_xids, counter_increases  # noqa: E402
from pytest_gpucluster.checks.burnin.xid_classes import kill_windows  # noqa: E402
from pytest_gpucluster.checks.fabric import counter_checks  # noqa: E402
from pytest_gpucluster.parsers.fabric_ports import parse_snapshot  # noqa: E402
from pytest_gpucluster.profiles.schema import FabricSection  # noqa: E402
from pytest_gpucluster.results.findings import findings_of  # noqa: E402
from pytest_gpucluster.results.model import Check, Measurement, TestOutcome  # noqa: E402
from pytest_gpucluster.workloads import fabric_probe  # noqa: E402
from pytest_gpucluster.workloads._node_facts import parse_xid_lines  # noqa: E402

DATA = REPO / "tests" / "data"
LOGS = DATA / "kernel_logs"
H100 = DATA / "infiniband" / "sysfs_h100_gpud"

Named = set[tuple[str, str]]
"""(node, action) pairs a judgement named."""


@dataclass
class Outcome:
    case: str
    seam: str
    planted: list[tuple[str, str]] = field(default_factory=list)
    named: Named = field(default_factory=set)
    healthy: list[str] = field(default_factory=list)
    blamed: set[str] = field(default_factory=set)
    note: str = ""

    @property
    def found(self) -> int:
        return sum(1 for fault in self.planted if fault in self.named)

    @property
    def wrongly_blamed(self) -> int:
        return sum(1 for node in self.healthy if node in self.blamed)


# ----------------------------------------------------------------------------------- XIDs


def _gpu(host: str, rank: int, bus: str) -> dict:
    return {"host": host, "rank": rank, "nvml": {"pci_bus_id": bus, "gpu": f"GPU {rank} ({bus})"}}


def _killed_job_window() -> list:
    """A real local job the suite kills at its deadline, recorded as results.json's jobs."""
    from pytest_gpucluster.cluster.spec import ClusterSpec
    from pytest_gpucluster.errors import JobFailed
    from pytest_gpucluster.harness import Part, SharedJobs
    from pytest_gpucluster.launch import get_launcher
    from pytest_gpucluster.launch.job import Cluster

    jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="campaign-kill-") as tmp:
        cluster = Cluster(ClusterSpec.from_local(2, backend="gloo"), get_launcher("torchrun"), Path(tmp))
        hang = Part("hang", "pytest_gpucluster.workloads.basic:hang_on_rank", {"rank": 1}, timeout_s=5.0,
                    shareable=False)  # fmt: skip
        with contextlib.suppress(JobFailed):
            SharedJobs(cluster, on_job=jobs.append).run(hang, "fault_campaign")
    return kill_windows(jobs)


def xid_case() -> Outcome:
    out = Outcome("XIDs by NVIDIA's catalog class", "recorded kernel logs + a real killed job")
    windows = _killed_job_window()
    line_79 = parse_xid_lines((LOGS / "xid_79_fallen_off_bus_modal.log").read_text())[0]
    line_45 = parse_xid_lines((LOGS / "xid_45_four_gpus_journal_ogkm1150.log").read_text())[0]
    dmesg = parse_xid_lines((LOGS / "xid_13_109_dmesg_ctime_gpud46.log").read_text())
    when = windows[0].end if windows else time.time()
    nodes = {
        "node1": (_gpu("node1", 0, "00000000:DC:00.0"), [{**line_45, "time": when}]),  # a kill's Xid 45
        "node2": (_gpu("node2", 0, "00000000:C6:00.0"), [{**line_79, "time": when}]),  # fallen off the bus
        "node3": (_gpu("node3", 0, "00000000:CB:00.0"), [e for e in dmesg if e["xid"] == 109]),
        "node4": (_gpu("node4", 0, "00000000:CB:00.0"), [e for e in dmesg if e["xid"] == 13]),
    }
    before = [dict(v[0], xid_events=[]) for v in nodes.values()]
    after = [dict(v[0], xid_events=v[1]) for v in nodes.values()]
    suspects = counter_increases(before, after)
    warned = application_xids(before, after, windows)  # recorded checks, judged as the report would
    _, blamed_by_report = _judged(warned, list(nodes))
    out.planted = [("node2", "drain node"), ("node3", "reset GPU")]
    out.healthy = ["node1", "node4"]
    out.named = {(s.node, str(s.evidence.get("action"))) for s in suspects}
    out.blamed = {s.node for s in suspects} | blamed_by_report
    out.note = f"kill window from a real job: {'yes' if windows else 'NO'}"
    return out


# ----------------------------------------------------------------------------------- fabric


def _tree(base: Path, name: str, node_counters: dict[str, str]) -> Path:
    root = base / name
    shutil.copytree(H100, root)
    port = root / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    for counter, value in node_counters.items():
        group = "hw_counters" if counter.startswith("hw_") else "counters"
        (port / group / counter.removeprefix("hw_")).write_text(value + "\n")
    return root


def _read(root: Path, node: str):
    return parse_snapshot(fabric_probe.snapshot(root, node=node), f"{node} sysfs")


def _judged(checks: Iterable[Check], hosts: list[str], suspects=()) -> tuple[Named, set[str]]:
    now = time.time()
    measured = [
        Measurement.of(c, test_id="acceptance/test_fabric.py::test_fabric_after", time=now) for c in checks
    ]
    found = findings_of(measured, (), hosts, list(suspects))
    return {(f.host or "?", f.action) for f in found}, {f.host for f in found if f.host}


def _nobody_read(node: str) -> dict | None:
    """The probe run as uid 65534 over a copy of the recorded tree (None: not root, or no python3)."""
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    if os.geteuid() != 0 or python is None:
        return None
    with tempfile.TemporaryDirectory(prefix="campaign-nobody-") as tmp:
        work = Path(tmp)
        shutil.copytree(H100, work / "sys")
        shutil.copy(fabric_probe.__file__, work / "fabric_probe.py")
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        done = subprocess.run(
            [python, str(work / "fabric_probe.py"), "--sysfs-root", str(work / "sys"), "--node", node],
            user=65534, group=65534, capture_output=True, text=True, timeout=60, check=True, cwd=work,
        )  # fmt: skip
        return json.loads(done.stdout)


def fabric_case(base: Path) -> Outcome:
    out = Outcome("fabric counters by class", "recorded H100 sysfs tree + the real probe")
    section = FabricSection(saturated="warn")  # the recorded node's pinned counters: judged apart below
    reads = {
        "before": {"hw_req_cqe_error": "0", "symbol_error": "0", "port_rcv_data": "0"},
        "cqe": {"hw_req_cqe_error": "4", "symbol_error": "0", "port_rcv_data": str(4 * 10**12)},
        "ber_bad": {"hw_req_cqe_error": "0", "symbol_error": "2", "port_rcv_data": str(4 * 10**8)},
        "ber_ok": {"hw_req_cqe_error": "0", "symbol_error": "2", "port_rcv_data": str(4 * 10**12)},
    }
    trees = {name: _tree(base, name, counters) for name, counters in reads.items()}
    plan = {  # node: (after-tree, killed jobs between the readings)
        "fab1": ("cqe", ()),  # completion errors, nothing killed: planted
        "fab2": ("ber_bad", ()),  # BER 1.6e-10: planted
        "fab3": ("cqe", ("burnin-pair-7",)),  # completion errors in a killed job's window: healthy
        "fab4": ("ber_ok", ()),  # BER 1.6e-14: healthy
    }
    for node, (after, killed) in plan.items():
        verdict = counter_checks(
            [_read(trees["before"], node)],
            [_read(trees[after], node)],
            section,
            "campaign",
            {},
            killed=killed,
        )
        named, blamed = _judged(verdict.checks, [node], verdict.suspects)
        out.named |= named
        out.blamed |= blamed
    out.planted = [("fab1", "reseat/replace cable or NIC"), ("fab2", "reseat/replace cable or NIC")]
    out.healthy = ["fab3", "fab4"]
    reading = _nobody_read("fab5")
    if reading is not None:  # a saturated counter read without root: a warning, not a blame
        snap = parse_snapshot(reading, "fab5 sysfs (uid 65534)")
        verdict = counter_checks([snap], [snap], FabricSection(), "campaign", {})
        named, blamed = _judged(verdict.checks, ["fab5"], verdict.suspects)
        out.blamed |= blamed
        out.healthy.append("fab5")
        root_snap = _read(H100, "fab6")  # the same pinned counters read as root: it could clear them
        verdict = counter_checks([root_snap], [root_snap], FabricSection(), "campaign", {})
        named, _ = _judged(verdict.checks, ["fab6"], verdict.suspects)
        out.named |= named
        out.planted.append(("fab6", "reseat/replace cable or NIC"))
    else:
        out.note = "the non-root saturated-counter variation needs root to switch users: left out"
    return out


# ----------------------------------------------------------------------------------- preflight


def preflight_case(base: Path) -> Outcome:
    from recorded_nodes import H100_SYSFS, H100_TABLE

    from pytest_gpucluster.cluster.node_facts import ClusterFacts, node_facts
    from pytest_gpucluster.cluster.preflight import preflight
    from pytest_gpucluster.profiles.loader import load_profile

    out = Outcome("preflight: HCA ports and interfaces", "recorded node readings (sysfs + nvidia-smi)")
    down = base / "pre-down"
    shutil.copytree(H100_SYSFS, down)
    for device in ("mlx5_0", "mlx5_1"):
        (down / "class" / "infiniband" / device / "ports" / "1" / "state").write_text("1: DOWN\n")

    def node(host: str, sysfs: Path):
        return node_facts({
            "host": host, "gpu": {"source": "nvidia-smi", "text": H100_TABLE.read_text(), "returncode": 0},
            "infiniband": fabric_probe.read_ib_ports(sysfs), "links": fabric_probe.read_links(sysfs, shaping=False),
            "cuda_available": True, "nccl_available": True,
        })  # fmt: skip

    facts = ClusterFacts((node("pre1", down), node("pre2", H100_SYSFS)), "recorded")
    env = {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}  # pre2's other 7 active HCAs are outside the list
    found = preflight(
        facts, load_profile("dgx-h100-ib").model, env=env, env_origin=dict.fromkeys(env, "campaign"),
        ranks_per_node=8, ranks_origin="campaign",
    )  # fmt: skip
    # a preflight error sets the node aside ("drain node": it cannot run the profile as set up)
    out.named = {(f.host, "drain node") for f in found if f.severity == "error"}
    out.blamed = {f.host for f in found if f.severity in ("error", "warning")}
    out.planted = [("pre1", "drain node")]
    out.healthy = ["pre2"]
    return out


# ----------------------------------------------------------------------------------- health check


def _health_check(path: str, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "PYTEST_"))}
    here = REPO / "tests" / "integration"
    env |= {"SLURMD_NODENAME": node, "PATH": path, "PYTHONPATH": f"{here}{os.pathsep}{REPO}"}
    return subprocess.run(
        [sys.executable, "-m", "pytest_gpucluster.cli", "health-check", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def health_check_case(base: Path) -> Outcome:
    from recorded_nodes import ETH0_SYSFS, H200_TABLE, RecordedNodes, without_gpu

    out = Outcome("health check drains only on a failed check", "recorded-node stand-in + recording scontrol")
    calls = base / "scontrol-calls"
    bin_dir = base / "scontrol-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    recorded = RecordedNodes(base / "recorded")
    recorded.add(socket.gethostname(), without_gpu(H200_TABLE.read_text(), 3), sysfs=ETH0_SYSFS)
    plain = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    sick = f"{bin_dir}{os.pathsep}{recorded.bin}{os.pathsep}{os.environ['PATH']}"
    _health_check(sick, "hc-sick", "--hw=h200-sxm", "--drain", "--", "-p", "cuda_torch_standin")
    _health_check(plain, "hc-slow", "--hw=cpu-local", "--drain", "--timeout=3")
    _health_check(plain, "hc-typo", "--hw=no-such-profile", "--drain")
    drained = calls.read_text().splitlines() if calls.exists() else []
    for line in drained:
        node = next((w.split("=", 1)[1] for w in line.split() if w.startswith("NodeName=")), "?")
        if "State=DRAIN" in line:
            out.named.add((node, "drain node"))
            out.blamed.add(node)
    out.planted = [("hc-sick", "drain node")]
    out.healthy = ["hc-slow", "hc-typo"]
    return out


# ----------------------------------------------------------------------------------- fan-out


def fanout_case() -> Outcome:
    from pytest_gpucluster.results.baseline import RunResults
    from pytest_gpucluster.testbed.fanout import fan_out

    out = Outcome("a slow GPU and a cut link", "results fan-out of a real run (8 nodes x 8 GPUs)")
    real = json.loads((DATA / "results" / "cpu_local_run.json").read_text(encoding="utf-8"))
    for plant in (True, False):
        fanned, planted = fan_out(real, 8, 8, plant=plant, seed=7)
        run = RunResults.from_json(fanned, "fanned")
        hosts = sorted({str(m.labels["host"]) for m in run.measurements if "host" in m.labels})
        found = findings_of(run.measurements, run.outcomes, hosts)
        if plant:
            out.planted = [
                (str(planted.slow_node), "reset GPU"),
                (str(planted.port_node), "reseat/replace cable or NIC"),
            ]
            out.named |= {(f.host or "?", f.action) for f in found}
            healthy = [h for h in hosts if h not in (planted.slow_node, planted.port_node)]
        else:
            healthy = hosts
        out.healthy += [f"{'planted' if plant else 'clean'}:{h}" for h in healthy]
        out.blamed |= {f"{'planted' if plant else 'clean'}:{f.host}" for f in found if f.host}
    return out


# ----------------------------------------------------------------------------------- crashed rank


def crashed_rank_case(base: Path) -> Outcome:
    from pytest_gpucluster.cluster.spec import ClusterSpec
    from pytest_gpucluster.errors import JobFailed
    from pytest_gpucluster.launch import get_launcher
    from pytest_gpucluster.launch.job import Cluster
    from pytest_gpucluster.testbed.netns import NetnsUnavailable, netns_testbed
    from pytest_gpucluster.workloads import basic

    out = Outcome("a crashed rank", "network-namespace nodes (2), real torchrun jobs")
    try:
        with netns_testbed(2) as bed:
            names = list(bed.names)
            spec = ClusterSpec(hosts=tuple((ns, 1) for ns in names), nproc_per_node=1, source="netns")
            cluster = Cluster(spec, get_launcher("torchrun"), base / "netns-results", remote_exec="netns")
            outcomes = []
            try:
                cluster.run(basic.fail_on_rank, options={"rank": 1}, timeout=120)
            except JobFailed as exc:
                outcomes.append(
                    TestOutcome(
                        "acceptance/test_x.py::test_crash", "failed", "workload failed", 1.0, str(exc)
                    )
                )
            crashed = findings_of((), outcomes, names)
            clean = cluster.run(basic.all_reduce_sum, timeout=120)
            ok = (
                []
                if clean.ok
                else [TestOutcome("acceptance/test_x.py::test_ok", "failed", "workload failed", 1.0, "")]
            )
            blamed_clean = {f.host for f in findings_of((), ok, names) if f.host}
    except NetnsUnavailable as exc:
        out.note = f"left out: {exc}"
        return out
    crashed_host = names[1]
    out.planted = [(crashed_host, "rerun")]
    out.named = {(f.host or "?", f.action) for f in crashed}
    out.healthy = [names[0]] + [f"clean:{n}" for n in names]
    out.blamed = {f.host for f in crashed if f.host} | {f"clean:{h}" for h in blamed_clean}
    return out


# ----------------------------------------------------------------------------------- lost GPU


def lost_gpu_case(base: Path) -> Outcome:
    """The real counter tests (acceptance/test_burnin.py) on this machine's two stand-in GPUs
    (tests/integration/counter_suite_run.py); GPU 1 lost after the before reading, or not."""
    from counter_suite_run import BUSES, counter_run

    out = Outcome(
        "a lost GPU (NVML GpuIsLost after the run)", "the real suite's counter tests, stand-in NVML"
    )
    host = socket.gethostname()
    for plant in (True, False):
        run = counter_run(base / ("lost" if plant else "healthy"), lose=BUSES[1] if plant else None)
        findings = (run.data or {}).get("findings") or []
        if run.data is None:
            out.note = f"a run wrote no results.json: {run.out[-300:]!r}"
        if plant:
            out.planted = [(host, "reset GPU")]
            # named: this host, the GPU that was lost (by its PCI address), its action
            out.named |= {
                (f["host"], f["action"]) for f in findings
                if f["metric"] == "burnin.gpus_lost" and BUSES[1].lower() in str(f.get("gpu"))
            }  # fmt: skip
            if (run.data or {}).get("signoff", {}).get("fit") is not False:
                out.named.clear()  # a lost GPU that still signs FIT is not named, whatever the findings say
        else:
            out.healthy = [f"healthy:{host}"]
            out.blamed |= {f"healthy:{f['host']}" for f in findings if f.get("host")}
    return out


def _report(results: Path) -> tuple[str, list[tuple[str, str]]]:
    """``gpucluster report RESULTS.json`` (re-judged from the evidence): report.md, and the
    (node, action) pairs its sign-off line names ("N of M node(s) fail: node004 (rerun), ...")."""
    from pytest_gpucluster import cli

    with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
        cli.main(["report", str(results)])
    report = (results.parent / "report.md").read_text(encoding="utf-8")
    line = next((x for x in report.splitlines() if " node(s) fail: " in x), "")
    failing = line.split(" node(s) fail: ", 1)[1].split(". ", 1)[0] if line else ""
    pairs = [
        (part.split(" (", 1)[0], part.split(" (", 1)[1].rstrip(")"))
        for part in failing.split(", ")
        if " (" in part
    ]
    return report, pairs


def rejudged_case(base: Path) -> Outcome:
    """The real H200 quick run fanned out to 8 nodes; every measurement of one GPU removed."""
    from pytest_gpucluster.testbed.fanout import dumps, fan_out

    out = Outcome(
        "a GPU with no measurement, re-judged", "gpucluster report on a fan-out of the real H200 run"
    )
    real = json.loads((DATA / "gpu_session" / "h200_2026_11_28" / "quick" / "results.json").read_text())
    node, gpu = "node004", "0"
    for plant in (True, False):
        # no noise: the fan-out's noise would move GPU counts (1 per node) off their exact thresholds
        fanned, _ = fan_out(real, 8, 1, plant=False, noise=0.0)
        hosts = sorted(
            {str(m["labels"]["host"]) for m in fanned["measurements"] if "host" in (m.get("labels") or {})}
        )
        if plant:
            fanned["measurements"] = [
                m for m in fanned["measurements"]
                if ((m.get("labels") or {}).get("host"), str((m.get("labels") or {}).get("gpu"))) != (node, gpu)
            ]  # fmt: skip
        path = base / ("cut" if plant else "full") / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(dumps(fanned))
        report, pairs = _report(path)
        not_measured = f"| NOT MEASURED | profile.burnin.min_matmul (host={node},gpu={gpu}) |" in report
        label = "cut" if plant else "full"
        if plant:
            out.planted = [(node, "rerun")]  # results/findings.py LADDER: not measured -> rerun
            out.named = {p for p in pairs if "**NOT FIT" in report and not_measured}
            out.healthy += [f"{label}:{h}" for h in hosts if h != node]
        else:
            out.healthy += [f"{label}:{h}" for h in hosts]
        out.blamed |= {f"{label}:{h}" for h, _ in pairs}
    return out


# ----------------------------------------------------------------------------------- xdist split


def _fabric_pair(results: Path, *xdist: str) -> dict:
    """acceptance/test_fabric.py's before/after pair on cpu-local under pytest-xdist ``xdist``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "PYTEST_"))}
    env["PYTHONPATH"] = str(REPO)
    subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/test_fabric.py", "-k", "fabric_before or fabric_after",
         *xdist, "--hw=cpu-local", f"--results-dir={results}", "-p", "no:cacheprovider", "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    path = results / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def xdist_split_case(base: Path) -> Outcome:
    """Healthy: ``-n 2`` (the pair grouped in one worker) and ``-n 2 --dist worksteal`` (one test
    per worker: the reading crosses through the results directory). Planted: the after test
    without its before test in the run."""
    out = Outcome(
        "before/after split across xdist workers", "the real suite's fabric pair under pytest-xdist"
    )
    host = socket.gethostname()
    runs = {
        "grouped": ("-n", "2"),
        "split": ("-n", "2", "--dist", "worksteal"),
        "no-before": ("-n", "2", "-k", "fabric_after"),
    }
    out.planted = [("cluster", "rerun")]
    notes = []
    for label, args in runs.items():
        data = _fabric_pair(base / label, *args)
        findings = data.get("findings") or []
        outcomes = {o["test_id"].split("@")[0].rsplit("::", 1)[-1]: o for o in data.get("outcomes", [])}
        if label == "no-before":
            # a fault of the run, not of a node: named when the after test failed NOT MEASURED with
            # its reason, and the findings give it to the cluster (no host) with the ladder's rung
            # for a set-up gap, rerun; never FIT
            after = outcomes.get("test_fabric_after", {})
            gap = after.get("outcome") == "failed" and "NOT MEASURED" in str(after.get("message"))
            if gap and data.get("signoff", {}).get("fit") is False:
                out.named = {("cluster", f["action"]) for f in findings
                             if f["reason"] == "not measured" and not f.get("host")}  # fmt: skip
        else:
            measured = any(m["metric"].startswith("fabric.") for m in data.get("measurements", []))
            fit = data.get("signoff", {}).get("fit") is True
            if not (measured and fit):
                out.blamed.add(f"{label}:run")  # a healthy run that did not measure or sign FIT
                notes.append(f"{label} run: measured {measured}, sign-off {data.get('signoff')}")
            out.healthy.append(f"{label}:run")
        out.healthy.append(f"{label}:{host}")  # the node did nothing wrong in any run
        out.blamed |= {f"{label}:{f['host']}" for f in findings if f.get("host")}
    out.note = "; ".join(notes)
    return out


# ----------------------------------------------------------------------------------- main


CASES: list[tuple[str, Callable[[Path], Outcome]]] = [
    ("xid", lambda base: xid_case()),
    ("fabric", fabric_case),
    ("preflight", preflight_case),
    ("health-check", health_check_case),
    ("fan-out", lambda base: fanout_case()),
    ("crashed-rank", crashed_rank_case),
    ("lost-gpu", lost_gpu_case),
    ("rejudged", rejudged_case),
    ("xdist-split", xdist_split_case),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep the planted trees and files here")
    parser.add_argument("--only", action="append", help="run only these cases (repeatable)")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    base.mkdir(parents=True, exist_ok=True)
    results: list[Outcome] = []
    try:
        for name, case in CASES:
            if args.only and name not in args.only:
                continue
            start = time.monotonic()
            (base / name).mkdir(parents=True, exist_ok=True)
            got = case(base / name)
            results.append(got)
            missed = [f for f in got.planted if f not in got.named]
            wrong = sorted(n for n in got.healthy if n in got.blamed)
            print(
                f"{got.case} [{got.seam}]: {got.found}/{len(got.planted)} faults named right"
                + (f" (missed {missed}; named {sorted(got.named)})" if missed else "")
                + f", {got.wrongly_blamed}/{len(got.healthy)} healthy blamed"
                + (f" ({wrong})" if wrong else "")
                + (f"; {got.note}" if got.note else "")
                + f"; {time.monotonic() - start:.1f} s",
                flush=True,
            )
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    planted = sum(len(r.planted) for r in results)
    found = sum(r.found for r in results)
    healthy = sum(len(r.healthy) for r in results)
    blamed = sum(r.wrongly_blamed for r in results)
    print(f"fault naming ratio ({found} of {planted} planted faults named with the right node and action) "
          f"{found / max(planted, 1):.3f}")  # fmt: skip
    print(f"healthy blame ratio ({blamed} of {healthy} healthy nodes blamed) {blamed / max(healthy, 1):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
