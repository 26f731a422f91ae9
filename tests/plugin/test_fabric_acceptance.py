"""acceptance/test_fabric.py (fabric counters, soak, DCGM) run whole (pytester), on this machine.

- the fabric readings bracket a run for real (two launches reading /sys and tc here);
- the soak is off without --gpucluster-soak, and a bad duration is a usage error (the soak itself
  runs in tests/integration/test_soak_netns.py, between two network-namespace nodes);
- ``dcgmi diag``: a stand-in ``dcgmi`` on PATH prints a recorded real DCGM run (and exits 226, as
  dcgmi does when a test fails); the launched path must turn it into checks naming the GPU, and a
  machine without ``dcgmi`` skips saying so.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from acceptance_runs import acceptance_run, measurements, results_dir

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance"
DCGM_DATA = REPO / "tests" / "data" / "dcgm"


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_SOAK", raising=False)
    files = {"test_fabric": ACCEPTANCE / "test_fabric.py", "test_burnin": ACCEPTANCE / "test_burnin.py"}
    return acceptance_run(
        pytester, monkeypatch, tmp_path, files, "--hw=cpu-local", conftest=ACCEPTANCE / "conftest.py"
    )


def up_interfaces() -> list[str]:
    """This machine's interfaces whose operstate is up. A veth that a network-namespace test beside
    this one (the other xdist worker) has just made in this namespace moves into its namespace a
    moment later: one that is gone by the time its operstate is read is skipped, not an error."""
    names = []
    for path in Path("/sys/class/net").iterdir():
        try:
            state = (path / "operstate").read_text().strip()
        except FileNotFoundError:
            continue
        if state == "up":
            names.append(path.name)
    return names


def test_the_fabric_readings_bracket_the_run_and_judge_the_interfaces_that_are_up(run, tmp_path):
    result = run("test_fabric.py", "-k", "fabric_before or fabric_after")
    result.assert_outcomes(passed=2)
    rows = [m for m in measurements(tmp_path) if m["metric"] == "fabric.error_increase"]
    up = sorted(name for name in up_interfaces() if not name.startswith(("docker", "lo")))
    if not any(name.startswith("ib") for name in up):  # NCCL prefers ib* interfaces when there are any
        assert sorted(m["labels"]["device"] for m in rows) == up
    assert all(m["verdict"] == "pass" and m["labels"]["counter"] == "all" for m in rows)
    result.stdout.fnmatch_lines(["*fabric ports counted on *"])


def test_the_soak_is_off_without_the_option_and_says_how_to_turn_it_on(run):
    result = run("test_fabric.py", "-k", "test_soak")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*soak mode is off: pass --gpucluster-soak DURATION (e.g. 10m)*"])


def test_a_soak_duration_that_is_not_one_is_a_usage_error(run):
    result = run("test_fabric.py", "--gpucluster-soak", "ten minutes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--gpucluster-soak: expected a duration such as 10m, 90s or 1h, got 'ten minutes'*"]
    )


def stand_in_dcgmi(directory: Path, recorded: Path, exit_code: int) -> Path:
    """A ``dcgmi`` that records its arguments and prints a recorded run, as the real one does."""
    directory.mkdir()
    script = directory / "dcgmi"
    script.write_text(
        f'#!/bin/sh\necho "$@" > "{directory / "argv"}"\ncat "{recorded}"\nexit {exit_code}\n',
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def test_dcgm_diag_of_a_failing_gpu_fails_naming_the_gpu_and_the_test(run, tmp_path, monkeypatch):
    recorded = DCGM_DATA / "diag_4.5.2_gb10_level2_memory_pcie_pass_software_fail_glimmer.json"
    bin_dir = stand_in_dcgmi(tmp_path / "bin", recorded, 226)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = run("test_fabric.py", "-k", "dcgm")
    result.assert_outcomes(failed=1)
    assert (bin_dir / "argv").read_text().split() == ["diag", "-r", "2", "-j"]  # the profile's default level
    result.stdout.fnmatch_lines(
        ["*burnin.dcgm (node=*, gpu=0, test=software, status=Fail)*Persistence mode for GPU 0*"]
    )
    rows = [m for m in measurements(tmp_path) if m["metric"] == "burnin.dcgm"]
    assert sorted((m["labels"]["test"], m["verdict"]) for m in rows) == [
        ("memory", "pass"),
        ("pcie", "pass"),
        ("software", "fail"),
    ]
    suspects = json.loads((results_dir(tmp_path) / "suspects.json").read_text())["suspects"]
    assert [(s["kind"], s["gpu"], s["check"]) for s in suspects] == [("gpu", "GPU 0", "dcgm")]


def test_dcgm_diag_skips_where_no_node_has_dcgmi(run, tmp_path, monkeypatch):
    empty = tmp_path / "nobin"
    empty.mkdir()
    python_dir = Path(os.path.realpath(os.sys.executable)).parent
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{python_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    if any((Path(d) / "dcgmi").exists() for d in os.environ["PATH"].split(os.pathsep)):
        pytest.skip("this machine has a real dcgmi in /usr/bin")
    result = run("test_fabric.py", "-k", "dcgm")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*DCGM diagnostics: 'dcgmi' is not on PATH on * (DCGM is not installed there)*"]
    )


def test_the_dry_run_prints_every_burnin_and_fabric_jobs_deadline_with_the_allowance(run, capsys):
    """A site that grants its ranks 10 minutes to start (--rendezvous-timeout 600) sees, before
    spending an allocation, that no burn-in or fabric job is killed within that: each job's timeout,
    its work and the rendezvous allowance (480 s beyond the jobs' 120 s start-up on one node)."""
    result = run(
        "test_fabric.py", "test_burnin.py", "--gpucluster-dry-run", "--rendezvous-timeout=600", "-s", "-v"
    )
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.lines + capsys.readouterr().out.splitlines()
    plan = {}
    for line in out:
        if "[dry run] plan: burnin-" in line:
            name, _, rest = line.split("[dry run] plan: ", 1)[1].partition(": ")
            plan[name] = rest
    expected = {
        "burnin-health",
        "burnin-straggler-sweep",
        "burnin-injected-straggler",
        "burnin-fabric",
        "burnin-dcgm",
    }
    assert expected <= set(plan), out
    allowance = "--rendezvous-timeout 600 s (from command line) grants 1 node(s) 600 s (10 min) to start"
    for name in expected:
        assert allowance in plan[name], (name, plan[name])
    assert plan["burnin-fabric"].startswith("1 node(s) x 1 rank(s), job timeout 630 s (10.5 min) (derived: ")
    assert "job timeout 1,080 s (18 min)" in plan["burnin-health"]
    assert "GB moved (21 calls per size) at a 0.05 GB/s floor" in plan["burnin-straggler-sweep"]
    assert "s of injected delay" in plan["burnin-injected-straggler"]
    # an explicit --job-timeout wins over every derived one, and says where it came from
    forced = run(
        "test_fabric.py", "-k", "fabric_before", "--gpucluster-dry-run", "--job-timeout=200", "-s", "-v"
    )
    assert forced.ret == pytest.ExitCode.OK
    forced_out = forced.stdout.lines + capsys.readouterr().out.splitlines()
    line = next(line for line in forced_out if "[dry run] plan: burnin-fabric" in line)
    assert "job timeout 200 s (3.33 min) (--job-timeout from command line)" in line, line
