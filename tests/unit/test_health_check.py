"""The health check's verdict (health_check.py): one line from a real run's results.json, the drain
command as an argv list whatever the reason holds, the quick tier on this machine only."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from pytest_gpucluster import health_check
from pytest_gpucluster.burnin.drain import drain_argv
from pytest_gpucluster.health_check import REASON_LIMIT, add_health_check_command, pytest_argv, verdict_of

RUN = Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json"


def test_a_passing_run_is_healthy():
    results = {"outcomes": [{"test_id": "a::test_x", "outcome": "passed"}, {"outcome": "skipped"}]}
    verdict = verdict_of(0, results, "", "gpu07")
    assert (
        verdict.healthy
        and verdict.reason == "gpucluster health-check on gpu07: quick tier passed (1 test(s))"
    )


def test_a_failing_run_names_its_first_failure_on_one_short_line():
    results = json.loads(RUN.read_text())
    failed = [o for o in results["outcomes"] if o["outcome"] in ("failed", "error")]
    if not failed:  # the recorded run passed: fail one of its tests as a sick node would
        results["outcomes"][0] |= {
            "outcome": "failed",
            "message": "burnin.cpu_matmul (host=vm, rank=0):\n measured 1 GFLOP/s " * 20,
        }
    verdict = verdict_of(1, results, "", "vm")
    assert not verdict.healthy
    assert verdict.reason.startswith("gpucluster health-check on vm: ") and "\n" not in verdict.reason
    assert len(verdict.reason) <= REASON_LIMIT


@pytest.mark.parametrize(
    ("code", "said"),
    [(2, "was interrupted"), (3, "internal error"), (4, "usage error"), (5, "selected no test")],
)
def test_a_pytest_exit_of_2_to_5_is_inconclusive_never_drained(code, said):
    verdict = verdict_of(code, None, "ERROR: gpucluster: unknown profile 'nope'\n\n", "vm")
    assert (verdict.healthy, verdict.state, verdict.exit_code, verdict.drains) == (
        False,
        "inconclusive",
        2,
        False,
    )
    assert verdict.reason.startswith("gpucluster health-check on vm: inconclusive, not drained: ")
    assert said in verdict.reason and verdict.reason.endswith("unknown profile 'nope'")


def test_zero_tests_passed_is_not_healthy():
    verdict = verdict_of(0, {"outcomes": [{"outcome": "skipped"}]}, "", "vm")
    assert (verdict.healthy, verdict.state, verdict.drains) == (False, "inconclusive", False)
    assert "0 quick tests passed" in verdict.reason


def test_a_failed_check_is_the_only_verdict_that_drains():
    results = {"outcomes": [{"test_id": "a::test_x", "outcome": "failed", "message": "slow"}]}
    verdict = verdict_of(1, results, "", "gpu07")
    assert (verdict.state, verdict.exit_code, verdict.drains) == ("failed", 1, True)
    assert not verdict_of(1, None, "boom", "gpu07").drains  # no results: nothing says what failed


def test_the_drain_is_an_argv_list_whatever_the_reason_holds():
    """The health check drains through burn-in's `drain_argv`, its verdict line unprefixed."""
    reason = "gpucluster health-check on gpu07: x; rm -rf / $(reboot) 'quoted'"
    assert drain_argv("gpu07", reason, prefix="") == [
        "scontrol",
        "update",
        "NodeName=gpu07",
        "State=DRAIN",
        f"Reason={reason}",
    ]


def test_a_verdict_line_is_a_whole_slurm_reason():
    results = {"outcomes": [{"test_id": "a::test_x", "outcome": "failed", "message": "slow\n" * 100}]}
    verdict = verdict_of(1, results, "", "gpu07")
    assert drain_argv("gpu07", verdict.reason, prefix="")[4] == f"Reason={verdict.reason}"


def test_the_quick_tier_runs_on_this_machine_only(tmp_path):
    argv = pytest_argv(tmp_path / "acceptance", "h200-sxm", tmp_path / "r", ["-p", "x"])
    assert argv[1:3] == ["-m", "pytest"] and argv[argv.index("-m", 3) + 1] == "quick"
    assert "--launcher=torchrun" in argv and not any(a.startswith("--hostfile") for a in argv)
    assert argv[-3:] == ["--hw=h200-sxm", "-p", "x"]
    assert f"--rootdir={tmp_path}" in argv  # test ids read acceptance/test_x.py::... from anywhere


def _suite(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "conftest.py").write_text("")
    return directory


def test_the_suite_a_wheel_carries_is_found_before_any_checkout(tmp_path):
    """A wheel installs the suite as pytest_gpucluster/acceptance: that one, wherever it sits."""
    package = tmp_path / "site-packages" / "pytest_gpucluster"
    installed = _suite(package / "acceptance")
    (tmp_path / "site-packages" / "pyproject.toml").write_text("")
    _suite(tmp_path / "site-packages" / "acceptance")
    assert health_check.default_suite(package) == installed


