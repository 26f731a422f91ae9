"""``gpucluster health-check --drain`` drains only on a failed check, run as Slurm runs it.

A recording stand-in ``scontrol`` on PATH writes every call it gets to a file. The real quick tier
(cpu-local) with a timeout it cannot meet, and a run with an unknown ``--hw``, both exit non-zero
with their reason, and the file stays empty: the check's own trouble never drains a node.
``--nvml-only`` on this machine reads NVML and sysfs, launches no job, and says what it read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).parents[2]


def _recording_scontrol(tmp_path: Path) -> tuple[str, Path]:
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", calls


def _health_check(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "PYTEST_"))}
    env |= {
        "SLURMD_NODENAME": "hc-node",
        "PATH": path,
        "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest_gpucluster.cli", "health-check", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_timeout_and_an_unknown_profile_exit_non_zero_and_never_call_scontrol(tmp_path):
    path, calls = _recording_scontrol(tmp_path)
    timed_out = _health_check(path, "--hw=cpu-local", "--drain", "--timeout=3")
    assert timed_out.returncode == 2, timed_out.stdout + timed_out.stderr[-2000:]
    assert timed_out.stdout.startswith("gpucluster health-check on hc-node: inconclusive, not drained: ")
    assert "did not finish in 3 s" in timed_out.stdout
    unknown = _health_check(path, "--hw=no-such-profile", "--drain")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr[-2000:]
    assert "usage error" in unknown.stdout and "no-such-profile" in unknown.stdout
    unknown_nvml = _health_check(path, "--nvml-only", "--hw=no-such-profile", "--drain")
    assert unknown_nvml.returncode == 2 and "no-such-profile" in unknown_nvml.stdout
    # as a Slurm Prolog (which Slurm drains on any non-zero exit): inconclusive exits 0, still said
    prolog = _health_check(path, "--nvml-only", "--hw=no-such-profile", "--drain", "--inconclusive-ok")
    assert prolog.returncode == 0 and "inconclusive, not drained" in prolog.stdout
    assert not calls.exists(), calls.read_text()


def test_nvml_only_reads_nvml_and_sysfs_in_seconds_and_says_what_it_read(tmp_path):
    path, calls = _recording_scontrol(tmp_path)
    start = time.monotonic()
    done = _health_check(path, "--nvml-only", "--hw=cpu-local", "--drain")
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpucluster health-check on hc-node (nvml-only): healthy")
    assert any(line.strip().startswith("read: NVML ") for line in lines)
    assert any(line.strip().startswith("read: sysfs PCI: ") for line in lines)
    assert any(line.strip().startswith("read: sysfs InfiniBand: ") for line in lines)
    assert "no job launched" in done.stdout and not calls.exists()
    print(f"--nvml-only took {took:.2f} s (Slurm kills HealthCheckProgram at 60 s)")
