"""``benchmarks/gpu_session.sh`` end to end on this machine, with no step selected: the plumbing
around the steps (no ``$OUT``: a temporary folder, said; no GPU: the CPU fallback, said; the
imports checked in one line; the summary written). The steps themselves are what the acceptance
suite and the benchmarks test; ``tests/unit/test_gpu_summary.py`` reads a real run of all of them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_session_without_out_or_gpu_says_so_and_writes_the_summary(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env |= {"TMPDIR": str(tmp_path), "GPU_SESSION_STEPS": "", "GPU_SESSION_SITE": str(tmp_path / "site")}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh")],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    announced = re.search(r"OUT is unset \(not on the device machine\): the files go to (\S+)", run.stdout)
    assert announced, run.stdout
    out = Path(announced.group(1))
    assert out.parent == tmp_path
    session = (out / "session.txt").read_text()
    summary = (out / "summary.txt").read_text()
    if not (Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()):
        assert "machine: NO GPU (nvidia-smi absent): CPU fallback, every step on --hw=cpu-local" in session
        assert "nvidia-smi: absent" in summary
    assert re.search(r"^imports: (every package the session needs is there|MISSING .+)$", session, re.M)
    assert "== machine" in summary and "no step ran" in summary
    assert sorted(p.name for p in out.iterdir()) == ["session.txt", "summary.txt"]
