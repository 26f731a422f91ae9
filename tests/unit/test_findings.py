"""Findings: each failure of a run with its reason class and the next action from the ladder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_gpucluster.burnin.drain import SUSPECTS_FILE, Suspect, write_suspects
from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.findings import LADDER, REASONS, Finding, findings_of
from pytest_gpucluster.results.model import Check, Measurement, ThresholdRef
from pytest_gpucluster.results.model import TestOutcome as Outcome
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.results.report import finish_run

REAL_RUN = Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json"
"""A real ``pytest acceptance/ --hw=cpu-local`` run on this 2-core machine (loaded: rank 0's CPU
matmul missed its floor while rank 1's passed: two peers are too few to call it hardware)."""
REF = ThresholdRef("h200", ("burnin", "min_gpu_matmul"))


def _m(metric: str, value: float, threshold: float | None, labels: dict, **kw) -> Measurement:
    check = Check(metric, value, kw.pop("unit", "FLOP/s"), threshold, labels=labels, **kw)
    return Measurement.of(check, test_id=kw.get("test_id", "acceptance/test_burnin.py::t"), time=0.0)


def _gpus(slow: tuple[str, str] | None = None, low: float = 600e12) -> list[Measurement]:
    out = []
    for host in ("node01", "node02"):
        for gpu in range(8):
            value = low if (host, str(gpu)) == slow else 900e12
            out.append(_m("burnin.gpu_matmul", value, 800e12, {"host": host, "gpu": str(gpu)}, ref=REF))
    return out


def test_the_real_cpu_local_run_gives_one_finding_for_the_slow_rank():
    run = read_results(REAL_RUN)
    findings = findings_of(run.measurements, run.outcomes, ["vm"])
    assert [(f.metric, f.host, f.reason, f.action) for f in findings] == [
        ("burnin.cpu_matmul", "vm", "threshold", "rerun")
    ]
    (slow,) = findings
    assert slow.labels == {"host": "vm", "rank": 0} and slow.where() == "vm, rank 0"
    assert slow.source == "profile cpu-local: burnin.min_cpu_matmul"
    assert slow.measured is not None and slow.threshold is not None and slow.measured < slow.threshold
    assert slow.why.startswith("1 of 2 peers missed: too few to single one out")
    # the failed test is the same failure: not a second finding
    assert slow.test_id == "acceptance/test_burnin.py::test_rank_health_cpu"


def test_a_slow_gpu_among_passing_peers_is_hardware_and_gets_a_gpu_reset():
    (f,) = findings_of(_gpus(slow=("node02", "5")))
    assert (f.host, f.gpu, f.reason, f.action) == ("node02", "5", "hardware", "reset GPU")
    assert "15 of 16 peers passed" in f.why
    assert f.source == "profile h200: burnin.min_gpu_matmul"
    assert f.where() == "node02, GPU 5"
    assert "reset GPU" in f.line() and "600 TFLOP/s" in f.line()


def test_a_value_every_peer_misses_alike_points_at_the_threshold():
    ms = [_m("burnin.gpu_matmul", 700e12, 800e12, {"host": f"n{i}", "gpu": "0"}, ref=REF) for i in range(4)]
    found = findings_of(ms)
    assert {(f.reason, f.action) for f in found} == {("threshold", "rerun")}
    assert "4 of 4 peers missed alike" in found[0].why and "burnin.min_gpu_matmul" in found[0].why


def test_a_cluster_wide_value_without_peers_is_a_threshold_finding():
    (f,) = findings_of(
        [
            _m(
                "collectives.all_reduce.busbw",
                1e9,
                2e9,
                {"size_bytes": 1 << 30},
                unit="B/s",
                scope="inter-node",
            )
        ]
    )
    assert (f.host, f.reason, f.action) == (None, "threshold", "rerun")
    assert (
        f.where() == "cluster"
        and f.source == "no profile key recorded (a rule of the check, or a results.json older than schema 2)"
    )


@pytest.mark.parametrize(
    ("metric", "labels", "action", "port"),
    [
        (
            "fabric.error_increase",
            {"node": "n3", "device": "mlx5_1", "port": 1},
            "reseat/replace cable or NIC",
            "mlx5_1 port 1",
        ),
        ("fabric.port_active", {"node": "n3", "device": "eth2"}, "reseat/replace cable or NIC", "eth2"),
        ("burnin.row_remap_failure", {"host": "n3", "gpu": "2"}, "RMA", None),
        ("burnin.ecc_uncorrected", {"host": "n3", "gpu": "2"}, "reset GPU", None),
        ("burnin.pcie_width", {"host": "n3"}, "drain node", None),
    ],
)
def test_a_health_counter_is_hardware_even_without_peers(metric, labels, action, port):
    (f,) = findings_of([_m(metric, 1.0, 0.0, labels, unit="count", comparison="<=")])
    assert (f.reason, f.action, f.port, f.host) == ("hardware", action, port, "n3")


def test_a_pair_that_is_not_a_link_names_no_port():
    ms = [_m("nvlink.speedup", 1.0, 2.0, {"size_bytes": 1 << 20, "pair": "shm/gloo"}, unit="x")]
    assert findings_of(ms)[0].port is None


def test_a_link_of_two_nodes_is_a_cable_finding_with_no_host_to_drain():
    labels = {"pair": "node01<->node02"}
    ms = [_m("burnin.pair_busbw", 1e9, 5e9, labels, unit="B/s")] + [
        _m("burnin.pair_busbw", 9e9, 5e9, {"pair": f"node0{i}<->node0{i + 1}"}, unit="B/s")
        for i in range(2, 6)
    ]
    (f,) = findings_of(ms)
    assert (f.port, f.host, f.reason, f.action) == (
        "link node01<->node02",
        None,
        "hardware",
        "reseat/replace cable or NIC",
    )


def test_a_threshold_without_a_value_is_not_measured_and_a_broken_one_too():
    nan = _m("burnin.gpu_matmul", math.nan, 800e12, {"host": "n1", "gpu": "0"}, ref=REF)
    (f,) = findings_of([nan, *_gpus()])
    assert (f.reason, f.action, f.problem, f.measured) == ("not measured", "rerun", "not measured", None)

    high = _m("nvlink.busbw", 2e12, 1e11, {"host": "n1"}, unit="B/s", problem="broken measurement")
    (f,) = findings_of([high])
    assert (f.reason, f.problem) == ("not measured", "broken measurement")
    assert "physical ceiling" in f.why


def test_a_crashed_job_is_a_workload_finding_naming_its_host():
    crash = Outcome(
        "acceptance/test_sft.py::test_sft[tiny]",
        "failed",
        "infrastructure",
        3.0,
        "JobFailed: rank 5 on node07 exited with code 1 (root cause)\nTraceback ...",
    )
    passed = Outcome("acceptance/test_sft.py::test_other", "passed", "pass", 1.0)
    (f,) = findings_of([], [crash, passed], ["node06", "node07", "node08"])
    assert (f.reason, f.action, f.host, f.metric) == ("workload failed", "rerun", "node07", crash.test_id)
    assert f.message.startswith("JobFailed: rank 5 on node07")


def test_findings_are_ordered_by_rung_and_survive_json():
    ms = [
        *_gpus(slow=("node01", "3")),
        _m("burnin.row_remap_failure", 1, 0, {"host": "node02", "gpu": "1"}, unit="count", comparison="<="),
        _m("sft.step_time", 2.0, 1.0, {"case": "tiny"}, unit="s", comparison="<="),
    ]
    found = findings_of(ms)
    assert [f.action for f in found] == ["RMA", "reset GPU", "rerun"]
    assert [Finding.from_json(json.loads(json.dumps(f.to_json()))) for f in found] == found
    assert LADDER[0] == "rerun" and LADDER[-1] == "RMA" and "not measured" in REASONS
    with pytest.raises(ValueError, match="reason must be one of"):
        Finding.from_json({**found[0].to_json(), "reason": "bad luck"})


def test_the_end_of_a_run_writes_the_findings_to_results_json_and_the_drain_list(tmp_path):
    recorder = Recorder(tmp_path / "results.json", header={"fingerprint": {"hosts": ["node01", "node02"]}})
    recorder.measurements.extend(_gpus(slow=("node01", "3")))
    slow = Suspect(node="node01", reason="slow GPU 3", check="health", source="acceptance/test_burnin.py::t")
    write_suspects(tmp_path / SUSPECTS_FILE, [slow])  # its failed value names it already: one finding
    finished = finish_run(recorder, tmp_path, None, 0.05)
    assert finished.summary_args()["finding_lines"] == [
        "FINDINGS (where: what -> reason class; next action): 1",
        "  node01, GPU 3: burnin.gpu_matmul: 600 TFLOP/s (expected >= 800 TFLOP/s) -> hardware; reset GPU",
    ]
    stored = json.loads((tmp_path / "results.json").read_text())["findings"]
    assert [(f["host"], f["gpu"], f["reason"], f["action"]) for f in stored] == [
        ("node01", "3", "hardware", "reset GPU")
    ]
    drain = json.loads((tmp_path / SUSPECTS_FILE).read_text())
    assert drain["findings"] == stored and len(drain["suspects"]) == 1
    assert [c[2] for c in drain["drain_commands"]] == ["NodeName=node01"]
    # a later suspect keeps the findings in the drain list
    write_suspects(tmp_path / SUSPECTS_FILE, [Suspect(node="node02", reason="late", check="health")])
    assert json.loads((tmp_path / SUSPECTS_FILE).read_text())["findings"] == stored


def test_a_test_that_ended_not_measured_without_a_recorded_value_is_a_not_measured_finding():
    gap = Outcome(
        "acceptance/test_nvlink.py::test_links_up", "failed", "not measured", 0.1, "NotMeasured: ..."
    )
    (f,) = findings_of([], [gap])
    assert (f.reason, f.action) == ("not measured", "rerun")


def test_stragglers_and_slow_links_named_by_the_burn_in_become_findings_of_their_own():
    test = "acceptance/test_burnin.py::test_collective_stragglers"
    count = Check("burnin.rank_collective_lag.stragglers", 2, "ranks", 0, "<=")
    count = Measurement.of(count, test_id=test, time=0.0)
    suspects = [
        Suspect(node="node07", rank=13, reason="rank 13 on node07: 20 ms", check="straggler", source=test),
        Suspect(
            node="node02", gpu="GPU 1", kind="gpu", reason="GPU 1: 3x slower", check="straggler", source=test
        ),
        Suspect(
            node="node03", peer="node04", kind="link", reason="pair slow", check="pairwise", source="t::pairs"
        ),
    ]
    found = findings_of([count], [], ["node02", "node03", "node04", "node07"], suspects)
    assert [(f.host, f.gpu, f.port, f.reason, f.action) for f in found] == [
        (None, None, "link node03 <-> node04", "hardware", "reseat/replace cable or NIC"),
        ("node02", "GPU 1", None, "hardware", "reset GPU"),
        ("node07", None, None, "hardware", "drain node"),
    ]
    assert found[2].metric == "burnin.rank_collective_lag.stragglers" and found[2].labels == {"rank": 13}
    assert found[2].message.startswith("node node07 (rank 13): rank 13 on node07: 20 ms")
    assert found[0].metric == "burnin.pairwise" and found[0].test_id == "t::pairs"


def test_a_failed_job_links_the_job_directory_its_message_names(tmp_path):
    from pytest_gpucluster.results.render import job_dirs

    message = (
        f"JobFailed: rank 1 on node07 exited with code 1\njob directory (per-rank logs kept): "
        f"{tmp_path}/jobs/sft-tiny-zero2-1x2-004738-76c318\n  log: /elsewhere/jobs/nccl-probe-1/rank-1.log"
    )
    assert job_dirs(message, tmp_path) == [
        "jobs/sft-tiny-zero2-1x2-004738-76c318/",
        "/elsewhere/jobs/nccl-probe-1/",
    ]


def test_drain_at_the_end_runs_the_findings_hosts_too_without_any_burn_in_suspect(tmp_path):
    """--gpucluster-drain drains what the findings say needs draining, not only the burn-in's
    suspects: a slow GPU a health value names, with no suspects.json written by any test."""
    from pytest_gpucluster.burnin.drain import drain_listed

    recorder = Recorder(tmp_path / "results.json", header={"fingerprint": {"hosts": ["node01", "node02"]}})
    recorder.measurements.extend(_gpus(slow=("node02", "5")))
    finish_run(recorder, tmp_path, None, 0.05)
    calls: list[list[str]] = []

    def fake_run(argv, **kwargs):
        assert "shell" not in kwargs
        calls.append(argv)
        return __import__("subprocess").CompletedProcess(argv, 0, "", "")

    lines = drain_listed(tmp_path / SUSPECTS_FILE, run=fake_run)
    assert [argv[:4] for argv in calls] == [["scontrol", "update", "NodeName=node02", "State=DRAIN"]]
    assert calls[0][4] == "Reason=gpucluster burn-in: burnin.gpu_matmul: reset GPU"
    assert lines[0].startswith("drain (--gpucluster-drain): 1 host(s) from ")
    assert lines[1].startswith("  done: scontrol update NodeName=node02 State=DRAIN")


def test_drain_at_the_end_says_why_nothing_was_drained(tmp_path):
    from pytest_gpucluster.burnin.drain import drain_listed

    path = tmp_path / SUSPECTS_FILE
    assert drain_listed(path) == [f"drain (--gpucluster-drain): no host to drain ({path})"]
    path.write_text('{"suspects": [], "drain_commands": "scontrol update NodeName=x"}')
    (line,) = drain_listed(path)
    assert line == (
        f"drain (--gpucluster-drain): nothing drained: {path}: 'drain_commands' is not a list of argv "
        "lists of strings"
    )


def test_a_preflight_stop_says_to_fix_the_settings_and_names_the_node():
    """The outcome the plugin records when the preflight stops a run (`session.set_aside.stop_outcome`),
    with the finding `tests/integration/test_preflight_nodes.py` gets from --hw=h200-spectrumx here."""
    from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
    from pytest_gpucluster.cluster.preflight import PreflightFinding
    from pytest_gpucluster.session.set_aside import split_nodes, stop_outcome

    found = PreflightFinding(
        host="vm",
        requirement="NCCL_SOCKET_IFNAME",
        asked="bond0 (profile h200-spectrumx)",
        found="eth0, lo",
        message="vm: NCCL_SOCKET_IFNAME=bond0 matches no interface (has eth0, lo)",
    )
    facts = ClusterFacts((NodeFacts("vm"),), "this machine")
    outcome = stop_outcome(split_nodes(["vm"], facts, [found], cuda=False))
    assert outcome is not None
    (f,) = findings_of([], [outcome], ["vm"])
    assert (f.host, f.reason, f.action) == ("vm", "workload failed", "rerun")
    assert f.why.startswith("the preflight stopped the run before any job")
    assert "fix the profile or the settings" in f.why and f.why.endswith("; the message names vm")


def test_the_sign_off_verdict_reaches_the_terminal_and_results_json(tmp_path):
    recorder = Recorder(tmp_path / "results.json", header={"fingerprint": {"hosts": ["node01", "node02"]}})
    recorder.measurements.extend(_gpus(slow=("node02", "5")))
    finished = finish_run(recorder, tmp_path, None, 0.05)
    line = finished.summary_args()["signoff_line"]
    assert line.startswith("SIGN-OFF NOT FIT. 1 of 2 node(s) fail: node02 (reset GPU).")
    assert line.endswith("1 finding(s): 1 hardware; highest next action: reset GPU.")
    stored = json.loads((tmp_path / "results.json").read_text())["signoff"]
    assert stored["fit"] is False and stored["verdict"] == "NOT FIT"
    assert stored["why"].startswith("1 of 2 node(s) fail: node02 (reset GPU)")
    # the report's first screen says the same
    assert "**NOT FIT**" in (tmp_path / "report.md").read_text()

    healthy = Recorder(tmp_path / "ok" / "results.json", header={"fingerprint": {"hosts": ["node01"]}})
    healthy.measurements.extend(m for m in _gpus() if m.labels["host"] == "node01")
    ok = finish_run(healthy, tmp_path / "ok", None, 0.05)
    assert ok.summary_args()["signoff_line"] == (
        "SIGN-OFF FIT: every measured value passed. 1 node(s): every area that ran passed; no finding "
        "(8 values measured)."
    )