def test_a_checkout_s_suite_is_found_beside_its_pyproject(tmp_path):
    """From a checkout (or an editable install of one) the suite is the top-level acceptance/."""
    package = tmp_path / "checkout" / "pytest_gpucluster"
    package.mkdir(parents=True)
    suite = _suite(tmp_path / "checkout" / "acceptance")
    assert health_check.default_suite(package) is None  # no pyproject.toml: not a checkout
    (tmp_path / "checkout" / "pyproject.toml").write_text("")
    assert health_check.default_suite(package) == suite


def test_this_checkout_finds_its_own_suite():
    assert health_check.default_suite() == Path(health_check.__file__).resolve().parents[1] / "acceptance"


def test_no_suite_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(health_check, "default_suite", lambda: None)
    parser = argparse.ArgumentParser()
    add_health_check_command(parser.add_subparsers())
    args = parser.parse_args(["health-check"])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "no acceptance suite here" in err and "pytest_gpucluster/acceptance" in err and "--suite" in err


def test_a_node_name_that_names_several_nodes_is_not_drained(tmp_path, monkeypatch, capsys):
    """--drain on a failing run: burn-in's drain_argv refuses 'n[1-3]' (it would drain three nodes),
    so scontrol is never run and the check still exits 1 with its verdict."""
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "1 failed\n", "")

    monkeypatch.setattr(health_check.subprocess, "run", fake_run)
    parser = argparse.ArgumentParser()
    add_health_check_command(parser.add_subparsers())
    args = parser.parse_args(["health-check", "--suite", str(tmp_path), "--node", "n[1-3]", "--drain"])
    results = tmp_path / "r"
    results.mkdir()
    failed = {"outcomes": [{"test_id": "a::test_x", "outcome": "failed", "message": "slow"}]}
    (results / "results.json").write_text(json.dumps(failed))
    args.results_dir = str(results)
    assert args.func(args) == 1
    assert len(calls) == 1 and calls[0][1:3] == ["-m", "pytest"]  # the quick tier, and no scontrol
    err = capsys.readouterr().err
    assert "not drained: cannot build a drain command for node 'n[1-3]'" in err


H100_SYSFS = Path(__file__).parents[1] / "data" / "infiniband" / "sysfs_h100_9dev_attrs_gpud"


def _readings(**kw):
    from pytest_gpucluster.workloads.node_readings import GpuReading, NodeReadings

    gpus = tuple(GpuReading(i, f"00000000:{0x18 + i:02X}:00.0", "NVIDIA H100") for i in range(8))
    base = {"nvml": "read", "nvml_missing_package": False, "gpus": gpus,
            "pci_gpus": tuple(f"0000:{0x18 + i:02x}:00.0" for i in range(8)), "ib_ports": {}}  # fmt: skip
    return NodeReadings(**(base | kw))


def test_nvml_only_reads_the_ib_ports_of_a_recorded_sysfs_tree(monkeypatch):
    from pytest_gpucluster.workloads.node_readings import ib_ports

    ports = ib_ports(H100_SYSFS)
    assert len(ports) == 9 and all(state for state in ports.values())


def test_nvml_only_a_lost_gpu_and_a_gpu_nvml_does_not_list_fail_with_their_action():
    from pytest_gpucluster.workloads.node_readings import GpuReading

    healthy, read = health_check.nvml_verdict(_readings(), "gpu07", 8)
    assert healthy.healthy and "8 GPU(s) read by NVML" in healthy.reason and any("GPU 7" in r for r in read)
    gpus = list(_readings().gpus)
    gpus[3] = GpuReading(3, lost="NVMLError_GpuIsLost: GPU is lost")
    lost, _ = health_check.nvml_verdict(_readings(gpus=tuple(gpus)), "gpu07", 8)
    assert lost.drains and "GPU 3 is lost" in lost.reason and "reset the GPU, then RMA" in lost.reason
    missing, _ = health_check.nvml_verdict(_readings(gpus=_readings().gpus[:7]), "gpu07", 8)
    assert missing.drains and "0000:1f:00.0" in missing.reason
    gpus = list(_readings().gpus)
    gpus[1] = GpuReading(1, "00000000:19:00.0", "NVIDIA H100", remap_pending=True)
    pending, _ = health_check.nvml_verdict(_readings(gpus=tuple(gpus)), "gpu07", 8)
    assert pending.drains and "row remap is pending" in pending.reason


def test_nvml_only_a_missing_package_is_inconclusive_and_a_dead_driver_fails():
    no_pkg = _readings(
        nvml="not read: the pynvml package is not installed", nvml_missing_package=True, gpus=()
    )
    verdict, _ = health_check.nvml_verdict(no_pkg, "gpu07", 8)
    assert (verdict.state, verdict.drains) == ("inconclusive", False)
    no_driver = _readings(nvml="not read: nvmlInit failed: NVMLError_DriverNotLoaded", gpus=())
    verdict, _ = health_check.nvml_verdict(no_driver, "gpu07", 8)
    assert verdict.drains and "DriverNotLoaded" in verdict.reason
    cpu, _ = health_check.nvml_verdict(no_pkg, "vm", 0)
    assert cpu.healthy
