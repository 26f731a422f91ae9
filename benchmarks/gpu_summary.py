"""One file with every figure a GPU session measured (`gpu_session.sh`'s last step).

A device session gets back at most 8 files and has minutes to read them. This reads what the
session's steps left (each pytest step's ``results.json`` and its jobs' per-rank JSON, the SFT
benchmark's log, the step table) and writes ``summary.txt``: the machine, each step's exit status
and time, the numerics figures per dtype (TFLOP/s, known answer, bit-identical across repeats at
the profile's GEMM size, agreement, fp8 or why not, the self-test), every measurement of the tier
runs with its verdict, each job's time beside its estimate, the SFT step time, ratio and MFU, and
busbw or why none.

    python3 benchmarks/gpu_summary.py --out summary.txt --facts facts.json --steps steps.tsv \\
        --results numerics=DIR --results quick=DIR --sft-log sft.log

Reads only what the files say: a missing file is a line saying so, never a stop.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_gpucluster.results.text import format_value

EXIT_MEANINGS = {
    "0": "ok",
    "1": "tests failed",
    "2": "interrupted or usage error",
    "3": "internal error",
    "4": "refused (budget) or pytest usage error",
    "5": "no tests collected",
    "124": "timed out (SIGTERM at its limit)",
    "137": "killed (SIGKILL after its limit)",
}
DTYPE_ORDER = ("fp32", "tf32", "bf16", "fp16", "fp8")
ROWS_PER_METRIC = 6
"""A metric with more rows than this (a sweep) is shown as its range, its failures listed."""


@dataclass(frozen=True, slots=True)
class StepRun:
    name: str
    rc: str
    seconds: str
    limit: str
    note: str


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_steps(path: Path | None) -> list[StepRun]:
    """``steps.tsv``: step, exit status ('-' for not run), seconds, limit, note."""
    if path is None or not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        cells = [*line.split("\t"), "", "", "", ""][:5]
        if cells[0]:
            steps.append(StepRun(*cells))
    return steps


def fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else format_value(float(value), unit)


def labels_text(labels: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in labels.items() if k not in set(skip))
    return f" ({shown})" if shown else ""


def verdict_of(m: Mapping[str, Any]) -> str:
    return str(m.get("problem") or m.get("verdict") or "?").upper()


def threshold_text(m: Mapping[str, Any]) -> str:
    if m.get("threshold") is None:
        return ""
    return f" [{m.get('comparison', '')} {fmt(m['threshold'], m['unit'])}]"


# ---------------------------------------------------------------------------- machine and steps


def machine_lines(facts: Mapping[str, Any] | None, smi: Path | None) -> list[str]:
    lines = ["== machine"]
    if smi is not None and smi.is_file() and smi.read_text().strip():
        lines += [f"nvidia-smi: {row.strip()}" for row in smi.read_text().strip().splitlines()]
    else:
        lines.append(
            "nvidia-smi: absent (no NVIDIA GPU here: the steps ran the CPU fallback, --hw=cpu-local)"
        )
    if facts is None:
        return [*lines, "facts: not recorded (gpu_facts.py did not run)"]
    t = facts.get("torch") or {}
    gpus = "; ".join(
        f"{d['name']} cc {d['capability']}, {d['sm_count']} SMs, {d['memory_bytes'] / 2**30:.1f} GiB"
        for d in t.get("devices") or []
    )
    lines.append(
        f"python {facts.get('python')}; torch {t.get('torch')} (CUDA build {t.get('cuda_build')}, cuDNN"
        f" {t.get('cudnn')}, NCCL {t.get('nccl')}); devices torch sees: {gpus or 'none'}"
    )
    present = [f"{i['module']} {i['version']}" for i in facts.get("imports", []) if not i.get("error")]
    lines.append("packages: " + ", ".join(present))
    missing = [f"{i['module']} ({i['error']})" for i in facts.get("imports", []) if i.get("error")]
    lines.append("MISSING: " + "; ".join(missing) if missing else "missing: none")
    return lines


def steps_lines(steps: Sequence[StepRun]) -> list[str]:
    lines = ["== steps (exit status, seconds of their limit)"]
    if not steps:
        return [*lines, "no step ran (session.txt says why)"]
    for s in steps:
        status = "not run" if s.rc == "-" else f"exit {s.rc} ({EXIT_MEANINGS.get(s.rc, 'failed')})"
        took = f", {s.seconds} s of {s.limit} s" if s.seconds not in ("", "-") else ""
        lines.append(f"{s.name}: {status}{took}{f'; {s.note}' if s.note else ''}")
    return lines


# ---------------------------------------------------------------------------- numerics


def numerics_rank_values(results_dir: Path) -> list[dict[str, Any]]:
    """The numerics workload's per-rank values (not the injected self-test's), from the jobs'
    files: ``rank-N.json`` of a numerics job, or ``part-K-rank-N.json`` named ``numerics`` where
    several parts shared a launch."""
    found: list[dict[str, Any]] = []
    for job_dir in sorted(p for p in (results_dir / "jobs").glob("*") if p.is_dir()):
        job = read_json(job_dir / "job.json") or {}
        for path in sorted(job_dir.glob("*rank-*.json")):
            data = read_json(path)
            if not isinstance(data, dict):
                continue
            if path.name.startswith("part-"):
                value = data.get("value") if data.get("name") == "numerics" else None
            elif str(job.get("workload", "")).endswith("numerics:run") and "inject" not in (
                job.get("options") or {}
            ):
                value = data.get("value")
            else:
                value = None
            if isinstance(value, dict) and "dtypes" in value:
                found.append(value)
    return found


def _by_rank_dtype(measurements: Iterable[Mapping[str, Any]], metric: str) -> dict[tuple[Any, str], Any]:
    return {
        (m["labels"].get("rank"), str(m["labels"].get("dtype"))): m
        for m in measurements
        if m.get("metric") == metric and "dtype" in m.get("labels", {})
    }


def numerics_lines(results: Mapping[str, Any] | None, results_dir: Path | None) -> list[str]:
    lines = ["== numerics (acceptance/test_numerics.py)"]
    if results is None or results_dir is None:
        return [*lines, "no results.json: the numerics step did not run or died before its session ended"]
    profile = results.get("profile") or {}
    lines.append(f"profile {profile.get('name')} ({profile.get('reason') or 'named'})")
    ms = results.get("measurements") or []
    flops = _by_rank_dtype(ms, "numerics.matmul_flops")
    known = _by_rank_dtype(ms, "numerics.known_answer")
    stable = _by_rank_dtype(ms, "numerics.repeat_stability")
    agree = _by_rank_dtype(ms, "numerics.agreement")
    values = {v.get("rank"): v for v in numerics_rank_values(results_dir)}
    order = {d: i for i, d in enumerate(DTYPE_ORDER)}
    keys = sorted(set(flops) | set(known) | set(stable), key=lambda k: (order.get(k[1], 99), k[1], str(k[0])))
    identical: dict[str, list[str]] = defaultdict(list)
    for rank, dtype in keys:
        value = values.get(rank) or {}
        done = (value.get("dtypes") or {}).get(dtype) or {}
        gpu = f" {value['gpu']}" if value.get("gpu") else ""
        who = f"rank {rank} on {value.get('host', '?')}{gpu}"
        f = flops.get((rank, dtype))
        if f is not None and f.get("value") is not None:
            spread = f.get("spread") or {}
            rate = (
                f"{fmt(f['value'], 'FLOP/s')} median (min {fmt(spread.get('min'), 'FLOP/s')}, max"
                f" {fmt(spread.get('max'), 'FLOP/s')}, {spread.get('n', '?')} timed chains){threshold_text(f)} {verdict_of(f)}"
            )
        elif f is not None:
            rate = f"not run: {f.get('hint', '')} {verdict_of(f)}"
        else:
            rate = "no throughput recorded"
        k = known.get((rank, dtype))
        known_text = (
            f"known answer {fmt(k['value'], '')} of bound {verdict_of(k)}" if k else "known answer: none"
        )
        s = stable.get((rank, dtype))
        if s is not None and s.get("value") is not None:
            same = float(s["value"]) == 0.0
            identical["yes" if same else "NO"].append(dtype)
            size = f"n={done.get('matmul_n', '?')}, depth {done.get('depth', '?')}"
            seeds = len(done.get("digests") or {}) or "?"
            bits = (
                f"bit-identical across {done.get('repeats', '?')} repeats x {seeds} seeds at {size}:"
                f" {'yes' if same else 'NO'} ({fmt(s['value'], '')} {s.get('unit', '')} differ)"
            )
        else:
            bits = "repeat stability: not recorded"
        a = agree.get((rank, dtype))
        agree_text = (
            f"agreement {fmt(a['value'], '')} {a.get('unit', '')} off the majority {verdict_of(a)}"
            if a
            else ""
        )
        lines.append(f"{dtype:5} {who}: {rate}")
        lines.append(f"      {known_text}; {bits}{f'; {agree_text}' if agree_text else ''}")
    for rank, value in sorted(values.items(), key=lambda kv: str(kv[0])):
        for dtype, why in (value.get("skipped") or {}).items():
            lines.append(f"{dtype:5} rank {rank}: not run: {why}")
    lines.append(f"fp8 (torch._scaled_mm): {fp8_verdict(flops, values)}")
    if identical:
        lines.append(
            "bit-identical run to run: "
            + "; ".join(f"{verdict}: {', '.join(sorted(set(d)))}" for verdict, d in sorted(identical.items()))
        )
    if not agree:
        lines.append(
            "agreement between GPUs: not judged ("
            + _outcome_message(results, "test_numerics_agreement", "no agreement measurement")
            + ")"
        )
    deterministic = {v.get("deterministic") for v in values.values()}
    platforms = sorted({str((v.get("platform") or {}).get("key")) for v in values.values()})
    lines.append(f"deterministic algorithms on: {sorted(deterministic)}; platform(s): {'; '.join(platforms)}")
    named = [m for m in ms if m.get("metric") == "numerics.self_test_named"]
    outcome = _outcome(results, "test_injected_corruption_is_named")
    lines.append(
        "self-test (one flipped bit): named "
        + ("; ".join(labels_text(m["labels"]).strip(" ()") for m in named) or "nobody")
        + f"; test {outcome.get('outcome', 'not run') if outcome else 'not run'}"
        + (f": {outcome.get('message')}" if outcome and outcome.get("message") else "")
    )
    return lines


def fp8_verdict(flops: Mapping[tuple[Any, str], Any], values: Mapping[Any, Mapping[str, Any]]) -> str:
    """Whether fp8 GEMMs ran, and where not, the reason the ranks gave."""
    ran = [f for (_, dtype), f in flops.items() if dtype == "fp8" and f.get("value") is not None]
    if ran:
        return "ran, " + ", ".join(f"rank {f['labels'].get('rank')} {fmt(f['value'], 'FLOP/s')}" for f in ran)
    reasons = [
        f"rank {r}: {v['skipped']['fp8']}" for r, v in values.items() if "fp8" in (v.get("skipped") or {})
    ]
    if reasons:
        return "did not run (" + "; ".join(reasons) + ")"
    return (
        "did not run: not selected for this device (CPU ranks run fp32 and bf16; GPUs run fp8 from compute"
        " capability 8.9, where torch has it)"
    )


def _outcome(results: Mapping[str, Any], test_name: str) -> Mapping[str, Any] | None:
    for o in results.get("outcomes") or []:
        if str(o.get("test_id", "")).endswith(test_name) or f"::{test_name}[" in str(o.get("test_id", "")):
            return o
    return None


def _outcome_message(results: Mapping[str, Any], test_name: str, default: str) -> str:
    o = _outcome(results, test_name)
    if o is None:
        return default
    return f"{o.get('outcome')}: {' '.join(str(o.get('message') or '').split())[:300]}"


# ---------------------------------------------------------------------------- tier runs


def measurement_lines(measurements: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every measurement: a metric's rows one by one, or its range where it has many."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for m in measurements:
        groups[str(m.get("metric"))].append(m)
    lines = []
    for metric, rows in groups.items():
        if len(rows) <= ROWS_PER_METRIC:
            for m in rows:
                value = fmt(m.get("value"), str(m.get("unit", "")))
                lines.append(
                    f"  {metric}{labels_text(m.get('labels') or {})}: {value}{threshold_text(m)} {verdict_of(m)}"
                )
            continue
        unit = str(rows[0].get("unit", ""))
        numbers = [float(m["value"]) for m in rows if m.get("value") is not None]
        counts: dict[str, int] = defaultdict(int)
        for m in rows:
            counts[verdict_of(m)] += 1
        spread = (
            f"min {fmt(min(numbers), unit)}, median {fmt(statistics.median(numbers), unit)}, max {fmt(max(numbers), unit)}"
            if numbers
            else "no values"
        )
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        lines.append(f"  {metric}: {len(rows)} rows, {spread}; {verdicts}")
        for m in rows:
            if verdict_of(m) not in ("PASS", "INFO"):
                lines.append(
                    f"    {verdict_of(m)}{labels_text(m.get('labels') or {})}: {fmt(m.get('value'), unit)}{threshold_text(m)}"
                )
    return lines


def tier_lines(name: str, results: Mapping[str, Any] | None) -> list[str]:
    lines = [f"== {name}"]
    if results is None:
        return [*lines, "no results.json: the step did not run or died before its session ended"]
    profile = results.get("profile") or {}
    tier = results.get("tier") or {}

    def own(value: Any) -> str:
        return "the profile's own" if value is None else f"{value} s"

    lines.append(
        f"profile {profile.get('name')} ({profile.get('reason') or 'named'}); tier {tier.get('name')}"
        f" (health load {own(tier.get('load_s'))}, numerics {own(tier.get('numerics_s'))}, sweeps"
        f" {tier.get('sweep')})"
    )
    outcomes = results.get("outcomes") or []
    counts: dict[str, int] = defaultdict(int)
    for o in outcomes:
        counts[str(o.get("outcome"))] += 1
    lines.append("tests: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none recorded"))
    for o in outcomes:
        if o.get("outcome") in ("failed", "error"):
            message = " ".join(str(o.get("message") or "").split())[:400]
            lines.append(f"  FAILED {o.get('test_id')}: {message}")
    for o in outcomes:
        if o.get("outcome") == "skipped":
            message = " ".join(str(o.get("message") or "").split())[:200]
            lines.append(f"  skipped {str(o.get('test_id')).split('::')[-1]}: {message}")
    jobs = results.get("jobs") or []
    if jobs:
        lines.append("jobs (actual / estimate / deadline, seconds):")
        for j in jobs:
            lines.append(
                f"  {'+'.join(j.get('parts') or [str(j.get('job_id'))])} on {j.get('nodes')} node(s):"
                f" {j.get('actual_s')} / {j.get('estimate_s')} / {j.get('deadline_s')} {j.get('status')}"
            )
    measurements = results.get("measurements") or []
    lines.append(f"measurements ({len(measurements)}):")
    lines += measurement_lines(measurements)
    for f in results.get("findings") or []:
        lines.append(
            f"  finding: {f.get('metric')} at {f.get('where')}: {f.get('reason')}, next {f.get('action')}"
            f" ({' '.join(str(f.get('why') or '').split())[:200]})"
        )
    return lines


# ---------------------------------------------------------------------------- SFT and busbw

_SFT_KEEP = re.compile(
    r"^(SFT step time|stopped,|round \d+|  95% CI|diagnostic|harness figures|\(\d+ s in all\))"
)


def sft_lines(log: Path | None) -> list[str]:
    """The SFT benchmark's own figure lines (step times, ratio, interval, MFU), as it printed them."""
    lines = ["== SFT overhead (benchmarks/sft_overhead.py)"]
    if log is None or not log.is_file():
        return [*lines, "no log: the step did not run"]
    text = log.read_text(errors="replace").splitlines()
    kept = [line.rstrip() for line in text if _SFT_KEEP.match(line)]
    if not any(" ratio " in line for line in kept):
        tail = [line.rstrip() for line in text if line.strip()][-8:]
        return [*lines, *kept, "no ratio line: the benchmark did not finish; its last lines:", *tail]
    return [*lines, *kept]


