"""acceptance/test_sft.py and test_scaling.py: the pure parent side (plans/sft, checks/sft), whole runs gating
seed 000's training logs against the H800 and A800 profiles (pass and fail), skips on a machine
without what a case needs, and one real 2-rank DeepSpeed run under a copied cpu-local whose memory
ceiling is below what the ranks use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from acceptance_runs import acceptance_run, measurements, results
from node_fakes import use_machine
from recorded_warnings import warnings_of

from pytest_gpucluster.checks.sft import launched_checks, log_checks
from pytest_gpucluster.errors import ParseError, ProfileError
from pytest_gpucluster.parsers.train_log import parse_train_log
from pytest_gpucluster.plans.sft import (
    find_case,
    parse_log_argument,
    scaling_counts,
    scaling_part,
    workload_options,
)
from pytest_gpucluster.profiles.detect import MachineInfo
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.results.recorder import NotMeasured, Recorder, ThresholdFailure
from pytest_gpucluster.workloads.sft import SFTOptions

REPO = Path(__file__).resolve().parents[2]
ACCEPTANCE = REPO / "acceptance"
LOGS = REPO / "tests" / "data" / "train_logs"
CPU_LOCAL = REPO / "thresholds" / "cpu-local.yaml"
WHY = "no CUDA device on testhost (no nvidia-smi, no /dev/nvidia*)"
# DeepSpeed builds its CPU ops under $XDG_CACHE_HOME/torch_extensions (once per machine, ~30 s);
# pytester moves HOME, so the real cache is named before it does.
CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")

NO_GPU = MachineInfo(hostname="testhost", cuda_available=False, reasons={"cuda": WHY, "nccl": WHY})


# --------------------------------------------------------------------------------------------
# plans/sft and checks/sft, pure
# --------------------------------------------------------------------------------------------


def test_a_seed_case_becomes_workload_options_the_workload_accepts():
    h800 = load_profile("h800-ib").model
    options = workload_options(h800.sft.cases[0], h800.cluster)
    assert options == {
        "model": "llama2-13b",
        "zero_stage": 2,
        "offload": ["optimizer"],  # seed 000's ds_config_zero2.json offloads the optimizer
        "precision": "fp16",
        "micro_batch": 2,
        "grad_accum": 4,
        "gradient_checkpointing": True,
        "seq_len": 512,
        "steps": 20,
        "warmup_steps": 3,
        "extra": {"case": "llama-13b-zero2-8gpu"},
        "peak_flops": 989e12,
    }
    assert SFTOptions.from_options(options).peak_flops == 989e12


def test_offload_and_model_path_map_to_the_workloads_names():
    cpu = load_profile("cpu-local").model
    case = cpu.sft.cases[0].model_copy(
        update={"zero_stage": 3, "offload": "optimizer+params", "model": "./ckpt"}
    )
    options = workload_options(case, cpu.cluster)
    assert options["offload"] == ["optimizer", "param"] and options["model_path"] == "./ckpt"
    assert "model" not in options and "peak_flops" not in options  # cpu-local has no peak
    assert SFTOptions.from_options(options).offload == ("optimizer", "param")
    with pytest.raises(ProfileError, match=r"model 'llama-2-7b' is neither a named shape \(llama-7b, .*tiny"):
        workload_options(case.model_copy(update={"model": "llama-2-7b"}), cpu.cluster)


def test_train_log_arguments_and_cases():
    assert parse_log_argument("logs/*.log").case is None
    arg = parse_log_argument("case=llama2-70b-32gpu:/data/run 1/rank0.log")
    assert (arg.case, arg.pattern) == ("llama2-70b-32gpu", "/data/run 1/rank0.log")
    with pytest.raises(ParseError, match="expected case=NAME:PATH"):
        parse_log_argument("case=llama2-70b-32gpu")
    h800 = load_profile("h800-ib").model
    assert find_case(h800, None)[1].name == "llama-13b-zero2-8gpu"
    assert find_case(h800, "llama2-70b-32gpu")[0] == 1
    with pytest.raises(
        ProfileError, match=r"no sft case of that name \(its cases: llama-13b-zero2-8gpu, llama2"
    ):
        find_case(h800, "llama-70b")


def test_scaling_counts_and_parts():
    h200 = load_profile("h200-spectrumx").model
    assert scaling_counts(h200.scaling) == (2, 4, 8)
    four = scaling_part(h200, 4, 8, timeout_s=900)
    assert (four.nodes, four.nproc_per_node, four.name, four.measures_memory) == (
        4,
        8,
        "sft-llama2-7b-2node-4x8",
        True,
    )
    cpu = load_profile("cpu-local").model
    assert scaling_counts(cpu.scaling) == (1, 2)
    assert (
        scaling_part(cpu, 2, 2, timeout_s=900).nodes,
        scaling_part(cpu, 2, 2, timeout_s=900).nproc_per_node,
    ) == (1, 2)
    # the count that test_sft also trains is the same part: the harness runs it once
    two = scaling_part(cpu, 2, 2, timeout_s=900)
    assert two.key == scaling_part(cpu, 2, 5, timeout_s=900).key == two.key


def _rank(rank: int, step: float, memory: float, util: float | None = None) -> dict:
    return {
        "rank": rank,
        "host": f"node{rank}",
        "model": "llama2-13b",
        "params": 13e9,
        "options": {"precision": "fp16"},
        "step_times_s": [step, step * 1.02, step * 0.99],
        "step_time_median_s": step,
        "step_process_cpu_median_s": None,
        "cpu_threads": None,
        "samples_per_s": 16 / step,
        "tokens_per_s_per_device": 4096 / step,
        "mfu": 0.3,
        "peak_flops": 989e12,
        "peak_memory_bytes": memory,
        "peak_memory_kind": "cuda_max_reserved",
        "gpu_util_pct": None
        if util is None
        else {"mean": util, "min": util, "max": util, "samples": 9, "interval_s": 0.1},
        "gpu_util_reason": "not sampled: nvidia-ml-py is not installed (pip install nvidia-ml-py)",
        "losses": [2.0, 1.5, float("nan")],
    }


def test_launched_checks_gate_the_slowest_rank_and_each_ranks_memory(tmp_path):
    h800 = load_profile("h800-ib").model
    case = h800.sft.cases[0].model_copy(update={"min_gpu_util": 0.9, "min_mfu": 0.35})
    values = [_rank(0, 7.0, 60e9, 95), _rank(1, 9.0, 75e9, 95)]
    checks = launched_checks(case, 0, h800, values, "job J")
    by = {(c.metric, c.labels.get("rank")): c for c in checks}
    assert by[("sft.step_time", None)].value == 9.0 and by[("sft.step_time", None)].spread.n == 3
    assert by[("sft.samples_per_s", None)].value == pytest.approx(16 / 9)
    assert by[("sft.peak_memory", 1)].labels == {"case": "llama-13b-zero2-8gpu", "rank": 1, "host": "node1"}
    assert by[("sft.gpu_util", 0)].value == 0.95 and by[("sft.loss_finite", None)].value == 0.0
    assert all(c.measured for c in checks)
    recorder = Recorder(tmp_path / "results.json")
    with pytest.raises(ThresholdFailure) as failed:
        recorder.check_all(checks)
    lines = str(failed.value).splitlines()
    assert lines[0].startswith(
        "sft.step_time (case=llama-13b-zero2-8gpu): measured 9 s, expected at most 8.6 s (threshold from "
        "profile h800-ib: sft.cases[0].max_step_time); median of 3"
    )
    assert "rank 1 on node1 was the slowest" in lines[0] and "Job: job J." in lines[0]
    assert lines[0].endswith("Threshold: seed 000 (H800, llama-13b, 8 GPUs).")
    memory = next(line for line in lines if line.startswith("sft.peak_memory"))
    assert memory.startswith(
        "sft.peak_memory (case=llama-13b-zero2-8gpu, rank=1, host=node1): measured 69.85 GiB, "
        "expected at most 67.06 GiB"
    )
    assert len(recorder.measurements) == len(checks)  # the misses did not stop the recording

    values = [_rank(0, 7.0, 60e9), {**_rank(1, 7.0, 60e9), "mfu": None, "mfu_reason": "no peak_flops"}]
    values = [{**v, "losses": [2.0, 1.5]} for v in values]
    unmeasured = [c for c in launched_checks(case, 0, h800, values, "job J") if not c.measured]
    assert [(c.metric, c.labels.get("rank")) for c in unmeasured] == [
        ("sft.mfu", None),
        ("sft.gpu_util", 0),
        ("sft.gpu_util", 1),
    ]
    assert unmeasured[0].hint.startswith("MFU was not measured: no peak_flops. Set cluster.peak_flops")
    assert "utilisation was not sampled: nvidia-ml-py is not installed" in unmeasured[1].hint
    met = case.model_copy(
        update={k: None for k in ("max_step_time", "min_samples_per_s", "min_tokens_per_s_per_gpu")}
    )
    with pytest.raises(
        NotMeasured
    ) as gap:  # only thresholds nothing measured: a set-up gap, not a slow cluster
        Recorder(tmp_path / "r2.json").check_all(launched_checks(met, 0, h800, values, "job J"))
    assert str(gap.value).startswith(
        "NOT MEASURED: sft.mfu (case=llama-13b-zero2-8gpu): measured n/a, expected at least 35%"
    )


def test_log_checks_answer_what_a_log_can():
    h800 = load_profile("h800-ib").model
    log = parse_train_log((LOGS / "deepspeed_3742_megatron_deepspeed_bf16.log").read_text())
    checks, unchecked = log_checks(h800.sft.cases[0], 0, h800, log, "ds.log")
    got = {c.metric: (c.value, c.threshold) for c in checks}
    assert got["sft.step_time"] == (pytest.approx(4.1031), 8.6)
    assert got["sft.peak_memory"] == (pytest.approx(63.31 * 2**30), 72e9)
    assert unchecked == []
    checks, unchecked = log_checks(h800.sft.cases[1], 1, h800, log, "ds.log")
    assert unchecked == ["min_mfu: not answerable from a training log (launch the case to measure it)"]


# --------------------------------------------------------------------------------------------
# whole runs
# --------------------------------------------------------------------------------------------


@pytest.fixture
def run(pytester, tmp_path, monkeypatch):
    use_machine(monkeypatch, NO_GPU)
    monkeypatch.setenv("XDG_CACHE_HOME", CACHE_HOME)
    files = {"test_sft": ACCEPTANCE / "test_sft.py", "test_scaling": ACCEPTANCE / "test_scaling.py"}
    return acceptance_run(pytester, monkeypatch, tmp_path, files)


def test_seed_000_h800_log_passes_the_h800_case_and_says_what_it_left_unchecked(run, tmp_path):
    result = run(
        "test_sft.py", "--hw=h800-ib", f"--train-log={LOGS / 'seed000_h800_llama13b_8gpu.log'}", "-v"
    )
    result.assert_outcomes(passed=1)
    assert len(warnings_of(result)) == 1, warnings_of(result)
    result.stdout.fnmatch_lines(
        [
            "*test_sft.py::test_sft[[]log-seed000_h800_llama13b_8gpu.log[]] PASSED*",
            "*GpuClusterWarning: --train-log seed000_h800_llama13b_8gpu.log against sft case llama-13b-zero2-8gpu "
            "of profile h800-ib: not checked: max_peak_memory: the log has no peak GPU memory",
        ]
    )
    got = {m["metric"]: m for m in measurements(tmp_path)}
    assert sorted(got) == ["sft.loss_finite", "sft.samples_per_s", "sft.step_time"]
    assert (
        got["sft.step_time"]["value"],
        got["sft.step_time"]["threshold"],
        got["sft.step_time"]["unit"],
    ) == (
        7.8,
        8.6,
        "s",
    )
    assert (got["sft.samples_per_s"]["value"], got["sft.samples_per_s"]["threshold"]) == (8.209, 7.4)
    assert got["sft.step_time"]["labels"] == {
        "case": "llama-13b-zero2-8gpu",
        "log": "seed000_h800_llama13b_8gpu.log",
    }
    assert got["sft.step_time"]["ref"] == {
        "profile": "h800-ib",
        "key_path": ["sft", "cases", 0, "max_step_time"],
    }


def test_seed_000_a800_logs_by_glob_the_8_gpu_run_fails_the_1_gpu_case(run, tmp_path):
    result = run("test_sft.py", "--hw=a800-ib", f"--train-log={LOGS}/seed000_a800_*.log", "--tb=line", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_sft[[]log-seed000_a800_llama7b_1gpu.log[]] PASSED*",
            "*test_sft[[]log-seed000_a800_llama7b_8gpu.log[]] FAILED*",
            "*sft.step_time (case=llama-7b-zero2-1gpu, log=seed000_a800_llama7b_8gpu.log): measured 13.24 s, "
            "expected at most 7.7 s (threshold from profile a800-ib: sft.cases[[]0[]].max_step_time). *"
            "Threshold: seed 000 (A800, llama-7b, 1 GPU).*",
        ]
    )
    verdicts = {(m["labels"]["log"], m["metric"]): m["verdict"] for m in measurements(tmp_path)}
    assert verdicts[("seed000_a800_llama7b_8gpu.log", "sft.step_time")] == "fail"
    assert verdicts[("seed000_a800_llama7b_8gpu.log", "sft.samples_per_s")] == "pass"  # 4.835 >= 1.03
    assert {v for (log, _), v in verdicts.items() if log.endswith("1gpu.log")} == {"pass"}


def test_a_1_gpu_log_against_the_8_gpu_case_reports_every_miss(run):
    result = run(
        "test_sft.py", "--hw=h800-ib", f"--train-log={LOGS / 'seed000_h800_llama13b_1gpu.log'}", "--tb=short"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *sft.step_time (case=llama-13b-zero2-8gpu, log=seed000_h800_llama13b_1gpu.log): measured 9.11 s, "
            "expected at most 8.6 s*",
            "E *sft.samples_per_s (case=llama-13b-zero2-8gpu, log=seed000_h800_llama13b_1gpu.log): measured "
            "0.879 samples/s, expected at least 7.4 samples/s*",
        ]
    )


def test_case_prefix_picks_the_case_and_a_log_that_answers_none_of_it_fails(run, tmp_path):
    log = LOGS / "seed000_h800_llama13b_8gpu.log"
    result = run(
        "test_sft.py",
        "--hw=h800-ib",
        f"--train-log=case=llama2-70b-32gpu:{log}",
        f"--train-log=case=llama-70b:{log}",
        f"--train-log={tmp_path}/missing-*.log",
        "--tb=line",
    )
    result.assert_outcomes(failed=3)
    assert len(warnings_of(result)) == 1, warnings_of(result)
    result.stdout.fnmatch_lines_random(
        [
            f"*--train-log {log}: the log answers none of sft case llama2-70b-32gpu's thresholds "
            "(max_peak_memory: the log has no peak GPU memory; min_mfu: not answerable from a training log*",
            "*--train-log case=llama-70b: profile h800-ib has no sft case of that name (its cases: "
            "llama-13b-zero2-8gpu, llama2-70b-32gpu)*",
            f"*--train-log {tmp_path}/missing-*.log: no file matches*",
        ]
    )


def skips(tmp_path: Path) -> dict[str, str]:
    outcomes = results(tmp_path)["outcomes"]
    return {
        o["test_id"]: o["message"].removeprefix("Skipped: ") for o in outcomes if o["outcome"] == "skipped"
    }


def test_without_cuda_the_gpu_cases_and_scaling_skip_naming_what_is_missing(run, tmp_path):
    run("--hw=h200-spectrumx").assert_outcomes(skipped=3)
    no_gpu = f"node testhost: lists no GPU ({WHY})"  # judged on the node's probe, which names it
    nodes = "needs {} nodes, the cluster has 1 (local machine only; pass --hostfile); needs cuda: " + no_gpu
    assert skips(tmp_path) == {
        "test_sft.py::test_sft[llama2-7b-2node]": nodes.format(2),
        "test_scaling.py::test_scaling[llama2-7b-2node-2-to-4-nodes]": nodes.format(4),
        "test_scaling.py::test_scaling[llama2-7b-2node-4-to-8-nodes]": nodes.format(8),
    }
    run("--hw=a800-ib").assert_outcomes(skipped=2)
    assert skips(tmp_path) == {
        "test_sft.py::test_sft[llama-7b-zero2-1gpu]": f"needs 1 GPUs per node: node testhost has 0; needs cuda: {no_gpu}",
        "test_scaling.py::test_scaling[no-scaling]": (
            "profile a800-ib has no scaling: section, so there is no scaling to measure"
        ),
    }


def test_a_copied_cpu_local_with_memory_below_use_fails_naming_rank_measured_and_threshold(
    run, pytester, tmp_path
):
    """One real launch: 2 gloo ranks train the cpu-local ZeRO-2 case; the copy's ceiling is 100 MiB."""
    profile = yaml.safe_load(CPU_LOCAL.read_text(encoding="utf-8"))
    # Only the memory ceiling is tight: the speed gates are opened wide, so that a loaded machine's
    # slow steps cannot fail the run (this test is about memory, never about this machine's speed).
    case = {
        **profile["sft"]["cases"][0],
        "max_peak_memory": "100MiB",
        "max_step_time": "1h",
        "min_samples_per_s": 0.001,
        "min_tokens_per_s_per_gpu": 0.001,
    }
    profile.update(name="cpu-local-low-memory", sft={"cases": [case]})
    path = pytester.path / "cpu-local-low-memory.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    result = run("test_sft.py", f"--hw={path}", "--tb=line")
    result.assert_outcomes(failed=1)
    got = measurements(tmp_path)
    memory = sorted((m for m in got if m["metric"] == "sft.peak_memory"), key=lambda m: m["labels"]["rank"])
    assert [m["labels"]["rank"] for m in memory] == [0, 1]
    assert all(m["verdict"] == "fail" and m["threshold"] == 100 * 2**20 and m["unit"] == "B" for m in memory)
    for m in memory:
        shown = f"{m['value'] / 2**30:.4g}"
        result.stdout.fnmatch_lines(
            [
                f"*sft.peak_memory (case={case['name']}, rank={m['labels']['rank']}, host={m['labels']['host']}): "
                f"measured {shown} GiB, expected at most 0.09766 GiB (threshold from profile cpu-local-low-memory: "
                "sft.cases[[]0[]].max_peak_memory*"
            ]
        )
    # Every other measurement is there with value, unit and threshold, and passed.
    others = {m["metric"]: m for m in got if m["metric"] != "sft.peak_memory"}
    padding = others.pop("sft.padding_fraction")  # recorded beside MFU: how much of each batch was padding
    assert padding["threshold"] is None and 0 < padding["value"] < 1 and padding["verdict"] == "info"
    assert sorted(others) == [
        "sft.loss_decreased",
        "sft.loss_finite",
        "sft.samples_per_s",
        "sft.step_time",
        "sft.tokens_per_s_per_gpu",
    ]
    for m in others.values():
        assert m["verdict"] == "pass" and m["threshold"] is not None and m["unit"] and m["value"] > 0, m
    outcomes = results(tmp_path)["outcomes"]
    assert [o["category"] for o in outcomes] == ["performance"]
