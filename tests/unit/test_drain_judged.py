"""The drain list follows the run's findings: one judgement (ARCHITECTURE: the report,
results.json and the drain list say the same thing). A host is drained only for a finding whose
action drains it (`burnin.drain.judged_drain_commands`); a suspect judged ``threshold; rerun``
stays listed and drains nothing. Shown on a real recorded soak run (tests/data/results/
soak_cpu_local_20s/README.md) through the end-of-run functions, and on the rule itself."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from pytest_gpucluster.burnin.drain import (
    DRAINING_ACTIONS,
    SUSPECTS_FILE,
    Suspect,
    drain_listed,
    judged_drain_commands,
    listed_drain_commands,
    read_suspects,
    write_findings,
    write_suspects,
)
from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.results.report import record_findings

SOAK = Path(__file__).resolve().parents[1] / "data" / "results" / "soak_cpu_local_20s"
HEALTH = "acceptance/test_burnin.py::test_rank_health_cpu"


def _end_of_run(tmp_path: Path) -> tuple[list, Path]:
    """The recorded run judged by the end of the run's own function (`record_findings`)."""
    for name in ("results.json", SUSPECTS_FILE):
        if not (tmp_path / name).exists():
            shutil.copy(SOAK / name, tmp_path / name)
    run = read_results(tmp_path / "results.json")
    recorder = Recorder(
        tmp_path / "results.json", header={"fingerprint": dict(run.fingerprint)}, persist=False
    )
    recorder.measurements.extend(run.measurements)
    recorder.outcomes.extend(run.outcomes)
    return record_findings(recorder, tmp_path), tmp_path / SUSPECTS_FILE


def _drained_hosts(commands: list[list[str]]) -> set[str]:
    return {argv[2].removeprefix("NodeName=") for argv in commands}


def test_the_recorded_soak_drains_nothing_its_findings_call_rerun(tmp_path):
    before = listed_drain_commands(SOAK / SUSPECTS_FILE)
    assert _drained_hosts(before) == {"vm"}  # what the burn-in test listed during the run
    findings, drain_list = _end_of_run(tmp_path)

    (finding,) = findings
    assert (finding.metric, finding.host, finding.reason, finding.action) == (
        "burnin.cpu_memory_bandwidth", "vm", "threshold", "rerun",
    )  # fmt: skip
    assert listed_drain_commands(drain_list) == []
    (suspect,) = json.loads(drain_list.read_text())["suspects"]
    assert suspect["drained"] is False and "drain_command" not in suspect
    assert suspect["judged"].startswith("threshold; rerun: 1 of 2 peers missed")
    assert read_suspects(drain_list)[0].node == "vm"  # still listed, for the operator to see

    calls: list[list[str]] = []

    def scontrol(argv, **_):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert drain_listed(drain_list, run=scontrol) == [
        f"drain (--gpucluster-drain): no host to drain ({drain_list})"
    ]
    assert calls == []


def test_every_host_drained_is_a_finding_that_drains_and_no_other(tmp_path):
    """The invariant on the recorded run, with a second node's GPU planted as a hardware suspect:
    the drain list's hosts are exactly the hosts of the findings whose action drains."""
    shutil.copy(SOAK / SUSPECTS_FILE, tmp_path / SUSPECTS_FILE)
    gpu = Suspect(node="node02", reason="GPU 1 matmul 40% of its peers", check="health", kind="gpu",
                  gpu="1", source="acceptance/test_burnin.py::test_gpu_health")  # fmt: skip
    write_suspects(tmp_path / SUSPECTS_FILE, [gpu])
    findings, drain_list = _end_of_run(tmp_path)
    drains = {f.host for f in findings if f.action in DRAINING_ACTIONS and f.host}
    assert drains == {"node02"}
    assert _drained_hosts(listed_drain_commands(drain_list)) == drains
    (command,) = listed_drain_commands(drain_list)
    assert command[-1] == "Reason=gpucluster burn-in: GPU 1 matmul 40% of its peers"


def _finding(test_id: str, host: str | None, reason: str, action: str, metric: str = "m") -> dict:
    return {
        "metric": metric,
        "reason": reason,
        "action": action,
        "why": "w",
        "host": host,
        "test_id": test_id,
    }


def test_the_rule_a_suspect_drains_only_under_a_finding_of_its_test_that_drains():
    slow = Suspect(node="a", reason="rank 1 below the floor", check="health", source=HEALTH)
    outlier = Suspect(node="b", reason="rank 5 at half its peers", check="health", source=HEALTH)
    link = Suspect(node="c", reason="slow pair", check="pairwise", kind="link", peer="d", source="t::pairs")
    findings = [
        _finding(HEALTH, "a", "threshold", "rerun"),
        _finding(HEALTH, "b", "hardware", "drain node"),
        _finding("t::pairs", None, "hardware", "reseat/replace cable or NIC"),
        _finding("t::xid", "e", "hardware", "reset GPU", "burnin.xid"),  # no suspect: the finding's host
        _finding("t::setup", "f", "node setup", "fix node setup"),
    ]
    commands = judged_drain_commands([slow, outlier, link], findings)
    assert [argv[2] for argv in commands] == ["NodeName=b", "NodeName=e"]
    assert commands[0][-1] == "Reason=gpucluster burn-in: rank 5 at half its peers"
    assert commands[1][-1] == "Reason=gpucluster burn-in: burnin.xid: reset GPU"
    # a draining finding of another test on the host drains it, with that finding's reason, not the rerun suspect's
    other = judged_drain_commands([slow], [_finding(HEALTH, "a", "threshold", "rerun"),
                                          _finding("t::ecc", "a", "hardware", "RMA", "burnin.retired_pages")])  # fmt: skip
    assert other == [[*other[0][:4], "Reason=gpucluster burn-in: burnin.retired_pages: RMA"]]
    assert judged_drain_commands([slow], []) == []  # judged, and nothing failed: nothing drains


