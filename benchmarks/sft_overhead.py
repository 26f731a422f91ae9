"""What the harness costs a training step: its SFT workload against a plain DeepSpeed loop.

Each round runs two separate jobs, one after the other, the order alternating every round:

- the harness: the acceptance path — ``cluster.run`` of ``workloads.sft:train`` with the options
  ``sft_cases.workload_options`` makes of a profile's SFT case (default: cpu-local's first case,
  ``tiny-zero2``), ``--steps`` and ``--warmup`` replacing the case's step counts;
- the reference, launched by plain torchrun as its own job: ``benchmarks/reference/sft_plain.py``,
  a DeepSpeed + transformers loop that imports nothing from this package (its own tiny Llama
  config, its own tokenization of the Alpaca file, its own DeepSpeed config) given the case's
  ZeRO stage, precision, micro-batch, accumulation and sequence length.

Same work: both train a Llama of the same shape (the script stops if the parameter counts
differ): the case's own, passed to the reference as ``LlamaConfig`` arguments (``--model-config``),
with the case's attention implementation and gradient checkpointing, on sequences padded to the same length, build their batches before the clock, start
the timed steps together and time whole optimizer steps. Same end: both leave through
``os._exit`` after destroying the engine and the process group and flushing — the harness's
worker cannot end otherwise (ZeRO on gloo aborts at interpreter exit in about one run in six,
FEASIBILITY.md section 7), so the reference ends the same way; the end lies outside the timed
steps either way.

Both sides' ranks run in the quiet condition (``--rank-sched quiet``, ``sides.rank_sched``: rank
i pinned to core i and SCHED_FIFO, a SCHED_IDLE spinner per core so the VM's vCPUs never halt),
after an unrecorded warm-up round. Without it the paired rounds on the 2-vCPU VM read 0.70-1.11
and 6 rounds gave a +-35% interval; with it they read within 1-2% of each other.

A job's figure is the acceptance gate's: the median step time of its slowest rank. The line
ending in ``ratio`` is the median over rounds of the paired harness/reference step time, the
next line its 95% CI (order statistics; ``ratio_stats``). Rounds go on until that CI is within
+-2%, ``--max-rounds``, or the ``--max-seconds`` budget. Target: at most 1.05.

    python benchmarks/sft_overhead.py [--hw cpu-local] [--case tiny-zero2] [--steps 20] [--nproc 2]

On a GPU node, the case's shape (``--model``/``--layers``/``--micro-batch``/``--seq-len`` override
it; the real H200 run was Llama-2-7B cut to 4 layers, micro-batch 8 x 2,048 tokens, 1 GPU)::

    python benchmarks/sft_overhead.py --hw h200-spectrumx --case llama2-7b-2node --layers 4 \
        --grad-accum 1 --attn-implementation sdpa --nproc 1 --rank-sched none
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ratio_stats import median_ci, paired_ratios
from rounds import StopRule, add_stop_options, print_one_key, report_lines, run_interleaved
from sides import RANK_SCHED_CHOICES, REFERENCE_DIR, REPO, local_cluster, rank_sched, run_plain_torchrun

sys.path.insert(0, str(REPO))

from pytest_gpucluster.maths.shapes import get_shape
from pytest_gpucluster.plans.sft import SFT_WORKLOAD, workload_options
from pytest_gpucluster.profiles.loader import load_profile

REFERENCE = REFERENCE_DIR / "sft_plain.py"
DATA = REPO / "pytest_gpucluster" / "workloads" / "data" / "alpaca_tiny.json"
KEY = "step time"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="cpu-local", help="the profile whose SFT case to run")
    parser.add_argument("--case", default=None, help="the case's name (default: the profile's first)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per job (both sides)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per job first")
    parser.add_argument(
        "--nproc", type=int, default=None, help="ranks (default: the profile's ranks_per_node)"
    )
    parser.add_argument(
        "--rank-sched",
        choices=RANK_SCHED_CHOICES,
        default="quiet",
        help="how both sides' ranks are scheduled (sides.rank_sched; default quiet)",
    )
    parser.add_argument("--model", default=None, help="a named shape instead of the case's (llama2-7b, ...)")
    parser.add_argument("--layers", type=int, default=None, help="cut the shape to this many layers")
    parser.add_argument("--micro-batch", type=int, default=None, help="instead of the case's")
    parser.add_argument("--grad-accum", type=int, default=None, help="instead of the case's")
    parser.add_argument("--seq-len", type=int, default=None, help="instead of the case's")
    parser.add_argument(
        "--attn-implementation",
        default=None,
        choices=("eager", "sdpa", "flash_attention_2"),
        help="instead of the case's",
    )
    add_stop_options(parser, max_rounds=30, max_seconds=175.0)
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="unrecorded rounds first (default 1: the 2-vCPU VM's first round is off; a short GPU"
        " session passes 0, its step times excluding start-up already)",
    )
    return parser.parse_args(argv)


def harness_options(args: argparse.Namespace) -> tuple[dict[str, Any], str, str, int]:
    """(workload options, case name, backend, ranks) from the profile; SystemExit for a case the
    reference cannot mirror."""
    profile = load_profile(args.hw).model
    cases = [c for c in profile.sft.cases if args.case in (None, c.name)]
    if not cases:
        names = ", ".join(c.name for c in profile.sft.cases) or "none"
        raise SystemExit(f"profile {args.hw} has no SFT case {args.case!r}; its cases: {names}")
    case = cases[0]
    options = {**workload_options(case, profile.cluster), "steps": args.steps, "warmup_steps": args.warmup}
    overrides = {
        "model": args.model, "layers": args.layers, "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum, "seq_len": args.seq_len, "attn_implementation": args.attn_implementation,
    }  # fmt: skip
    options |= {k: v for k, v in overrides.items() if v is not None}
    if "model" not in options or options.get("offload"):
        why = "a local checkpoint (model_path)" if "model" not in options else "optimizer offload"
        raise SystemExit(
            f"case {case.name} of {args.hw} uses {why}; the reference trains a random-weight Llama of a named"
            " shape without offload: pick a case that does too, or --model NAME"
        )
    nproc = args.nproc or case.ranks_per_node or profile.cluster.ranks_per_node or 2
    return options, case.name, profile.cluster.backend, nproc


class Harness:
    def __init__(self, options: dict[str, Any], backend: str, nproc: int, results_dir: Path) -> None:
        self.cluster = local_cluster(nproc, backend, results_dir)
        self.options, self.nproc = options, nproc
        self.params: set[int] = set()
        self.cpu: list[float] = []
        """Per job, the slowest rank's median process CPU seconds per step (a diagnostic)."""
        self.figures: list[dict[str, Any]] = []
        """Per job, the slowest rank's own figures (MFU, tokens/s, peak memory; diagnostics)."""

    def __call__(self) -> dict[str, float]:
        job = self.cluster.run(SFT_WORKLOAD, timeout=600, options=self.options, name="sft-overhead")
        values = list(job.values)
        self.params.update(int(v["params"]) for v in values)
        self.cpu.append(max(float(v["step_process_cpu_median_s"]) for v in values))
        self.figures.append(max(values, key=lambda v: statistics.median(v["step_times_s"])))
        return {KEY: max(statistics.median(v["step_times_s"]) for v in values)}