def busbw_lines(
    tier_results: Mapping[str, Mapping[str, Any] | None], busbw_log: Path | None, note: str
) -> list[str]:
    lines = ["== busbw"]
    for name, results in tier_results.items():
        if results is None:
            continue
        rows = [
            m
            for m in results.get("measurements") or []
            if re.match(r"collectives\.[a-z_]+\.busbw_(peak|at_max_size)$", str(m.get("metric")))
        ]
        for m in rows:
            lines.append(
                f"{name}: {m['metric']}{labels_text(m.get('labels') or {})}: {fmt(m.get('value'), m['unit'])}"
            )
        if not rows:
            why = sorted(
                {
                    f"{o.get('outcome')}: {' '.join(str(o.get('message') or '').split())[:200]}"
                    for o in results.get("outcomes") or []
                    if "test_collectives.py" in str(o.get("test_id"))
                }
            )
            lines.append(f"{name}: no busbw measured; collective tests: {' | '.join(why[:3]) or 'none ran'}")
    if busbw_log is not None and busbw_log.is_file():
        lines += [
            line.rstrip() for line in busbw_log.read_text(errors="replace").splitlines() if " ratio " in line
        ]
    if note:
        lines.append(f"busbw_fidelity.py --nccl-tests: {note}")
    return lines