def test_until_the_run_is_judged_the_suspects_are_listed_provisionally_and_the_findings_then_decide(tmp_path):
    path = tmp_path / SUSPECTS_FILE
    slow = Suspect(node="a", reason="rank 1 below the floor", check="health", source=HEALTH)
    write_suspects(path, [slow])
    assert _drained_hosts(listed_drain_commands(path)) == {"a"}  # provisional: nothing runs it yet
    write_findings(path, [_finding(HEALTH, "a", "threshold", "rerun")])
    assert listed_drain_commands(path) == []
    late = Suspect(node="b", reason="late", check="health", source="t::late")
    write_suspects(path, [late])  # a suspect added after the judgement keeps the judgement
    assert listed_drain_commands(path) == [] and json.loads(path.read_text())["findings"]


def _report(argv: list[str], capsys) -> str:
    from pytest_gpucluster.cli import main

    assert main(["report", *argv]) == 0
    return capsys.readouterr().err


def test_gpucluster_report_rewrites_the_recorded_runs_drain_list_from_its_rejudged_findings(tmp_path, capsys):
    """The recorded soak's drain list drains vm (the burn-in test's provisional command); re-judged,
    its one finding is ``threshold; rerun``: the suspects.json an operator script reads now drains
    nothing, and the run's file is kept byte for byte as suspects.json.orig (also after a second
    report, which must not overwrite it with the first re-judged list)."""
    for name in ("results.json", SUSPECTS_FILE):
        shutil.copy(SOAK / name, tmp_path / name)
    drain_list, original = tmp_path / SUSPECTS_FILE, tmp_path / f"{SUSPECTS_FILE}.orig"
    err = _report([str(tmp_path / "results.json")], capsys)
    assert f"drain list re-judged: {drain_list} drains no host (the run's drained vm)" in err
    assert f"the run's drain list is kept as {original}" in err
    assert listed_drain_commands(drain_list) == []
    (suspect,) = json.loads(drain_list.read_text())["suspects"]
    assert suspect["drained"] is False and suspect["judged"].startswith("threshold; rerun")
    assert original.read_bytes() == (SOAK / SUSPECTS_FILE).read_bytes()
    err = _report([str(tmp_path / "results.json")], capsys)
    assert "drains no host (unchanged)" in err
    assert original.read_bytes() == (SOAK / SUSPECTS_FILE).read_bytes()

    calls: list[list[str]] = []
    drain_listed(drain_list, run=lambda argv, **_: calls.append(argv))
    assert calls == []  # --gpucluster-drain on the rewritten list drains nothing


def test_gpucluster_report_out_writes_the_rejudged_drain_list_beside_the_report(tmp_path, capsys):
    """With --out the run's directory is not touched: a new suspects.json beside the new report."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    run_dir.mkdir()
    for name in ("results.json", SUSPECTS_FILE):
        shutil.copy(SOAK / name, run_dir / name)
    err = _report([str(run_dir / "results.json"), "--out", str(out)], capsys)
    assert f"{out / SUSPECTS_FILE} drains no host (the run's drained vm)" in err
    assert (run_dir / SUSPECTS_FILE).read_bytes() == (SOAK / SUSPECTS_FILE).read_bytes()
    assert not (run_dir / f"{SUSPECTS_FILE}.orig").exists()
    assert listed_drain_commands(out / SUSPECTS_FILE) == [] and (out / "report.md").exists()


def test_gpucluster_report_adds_the_drain_a_rejudged_finding_orders_and_the_old_list_lacks(tmp_path, capsys):
    """An old drain list that drains nothing while the run's suspects include a GPU the findings call
    hardware: the re-judged list drains that host (and still not vm, judged rerun)."""
    shutil.copy(SOAK / "results.json", tmp_path / "results.json")
    gpu = Suspect(node="node02", reason="GPU 1 matmul 40% of its peers", check="health", kind="gpu",
                  gpu="1", source="acceptance/test_burnin.py::test_gpu_health")  # fmt: skip
    old = json.loads((SOAK / SUSPECTS_FILE).read_text())
    old["suspects"].append(gpu.to_json())
    old["drain_commands"] = []  # what an older policy ordered: nothing
    (tmp_path / SUSPECTS_FILE).write_text(json.dumps(old))
    err = _report([str(tmp_path / "results.json")], capsys)
    assert "drains node02 (the run's drained no host)" in err
    assert _drained_hosts(listed_drain_commands(tmp_path / SUSPECTS_FILE)) == {"node02"}
