"""XIDs as a real unprivileged account (issue 27's "Must show"): a user made with useradd, with
``kernel.dmesg_restrict=1`` (set for the test where it was 0, and put back), runs the rank-side
reader ``workloads/_xid.kernel_xids`` for real; the node's counters readings carry what it found.
With no readable source the node is recorded with a warning that gives the one-line fix, and
passes; it fails (not measured) only under ``burnin.require_xid_source: true``.

Needs root (useradd, runuser, the sysctl); skipped otherwise, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from pytest_gpucluster.checks.burnin.health import xid_readability_checks, xid_warnings

XID_MODULE = Path(__file__).resolve().parents[2] / "pytest_gpucluster" / "workloads" / "_xid.py"
USER = "gpucluster-xid"
RESTRICT = Path("/proc/sys/kernel/dmesg_restrict")
READ = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('xid', sys.argv[1])\n"
    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    "print(json.dumps(m.kernel_xids()))\n"
)


@pytest.fixture
def unprivileged():
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"):
        pytest.skip("needs root with useradd and runuser to make and use an unprivileged account")
    before = RESTRICT.read_text().strip() if RESTRICT.exists() else None
    if before == "0":
        try:
            RESTRICT.write_text("1\n")
        except OSError as exc:
            pytest.skip(f"kernel.dmesg_restrict cannot be set here: {exc}")
    made = subprocess.run(["id", USER], capture_output=True, check=False).returncode != 0
    if made:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", USER], check=True, capture_output=True)
    try:
        yield
    finally:
        if before == "0":
            RESTRICT.write_text("0\n")
        if made:  # the machine is left with no account the test made
            subprocess.run(["userdel", USER], capture_output=True, check=False)


def _python_for(user: str) -> str:
    """An interpreter the user may run (the test's own may sit under root's 0700 home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists():
            return candidate
    pytest.skip("no system python3 an unprivileged user can run")


@pytest.fixture
def readable_reader():
    """The rank-side reader copied where the unprivileged account may read it: the checkout may sit
    in a directory only root can enter (a clone under ``mktemp -d``, mode 0700, or root's home)."""
    # /tmp, not $TMPDIR: a TMPDIR under a 0700 home would hide the copy as well
    where = Path(tempfile.mkdtemp(prefix="gpucluster-xid-", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        where.chmod(0o755)
        copy = where / "_xid.py"
        shutil.copyfile(XID_MODULE, copy)
        copy.chmod(0o644)
        yield copy
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_non_root_run_warns_with_the_fix_and_never_fails_the_node_for_the_permission(
    unprivileged, readable_reader
):
    done = subprocess.run(
        ["runuser", "-u", USER, "--", _python_for(USER), "-c", READ, str(readable_reader)],
        capture_output=True, text=True, timeout=60, check=True, cwd="/",
    )  # fmt: skip
    found = json.loads(done.stdout)
    restricted = RESTRICT.exists() and RESTRICT.read_text().strip() == "1"
    value = {"rank": 0, "host": "node-a", "user": USER}
    if found["events"] is not None:  # a source this account may read (a group, a world-readable log)
        value |= {"xid_events": found["events"], "xid_source": found["source"]}
        (check,) = xid_readability_checks([value], [value])
        assert check.value == 1.0 and not check.failed
        assert found["source"] != "dmesg" or not restricted
        return
    if restricted:
        assert "dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted" in found["why"]
    value["skipped"] = {"xid": f"XID events not readable on node-a: {found['why']}"}
    (check,) = xid_readability_checks([value], [value])
    assert not check.failed and not check.measured  # recorded, the node passes
    (warning,) = xid_warnings([check])
    assert (
        f"Fix: sudo usermod -aG adm,systemd-journal {USER}  (or: sudo sysctl -w kernel.dmesg_restrict=0"
        in warning
    )
    (strict,) = xid_readability_checks([value], [value], require=True, profile="site")
    assert strict.failed and strict.problem == "not measured"
