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


NVIDIA_SMI_STANDIN = """#!/bin/sh
# nvidia-smi as the GPU branch of gpu_session.sh calls it, on one H200: the plain table is the
# recorded one (tests/data/nvidia_smi); -L and the CSV query answer in nvidia-smi's formats.
case "$1" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  --format=csv,noheader) echo "0, NVIDIA H200, 550.90.12, 143771 MiB, 5, 16, 1980 MHz, 700.00 W" ;;
  *) cat "{table}" ;;
esac
"""


def test_gpu_branch_picks_auto_counts_gpus_and_says_why_busbw_did_not_run(tmp_path: Path) -> None:
    """With nvidia-smi answering (a stand-in replaying a recorded one-H200 table) the script takes
    the GPU branch: --hw=auto, the GPU count from ``nvidia-smi -L``, nccl-tests found but refused
    on one GPU; the summary's headline starts from the card's row."""
    table = ROOT / "tests" / "data" / "nvidia_smi" / "smi_h200_1gpu_passthrough_550.90.12_smisim.txt"
    bin_dir, nccl_tests = tmp_path / "bin", tmp_path / "nccl-tests"
    bin_dir.mkdir()
    nccl_tests.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI_STANDIN.replace("{table}", str(table)))
    smi.chmod(0o755)
    (nccl_tests / "all_reduce_perf").write_text("#!/bin/sh\nexit 1\n")
    (nccl_tests / "all_reduce_perf").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ) | {
        "OUT": str(out), "TMPDIR": str(tmp_path), "GPU_SESSION_STEPS": "busbw",
        "GPU_SESSION_SITE": str(tmp_path / "site"), "NCCL_TESTS_DIR": str(nccl_tests),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }  # fmt: skip
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh")],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    session = (out / "session.txt").read_text()
    assert (
        "machine: 0, NVIDIA H200, 550.90.12, 143771 MiB, 5, 16, 1980 MHz, 700.00 W; 1 GPU(s); profile --hw=auto"
        in session
    )
    assert "== nvidia-smi\n" in session and "NVIDIA H200" in session.split("== nvidia-smi\n", 1)[1]
    assert f"step busbw: not run: nccl-tests in {nccl_tests}, but 1 GPU(s)" in session
    summary = (out / "summary.txt").read_text()
    assert "\nmachine: 0, NVIDIA H200, 550.90.12, 143771 MiB" in summary
    assert "busbw_fidelity.py --nccl-tests: nccl-tests in" in summary