# ---------------------------------------------------------------------------- main


def parse_results(pairs: Sequence[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pair in pairs:
        name, sep, directory = pair.partition("=")
        if not sep or not name or not directory:
            raise SystemExit(f"--results takes NAME=DIR (a step's results directory), got {pair!r}")
        out[name] = Path(directory)
    return out


def summary(args: argparse.Namespace) -> str:
    dirs = parse_results(args.results)
    loaded = {name: read_json(d / "results.json") for name, d in dirs.items()}
    steps = read_steps(args.steps)
    busbw_note = next((s.note for s in steps if s.name == "busbw"), "")
    lines = [
        f"GPU session summary (benchmarks/gpu_summary.py, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})"
    ]
    lines += machine_lines(read_json(args.facts) if args.facts else None, args.smi)
    lines += steps_lines(steps)
    if "numerics" in dirs:
        lines += numerics_lines(loaded["numerics"], dirs["numerics"])
    for name in dirs:
        if name != "numerics":
            lines += tier_lines(name, loaded[name])
    lines += sft_lines(args.sft_log)
    lines += busbw_lines({n: r for n, r in loaded.items() if n != "numerics"}, args.busbw_log, busbw_note)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write the summary here (and print it)")
    parser.add_argument("--facts", type=Path, default=None, help="gpu_facts.py's JSON")
    parser.add_argument("--smi", type=Path, default=None, help="nvidia-smi --query-gpu CSV rows")
    parser.add_argument("--steps", type=Path, default=None, help="the step table gpu_session.sh wrote")
    parser.add_argument(
        "--results", action="append", default=[], help="NAME=DIR: a pytest step's results dir"
    )
    parser.add_argument("--sft-log", type=Path, default=None)
    parser.add_argument("--busbw-log", type=Path, default=None)
    args = parser.parse_args(argv)
    text = summary(args)
    args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
