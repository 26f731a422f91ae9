"""Fabric counters judged by cause (checks/fabric.py, parsers/fabric_diff.COUNTER_CLASSES): transport
errors only where the suite killed no job, rnr_nak_retry_err not benign, symbol errors as a bit error
rate, saturated counters a warning for a reader that cannot clear them (not root).

Readings are a recorded H100 node's sysfs tree (tests/data/infiniband/sysfs_h100_gpud) read by the
probe that runs on a node; "after" trees are copies with the named counters changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from pytest_gpucluster.checks.fabric import counter_checks
from pytest_gpucluster.parsers.fabric_diff import counter_class
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, parse_snapshot
from pytest_gpucluster.profiles.schema import FabricSection
from pytest_gpucluster.workloads import fabric_probe
from pytest_gpucluster.workloads.fabric_probe import snapshot

H100 = Path(__file__).resolve().parents[1] / "data" / "infiniband" / "sysfs_h100_gpud"
SECTION = FabricSection(saturated="warn")  # the recorded node has pinned counters; not the subject here


def _tree(tmp_path: Path, name: str, **counters: str) -> Path:
    root = tmp_path / name
    shutil.copytree(H100, root)
    port = root / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    for counter, value in counters.items():
        group = "hw_counters" if counter.startswith("hw_") else "counters"
        (port / group / counter.removeprefix("hw_")).write_text(value + "\n")
    return root


def _read(root: Path) -> FabricSnapshot:
    return parse_snapshot(snapshot(root, node="gpu-a17"), "gpu-a17 sysfs")


def _rows(verdict, counter):
    return [
        c for c in verdict.checks if c.labels.get("counter") == counter and c.labels.get("device") == "mlx5_1"
    ]


@pytest.mark.parametrize("counter", ["hw_req_cqe_error", "hw_resp_cqe_error", "hw_rnr_nak_retry_err"])
def test_a_transport_error_fails_where_no_job_was_killed_and_is_the_kills_where_one_was(tmp_path, counter):
    assert counter_class(counter) == "transport"  # rnr_nak_retry_err: retried past the limit, not benign
    before = _read(_tree(tmp_path, "before", **{counter: "0"}))
    after = _read(_tree(tmp_path, "after", **{counter: "4"}))
    quiet = counter_checks([before], [after], SECTION, "p", {})
    [row] = _rows(quiet, counter)
    assert row.failed and row.metric == "fabric.error_increase" and quiet.suspects
    killed = counter_checks([before], [after], SECTION, "p", {}, killed=("burnin-pair-7",))
    [row] = _rows(killed, counter)
    assert not row.failed and row.metric == "fabric.transport_errors" and not killed.suspects
    assert any("burnin-pair-7" in w and "attributed to that kill" in w for w in killed.warnings)


def test_symbol_errors_are_a_rate_per_bit_received_against_the_ber_floor(tmp_path):
    before = _read(_tree(tmp_path, "before", symbol_error="0", port_rcv_data="0"))
    # 2 symbol errors while receiving 4e12 words (1.28e14 bits): 1.6e-14, inside 1e-12
    busy = _read(_tree(tmp_path, "busy", symbol_error="2", port_rcv_data=str(4 * 10**12)))
    verdict = counter_checks([before], [busy], SECTION, "p", {})
    [row] = _rows(verdict, "symbol_error")
    assert row.metric == "fabric.bit_error_rate" and not row.failed
    assert row.value == pytest.approx(2 / 1.28e14) and str(row.ref) == "profile p: fabric.max_bit_error_rate"
    # the same 2 errors over 4e8 words (1.28e10 bits): 1.6e-10, past the floor
    idle = _read(_tree(tmp_path, "idle", symbol_error="2", port_rcv_data=str(4 * 10**8)))
    [row] = _rows(counter_checks([before], [idle], SECTION, "p", {}), "symbol_error")
    assert row.failed and "bit error rate of 1.56e-10" in row.hint


def _nobody_snapshot() -> dict:
    """The probe run as an unprivileged user (uid 65534) over a copy of the recorded tree, both in
    a directory that user can enter (pytest's tmp_path lies under a 0700 directory)."""
    with tempfile.TemporaryDirectory(prefix="gpucluster-nobody-") as tmp:
        return _probe_as_nobody(Path(tmp))


def _probe_as_nobody(work: Path) -> dict:
    shutil.copytree(H100, work / "sys")
    shutil.copy(fabric_probe.__file__, work / "fabric_probe.py")
    for path in [work, *work.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    if python is None:
        pytest.skip("no system python3 an unprivileged user can run")
    done = subprocess.run(
        [python, str(work / "fabric_probe.py"), "--sysfs-root", str(work / "sys"), "--node", "gpu-a17"],
        user=65534, group=65534, capture_output=True, text=True, timeout=60, check=True, cwd=work,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the probe as another user")
def test_a_saturated_counter_under_a_non_root_run_warns_and_under_root_fails():
    reading = _nobody_snapshot()
    assert reading["root"] is False
    unprivileged = parse_snapshot(reading, "gpu-a17 sysfs (uid 65534)")
    verdict = counter_checks([unprivileged], [unprivileged], FabricSection(), "p", {})
    [row] = _rows(verdict, "link_downed")
    assert row.metric == "fabric.saturated_counter" and not row.failed and not verdict.suspects
    assert any(
        "link_downed is pinned at its maximum 255" in w and "without root" in w for w in verdict.warnings
    )
    as_root = _read(H100)
    assert as_root.root is True
    [row] = _rows(counter_checks([as_root], [as_root], FabricSection(), "p", {}), "link_downed")
    assert row.failed and str(row.ref) == "profile p: fabric.saturated"
