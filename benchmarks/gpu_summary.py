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
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_summary_format import (
    failed_tests,
    fmt,
    labels_text,
    outcome_counts,
    outcome_lines,
    read_json,
    threshold_text,
    verdict_of,
)
from gpu_summary_numerics import numerics_headline, numerics_lines

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
ROWS_PER_METRIC = 6
"""A metric with more rows than this (a sweep) is shown as its range, its failures listed."""


@dataclass(frozen=True, slots=True)
class StepRun:
    name: str
    rc: str
    seconds: str
    limit: str
    note: str


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
    lines += outcome_lines(results)
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


def headline_lines(
    facts: Mapping[str, Any] | None,
    steps: Sequence[StepRun],
    dirs: Mapping[str, Path],
    loaded: Mapping[str, Mapping[str, Any] | None],
    sft_log: Path | None,
    smi: Path | None,
) -> list[str]:
    """The figures in a dozen lines: what the session puts in its note first."""
    lines = ["== headline"]
    t = (facts or {}).get("torch") or {}
    rows = smi.read_text().strip().splitlines() if smi is not None and smi.is_file() else []
    card = "; ".join(rows) if rows else "no nvidia-smi (CPU fallback)"
    seen = ", ".join(d["name"] for d in t.get("devices") or []) or "none"
    missing = ", ".join((facts or {}).get("missing") or []) or "none"
    lines.append(
        f"machine: {card}; torch {t.get('torch')} (CUDA {t.get('cuda_build')}, NCCL {t.get('nccl')}) sees: {seen};"
        f" missing: {missing}"
    )
    lines.append(
        "steps: "
        + (
            ", ".join(
                f"{s.name} {'not run' if s.rc == '-' else f'exit {s.rc} in {s.seconds} s'}" for s in steps
            )
            or "none"
        )
    )
    if "numerics" in dirs:
        lines += numerics_headline(loaded["numerics"], dirs["numerics"])
    for name, results in loaded.items():
        if name == "numerics" or results is None:
            continue
        failed = [str(o.get("test_id")).split("::")[-1] for o in failed_tests(results)]
        profile = (results.get("profile") or {}).get("name")
        lines.append(
            f"{name}: profile {profile}; {outcome_counts(results)}"
            + (f"; failed: {', '.join(failed)}" if failed else "")
        )
    sft = [
        line
        for line in sft_lines(sft_log)[1:]
        if " ratio " in line or line.startswith(("harness figures", "SFT step time (", "no "))
    ]
    lines += [f"sft: {line.strip()}" for line in sft[:3]] or ["sft: no figures"]
    return lines


def summary(args: argparse.Namespace) -> tuple[str, str]:
    """(the whole summary, its headline alone)."""
    dirs = parse_results(args.results)
    loaded = {name: read_json(d / "results.json") for name, d in dirs.items()}
    steps = read_steps(args.steps)
    facts = read_json(args.facts) if args.facts else None
    busbw_note = next((s.note for s in steps if s.name == "busbw"), "")
    headline = headline_lines(facts, steps, dirs, loaded, args.sft_log, args.smi)
    lines = [
        f"GPU session summary (benchmarks/gpu_summary.py, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})",
        *headline,
    ]
    lines += machine_lines(facts, args.smi)
    lines += steps_lines(steps)
    if "numerics" in dirs:
        lines += numerics_lines(loaded["numerics"], dirs["numerics"])
    for name in dirs:
        if name != "numerics":
            lines += tier_lines(name, loaded[name])
    lines += sft_lines(args.sft_log)
    lines += busbw_lines({n: r for n, r in loaded.items() if n != "numerics"}, args.busbw_log, busbw_note)
    return "\n".join(lines) + "\n", "\n".join(headline) + "\n"


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
    text, headline = summary(args)
    args.out.write_text(text)
    # the device tool's reply shows the output's last 12,000 characters: the headline goes last
    print(text, end="")
    print(f"(the headline again, as {args.out} begins with it)")
    print(headline, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
