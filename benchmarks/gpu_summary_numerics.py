"""The numerics step's figures for the GPU session's summary (`gpu_summary.py`): per rank and dtype
the GEMM TFLOP/s, the known answer, whether the repeats gave identical bits at the profile's size,
the agreement, fp8 or why not, and the self-test, from ``results.json`` and the job's rank files."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_summary_format import (
    failed_tests,
    fmt,
    labels_text,
    outcome,
    outcome_counts,
    outcome_lines,
    outcome_message,
    read_json,
    threshold_text,
    verdict_of,
)

__all__ = ["NumericsRun", "fp8_verdict", "numerics_headline", "numerics_lines", "numerics_rank_values"]

DTYPE_ORDER = ("fp32", "tf32", "bf16", "fp16", "fp8")


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


@dataclass(frozen=True, slots=True)
class NumericsRun:
    """One numerics step's measurements by (rank, dtype), and the ranks' own values by rank."""

    results: Mapping[str, Any]
    flops: Mapping[tuple[Any, str], Any]
    known: Mapping[tuple[Any, str], Any]
    stable: Mapping[tuple[Any, str], Any]
    agree: Mapping[tuple[Any, str], Any]
    values: Mapping[Any, Mapping[str, Any]]

    @classmethod
    def read(cls, results: Mapping[str, Any], results_dir: Path) -> NumericsRun:
        ms = results.get("measurements") or []
        return cls(
            results,
            _by_rank_dtype(ms, "numerics.matmul_flops"),
            _by_rank_dtype(ms, "numerics.known_answer"),
            _by_rank_dtype(ms, "numerics.repeat_stability"),
            _by_rank_dtype(ms, "numerics.agreement"),
            {v.get("rank"): v for v in numerics_rank_values(results_dir)},
        )

    def ordered(self) -> list[tuple[Any, str]]:
        """(rank, dtype) in dtype order, then rank."""
        order = {d: i for i, d in enumerate(DTYPE_ORDER)}
        found = set(self.flops) | set(self.known) | set(self.stable)
        return sorted(found, key=lambda k: (order.get(k[1], 99), k[1], str(k[0])))

    def identical(self, key: tuple[Any, str]) -> bool | None:
        """Whether every repeat of every seed gave the same bits (None: not recorded)."""
        s = self.stable.get(key)
        return None if s is None or s.get("value") is None else float(s["value"]) == 0.0

    def profile_line(self) -> str:
        profile = self.results.get("profile") or {}
        return f"profile {profile.get('name')} ({profile.get('reason') or 'named'})"

    def self_test_line(self) -> str:
        named = [
            m for m in self.results.get("measurements") or [] if m.get("metric") == "numerics.self_test_named"
        ]
        test = outcome(self.results, "test_injected_corruption_is_named")
        return (
            "self-test (one flipped bit): named "
            + ("; ".join(labels_text(m["labels"]).strip(" ()") for m in named) or "nobody")
            + f"; test {test.get('outcome', 'not run') if test else 'not run'}"
            + (
                f": {' '.join(str(test.get('message')).split())[:300]}"
                if test and test.get("message")
                else ""
            )
        )


def _rate_text(f: Mapping[str, Any] | None) -> str:
    if f is None:
        return "no throughput recorded"
    if f.get("value") is None:
        return f"not run: {f.get('hint', '')} {verdict_of(f)}"
    spread = f.get("spread") or {}
    return (
        f"{fmt(f['value'], 'FLOP/s')} median (min {fmt(spread.get('min'), 'FLOP/s')}, max"
        f" {fmt(spread.get('max'), 'FLOP/s')}, {spread.get('n', '?')} timed chains){threshold_text(f)} {verdict_of(f)}"
    )


def numerics_lines(results: Mapping[str, Any] | None, results_dir: Path | None) -> list[str]:
    """Every numerics figure, two lines per rank and dtype, then fp8, the bits, the self-test."""
    lines = ["== numerics (acceptance/test_numerics.py)"]
    if results is None or results_dir is None:
        return [*lines, "no results.json: the numerics step did not run or died before its session ended"]
    run = NumericsRun.read(results, results_dir)
    lines.append(run.profile_line())
    lines += [line for line in outcome_lines(results) if not line.startswith("  skipped")]
    identical: dict[str, set[str]] = defaultdict(set)
    for key in run.ordered():
        rank, dtype = key
        value = run.values.get(rank) or {}
        done = (value.get("dtypes") or {}).get(dtype) or {}
        gpu = f" {value['gpu']}" if value.get("gpu") else ""
        k = run.known.get(key)
        known_text = (
            f"known answer {fmt(k['value'], '')} of bound {verdict_of(k)}" if k else "known answer: none"
        )
        same = run.identical(key)
        if same is None:
            bits = "repeat stability: not recorded"
        else:
            identical["yes" if same else "NO"].add(dtype)
            seeds = len(done.get("digests") or {}) or "?"
            bits = (
                f"bit-identical across {done.get('repeats', '?')} repeats x {seeds} seeds at n={done.get('matmul_n', '?')},"
                f" depth {done.get('depth', '?')}: {'yes' if same else 'NO'}"
                f" ({fmt(run.stable[key]['value'], '')} {run.stable[key].get('unit', '')} differ)"
            )
        a = run.agree.get(key)
        agree_text = (
            f"; agreement {fmt(a['value'], '')} {a.get('unit', '')} off the majority {verdict_of(a)}"
            if a
            else ""
        )
        lines.append(
            f"{dtype:5} rank {rank} on {value.get('host', '?')}{gpu}: {_rate_text(run.flops.get(key))}"
        )
        lines.append(f"      {known_text}; {bits}{agree_text}")
    for rank, value in sorted(run.values.items(), key=lambda kv: str(kv[0])):
        for dtype, why in (value.get("skipped") or {}).items():
            lines.append(f"{dtype:5} rank {rank}: not run: {why}")
    lines.append(f"fp8 (torch._scaled_mm): {fp8_verdict(run.flops, run.values)}")
    if identical:
        lines.append(
            "bit-identical run to run: "
            + "; ".join(f"{verdict}: {', '.join(sorted(d))}" for verdict, d in sorted(identical.items()))
        )
    if not run.agree:
        why = outcome_message(results, "test_numerics_agreement", "no agreement measurement")
        lines.append(f"agreement between GPUs: not judged ({why})")
    if run.values:
        deterministic = sorted({str(v.get("deterministic")) for v in run.values.values()})
        platforms = sorted({str((v.get("platform") or {}).get("key")) for v in run.values.values()})
        lines.append(
            f"deterministic algorithms on: {', '.join(deterministic)}; platform(s): {'; '.join(platforms)}"
        )
    lines.append(run.self_test_line())
    return lines


def numerics_headline(results: Mapping[str, Any] | None, results_dir: Path | None) -> list[str]:
    """One line per dtype (every rank's median TFLOP/s, the verdicts, identical bits), fp8, self-test."""
    if results is None or results_dir is None:
        return ["numerics: no results.json (the step did not run or died before its session ended)"]
    run = NumericsRun.read(results, results_dir)
    by_dtype: dict[str, list[tuple[Any, str]]] = defaultdict(list)
    for key in run.ordered():
        by_dtype[key[1]].append(key)
    failed = [str(o.get("test_id")).split("::")[-1] for o in failed_tests(results)]
    lines = [
        f"numerics, {run.profile_line()}: {outcome_counts(results)}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    ]
    for dtype, keys in by_dtype.items():
        rates = ", ".join(
            f"rank {rank} {fmt((run.flops.get((rank, dtype)) or {}).get('value'), 'FLOP/s')}"
            for rank, _ in keys
        )
        verdicts = {
            name: sorted({verdict_of(m[k]) for k in keys if k in m})
            for name, m in (("throughput", run.flops), ("known answer", run.known), ("agreement", run.agree))
        }
        same = {run.identical(k) for k in keys}
        bits = "yes" if same == {True} else "NO" if False in same else "not recorded"
        shown = "; ".join(f"{name} {'/'.join(v)}" for name, v in verdicts.items() if v)
        lines.append(f"  {dtype:5} {rates}; {shown}; bit-identical repeats {bits}")
    lines.append(f"  fp8 (torch._scaled_mm): {fp8_verdict(run.flops, run.values)}")
    lines.append(f"  {run.self_test_line()}")
    return lines


def fp8_verdict(flops: Mapping[tuple[Any, str], Any], values: Mapping[Any, Mapping[str, Any]]) -> str:
    """Whether fp8 GEMMs ran, and where not, the reason the ranks gave."""
    if not values:
        return "unknown: no rank reported its dtypes (the tests above say why)"
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
