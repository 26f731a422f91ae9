"""The GPU session's summary (``benchmarks/gpu_summary.py``) read off a real CPU-fallback run of
``benchmarks/gpu_session.sh`` (``tests/data/gpu_session/cpu_vm``, SOURCES.md there): every figure
it prints must be the one in the run's files, and a step that left nothing must be said, not crash.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.results.text import format_value

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RUN = ROOT / "tests" / "data" / "gpu_session" / "cpu_vm"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

gpu_summary = importlib.import_module("gpu_summary")
gpu_summary_numerics = importlib.import_module("gpu_summary_numerics")


def _summary(tmp_path: Path, *extra: str) -> str:
    out = tmp_path / "summary.txt"
    argv = [
        "--out", str(out), "--facts", str(RUN / "facts.json"), "--steps", str(RUN / "steps.tsv"),
        "--results", f"numerics={RUN / 'numerics'}", "--results", f"quick={RUN / 'quick'}",
        "--sft-log", str(RUN / "sft.log"), *extra,
    ]  # fmt: skip
    assert gpu_summary.main(argv) == 0
    return out.read_text()


def _measurements(step: str, metric: str) -> list[dict]:
    results = json.loads((RUN / step / "results.json").read_text())
    return [m for m in results["measurements"] if m["metric"] == metric]


def test_numerics_figures_are_the_runs(tmp_path: Path) -> None:
    text = _summary(tmp_path).splitlines()
    flops = _measurements("numerics", "numerics.matmul_flops")
    assert len(flops) == 4  # 2 ranks x fp32, bf16
    for m in flops:
        rank, dtype = m["labels"]["rank"], m["labels"]["dtype"]
        line = next(line for line in text if line.startswith(f"{dtype:5} rank {rank} on "))
        assert f"{format_value(m['value'], 'FLOP/s')} median" in line
        assert f"min {format_value(m['spread']['min'], 'FLOP/s')}" in line
        assert line.endswith(m["verdict"].upper())
    for m in _measurements("numerics", "numerics.known_answer"):
        rank, dtype = m["labels"]["rank"], m["labels"]["dtype"]
        index = next(i for i, line in enumerate(text) if line.startswith(f"{dtype:5} rank {rank} on "))
        assert f"known answer {format_value(m['value'], '')} of bound PASS" in text[index + 1]
        assert "bit-identical across" in text[index + 1] and "at n=256, depth 4: yes" in text[index + 1]
    assert "bit-identical run to run: yes: bf16, fp32" in text
    assert any(line.startswith("fp8 (torch._scaled_mm): did not run") for line in text)
    assert (
        "self-test (one flipped bit): named host=vm, rank=1, dtype=fp32, injected=True; test passed" in text
    )


def test_headline_comes_first_and_holds_each_dtypes_figures(tmp_path: Path) -> None:
    text = _summary(tmp_path).splitlines()
    assert text[1] == "== headline"
    headline = text[: text.index("== machine")]
    for m in _measurements("numerics", "numerics.matmul_flops"):
        line = next(line for line in headline if line.startswith(f"  {m['labels']['dtype']:5} "))
        assert f"rank {m['labels']['rank']} {format_value(m['value'], 'FLOP/s')}" in line
        assert line.endswith("bit-identical repeats yes")
    assert any(
        line.startswith("quick: profile cpu-local; 2 failed, 5 passed, 13 skipped; failed: ")
        for line in headline
    )
    ratio = next(line for line in (RUN / "sft.log").read_text().splitlines() if " ratio " in line)
    assert f"sft: {ratio}" in headline


def test_repeat_counts_come_from_the_numerics_part_not_the_self_test() -> None:
    values = gpu_summary_numerics.numerics_rank_values(RUN / "numerics")
    assert sorted(v["rank"] for v in values) == [0, 1]
    assert all(v["injected"] is None for v in values)
    parts = sorted((RUN / "numerics" / "jobs").glob("*/part-0-rank-*.json"))
    recorded = {json.loads(p.read_text())["value"]["rank"]: json.loads(p.read_text())["value"] for p in parts}
    for v in values:
        assert v["dtypes"]["fp32"]["repeats"] == recorded[v["rank"]]["dtypes"]["fp32"]["repeats"]


def test_tier_failures_measurements_and_jobs_are_listed(tmp_path: Path) -> None:
    text = _summary(tmp_path)
    results = json.loads((RUN / "quick" / "results.json").read_text())
    failed = [o["test_id"] for o in results["outcomes"] if o["outcome"] == "failed"]
    assert failed  # the recorded run had two (machine load; SOURCES.md)
    for test_id in failed:
        assert f"  FAILED {test_id}: " in text
    for metric in {m["metric"] for m in results["measurements"]}:
        assert f"  {metric}" in text
    for job in results["jobs"]:
        assert f"{job['actual_s']} / {job['estimate_s']} / {job['deadline_s']}" in text
    assert "quick: exit 1 (tests failed), 34 s of 314 s" in text
    assert "busbw: not run; no nccl-tests binaries" in text


def test_sft_figures_are_the_benchmarks_lines(tmp_path: Path) -> None:
    text = _summary(tmp_path)
    log = (RUN / "sft.log").read_text().splitlines()
    ratio = next(line for line in log if " ratio " in line)
    assert ratio in text
    assert next(line for line in log if line.startswith("harness figures")) in text


def test_an_unfinished_sft_run_shows_its_last_lines(tmp_path: Path) -> None:
    log = (RUN / "sft.log").read_text().splitlines()
    cut = tmp_path / "sft.log"
    cut.write_text("\n".join([*log[:3], "RuntimeError: CUDA out of memory"]) + "\n")
    lines = gpu_summary.sft_lines(cut)
    assert "no ratio line: the benchmark did not finish; its last lines:" in lines
    assert lines[-1] == "RuntimeError: CUDA out of memory"


def test_steps_that_left_nothing_are_said(tmp_path: Path) -> None:
    out = tmp_path / "summary.txt"
    missing = tmp_path / "nothing"
    gpu_summary.main(
        ["--out", str(out), "--results", f"numerics={missing}", "--results", f"standard={missing}",
         "--sft-log", str(missing / "sft.log")]
    )  # fmt: skip
    text = out.read_text()
    assert "no results.json: the numerics step did not run" in text
    assert "== standard\nno results.json: the step did not run" in text
    assert "== SFT overhead (benchmarks/sft_overhead.py)\nno log: the step did not run" in text
    assert "no step ran" in text


def test_results_argument_needs_a_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="NAME=DIR"):
        gpu_summary.main(["--out", str(tmp_path / "s.txt"), "--results", str(RUN / "quick")])


def test_session_scripts_parse() -> None:
    for script in ("gpu_session.sh", "gpu_session_wheels.sh"):
        subprocess.run(["bash", "-n", str(BENCHMARKS / script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed here (apt-get install shellcheck): only bash -n ran")
    subprocess.run(
        ["shellcheck", *(str(BENCHMARKS / s) for s in ("gpu_session.sh", "gpu_session_wheels.sh"))],
        check=True,
    )


def test_a_failed_numerics_job_is_named_not_hidden(tmp_path: Path) -> None:
    failed_run = RUN.parent / "cpu_vm_numerics_job_timeout"
    out = tmp_path / "summary.txt"
    gpu_summary.main(["--out", str(out), "--results", f"numerics={failed_run}"])
    text = out.read_text()
    results = json.loads((failed_run / "results.json").read_text())
    failed = [o["test_id"] for o in results["outcomes"] if o["outcome"] == "failed"]
    assert len(failed) == 6
    assert f"numerics, profile cpu-local (--hw=cpu-local from command line): {len(failed)} failed" in text
    for test_id in failed:
        assert f"  FAILED {test_id}: " in text
    assert "fp8 (torch._scaled_mm): unknown: no rank reported its dtypes (the tests above say why)" in text
    assert "self-test (one flipped bit): named nobody; test failed: Failed: JobFailed: " in text