def reference_model_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``LlamaConfig`` arguments of the harness's model (`workloads.sft_model.llama_config`'s),
    for the reference, which imports nothing from this package."""
    shape = get_shape(str(options["model"]))
    if options.get("layers"):
        shape = shape.with_layers(int(options["layers"]))
    d = shape.dims
    return {
        "vocab_size": d.vocab, "hidden_size": d.hidden, "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "max_position_embeddings": d.seq_len, "rms_norm_eps": shape.rms_norm_eps, "rope_theta": shape.rope_theta,
        "tie_word_embeddings": d.tied_embeddings,
    }  # fmt: skip


class Reference:
    def __init__(self, options: dict[str, Any], backend: str, nproc: int, work_dir: Path) -> None:
        self.out, self.nproc = work_dir / "reference.json", nproc
        config = work_dir / "model_config.json"
        config.write_text(json.dumps(reference_model_config(options)))
        precision = options.get("precision", "auto")
        if precision == "auto":
            precision = "bf16" if backend == "nccl" else "fp32"
        self.argv = [
            "--data", str(Path(options.get("data_path") or DATA)), "--out", str(self.out),
            "--zero-stage", str(options["zero_stage"]), "--precision", precision,
            "--micro-batch", str(options["micro_batch"]), "--grad-accum", str(options["grad_accum"]),
            "--seq-len", str(options["seq_len"]), "--steps", str(options["steps"]),
            "--warmup", str(options["warmup_steps"]), "--backend", backend, "--model-config", str(config),
            "--attn-implementation", str(options.get("attn_implementation", "sdpa")),
        ]  # fmt: skip
        if options.get("gradient_checkpointing"):
            self.argv.append("--gradient-checkpointing")
        self.params: set[int] = set()
        self.cpu: list[float] = []

    def __call__(self) -> dict[str, float]:
        self.out.unlink(missing_ok=True)
        run_plain_torchrun(REFERENCE, self.nproc, self.argv, timeout_s=600)
        record = json.loads(self.out.read_text())
        self.params.add(int(record["params"]))
        self.cpu.append(max(statistics.median(times) for times in record["step_cpu_times_by_rank"]))
        return {KEY: max(statistics.median(times) for times in record["step_times_by_rank"])}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    options, case, backend, nproc = harness_options(args)
    rule = StopRule.from_args(args)
    sched = rank_sched(args.rank_sched)
    with sched as sched_line, tempfile.TemporaryDirectory(prefix="sft-overhead-") as tmp:
        harness = Harness(options, backend, nproc, Path(tmp) / "jobs")
        reference = Reference(options, backend, nproc, Path(tmp))
        cut = f" cut to {options['layers']} layers" if options.get("layers") else ""
        print(
            f"SFT step time, case {case} of {args.hw} ({options['model']}{cut}, ZeRO-{options['zero_stage']}, micro-batch"
            f" {options['micro_batch']} x accum {options['grad_accum']} x seq {options['seq_len']}), {nproc}"
            f" {backend} ranks, {args.warmup} + {args.steps} steps per job; harness = cluster.run({SFT_WORKLOAD}),"
            f" reference = {REFERENCE.name} by plain torchrun",
            flush=True,
        )
        print(sched_line, flush=True)
        comparison = run_interleaved(
            harness,
            reference,
            rule,
            on_round=print_one_key(KEY, "harness", "reference"),
            warmup_rounds=args.warmup_rounds,
        )
    if harness.params != reference.params:
        raise SystemExit(
            f"the two sides trained different models ({sorted(harness.params)} against"
            f" {sorted(reference.params)} parameters): the comparison is void"
        )
    print()
    label = f"SFT step time (slowest rank's median, {harness.params.pop()} parameters)"
    for line in report_lines(comparison, lambda _: label, "s", "harness", "plain DeepSpeed"):
        print(line)
    # Not gated: CPU time per step is steadier than wall time on a shared machine, and tells
    # a harness that does more work from one that only waited longer.
    cpu = median_ci(paired_ratios(harness.cpu, reference.cpu))
    interval = f"{cpu.lo:.3f}-{cpu.hi:.3f}" if cpu.has_interval else "none yet"
    print(
        f"diagnostic (not gated): process CPU per step, harness over plain, median paired quotient {cpu.median:.3f} (CI {interval})"
    )
    print(harness_figures_line(harness.figures))
    return 0


def harness_figures_line(figures: Sequence[Mapping[str, Any]]) -> str:
    """The harness's own throughput figures, median over its jobs (warm-up round included) of
    the slowest rank's: what the acceptance SFT test would record for this shape."""

    def median_of(key: str) -> float | None:
        found = [float(f[key]) for f in figures if f.get(key) is not None]
        return statistics.median(found) if found else None

    mfu, tokens, memory = (
        median_of("mfu"),
        median_of("tokens_per_s_per_device"),
        median_of("peak_memory_bytes"),
    )
    first = figures[0] if figures else {}
    shown_mfu = (
        f"MFU {mfu * 100:.1f}% ({first.get('mfu_formula')}; peak {float(first['peak_flops']) / 1e12:g} TFLOP/s)"
        if mfu is not None and first.get("peak_flops")
        else f"MFU not computed ({first.get('mfu_reason') or 'no figures'})"
    )
    shown_tokens = f"{tokens:.0f} tokens/s per device" if tokens is not None else "tokens/s not reported"
    shown_memory = (
        f"peak memory {memory / 2**30:.2f} GiB" if memory is not None else "peak memory not reported"
    )
    return (
        f"harness figures (not gated; median over {len(figures)} job(s) of the slowest rank): {shown_mfu},"
        f" {shown_tokens}, {shown_memory}"
    )


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s in all)")
    sys.exit(code)
