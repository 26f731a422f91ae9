"""The benchmarks' statistics (``benchmarks/ratio_stats.py``, ``benchmarks/rounds.py``) and the
rules their references must keep: independent of the package, ending like the harness's worker.

``benchmarks/`` is not a package: its modules import each other by bare name, so the directory
goes on ``sys.path`` here. Nothing here times anything: clocks are fakes.
"""

from __future__ import annotations

import ast
import importlib
import math
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NCCL_TESTS_DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

ratio_stats = importlib.import_module("ratio_stats")
rounds = importlib.import_module("rounds")


# --- order statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "ranks"),
    [
        (5, None),  # 2 / 2**5 = 6.25% > 5%: no interval at 95%
        (6, (1, 6)),  # P(X <= 0) = 1/64 = 1.6% <= 2.5%
        (10, (2, 9)),  # P(X <= 1) = 11/1024 = 1.07%; P(X <= 2) = 56/1024 = 5.5% too much
        (20, (6, 15)),  # P(X <= 5) = 2.07%, P(X <= 6) = 5.77% (the textbook table: 6 and 15)
        (50, (18, 33)),  # P(X <= 17) = 1.64%, P(X <= 18) = 3.25%
    ],
)
def test_order_statistic_ranks_match_the_binomial_table(n: int, ranks: tuple[int, int] | None) -> None:
    assert ratio_stats.order_statistic_ranks(n, 0.95) == ranks


@pytest.mark.parametrize("n", range(6, 80))
def test_the_chosen_interval_is_the_narrowest_that_keeps_its_coverage(n: int) -> None:
    k, upper = ratio_stats.order_statistic_ranks(n, 0.95)
    assert upper == n + 1 - k

    def tail(j: int) -> float:
        return sum(math.comb(n, i) for i in range(j + 1)) / 2**n

    assert 1 - 2 * tail(k - 1) >= 0.95
    assert 1 - 2 * tail(k) < 0.95  # one rank further in would cover too little


def test_a_higher_confidence_needs_more_rounds() -> None:
    assert ratio_stats.order_statistic_ranks(6, 0.99) is None  # 2/64 = 3.1% > 1%
    assert ratio_stats.order_statistic_ranks(8, 0.99) == (1, 8)  # 2/256 = 0.8%


def test_confidence_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="confidence"):
        ratio_stats.order_statistic_ranks(10, 95)


def test_median_ci_bounds_are_sample_values_at_the_table_ranks() -> None:
    values = [1.10, 0.90, 1.00, 1.05, 0.95, 1.02, 0.98, 1.01, 0.99, 1.03]
    ci = ratio_stats.median_ci(values)
    ordered = sorted(values)
    assert ci.median == pytest.approx(statistics.median(values))
    assert (ci.lo, ci.hi) == (ordered[1], ordered[8])  # ranks 2 and 9 of 10
    assert ci.n == 10
    assert ci.coverage == pytest.approx(1 - 2 * 11 / 1024)


def test_too_few_values_give_a_median_without_an_interval() -> None:
    ci = ratio_stats.median_ci([1.0, 1.1, 0.9])
    assert ci.median == 1.0
    assert not ci.has_interval
    assert ci.relative_half_width == math.inf
    assert not ci.within(0.5)


def test_within_uses_the_farther_bound() -> None:
    ci = ratio_stats.MedianCI(1.0, 0.99, 1.025, 10, 0.95, 0.98)
    assert ci.relative_half_width == pytest.approx(0.025)
    assert not ci.within(0.02)
    assert ci.within(0.03)


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf, 1.0]])
def test_median_ci_refuses_empty_or_non_finite_input(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        ratio_stats.median_ci(bad)


def test_coverage_holds_on_skewed_data() -> None:
    """Lognormal ratios (skewed, as timing ratios are): the interval holds the true median in
    at least 95% of 3000 seeded samples of 12 — by construction ~96.1% (1 - 2 * 79/4096)."""
    rng = random.Random(2024)
    true_median = math.exp(0.01)
    hits = 0
    trials = 3000
    for _ in range(trials):
        sample = [math.exp(rng.gauss(0.01, 0.08)) for _ in range(12)]
        ci = ratio_stats.median_ci(sample)
        hits += ci.lo <= true_median <= ci.hi
    assert 0.945 <= hits / trials <= 0.98


def test_paired_ratios_pair_one_to_one() -> None:
    assert ratio_stats.paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="cannot pair 2 values with 1"):
        ratio_stats.paired_ratios([2.0, 3.0], [1.0])
    with pytest.raises(ValueError, match="round 2 measured 0"):
        ratio_stats.paired_ratios([2.0, 3.0], [1.0, 0.0])


def _last_number(line: str) -> float:
    return float(
        [token for token in line.replace("(", " ").replace(")", " ").split() if _is_number(token)][-1]
    )


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def test_the_ratio_is_the_last_number_of_its_line_and_the_ci_has_its_own() -> None:
    ci = ratio_stats.median_ci([0.97, 0.99, 1.0, 1.01, 1.02, 1.04, 0.98, 1.0])
    line = ratio_stats.ratio_line("all_reduce 16 MiB busbw harness/ref", ci)
    assert "ratio" in line
    assert _last_number(line) == pytest.approx(round(ci.median, 3))
    ci_text = ratio_stats.ci_line(ci, 0.02)
    assert f"{ci.lo:.3f}-{ci.hi:.3f}" in ci_text
    assert "ratio" not in ci_text
    assert "NOT within" in ci_text  # 0.97 is 3% below the median


def test_the_ci_line_says_why_there_is_no_interval() -> None:
    text = ratio_stats.ci_line(ratio_stats.median_ci([1.0, 1.0]), 0.02)
    assert "none yet (2 rounds" in text
    assert "at least 6" in text


# --- interleaved rounds -------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sides(calls: list[str], clock: FakeClock, harness_values: list[float], seconds: float = 1.0):
    def harness() -> dict[str, float]:
        calls.append("harness")
        clock.now += seconds
        return {"k": harness_values[sum(c == "harness" for c in calls) - 1]}

    def reference() -> dict[str, float]:
        calls.append("reference")
        clock.now += seconds
        return {"k": 1.0}

    return harness, reference


def test_rounds_alternate_which_side_goes_first() -> None:
    calls: list[str] = []
    clock = FakeClock()
    harness, reference = _sides(calls, clock, [1.0] * 10)
    rule = rounds.StopRule(min_rounds=4, max_rounds=4)
    result = rounds.run_interleaved(harness, reference, rule, clock=clock)
    assert calls == ["harness", "reference", "reference", "harness"] * 2
    assert [r.harness_first for r in result.rounds] == [True, False, True, False]


def test_a_steady_ratio_stops_as_soon_as_an_interval_exists() -> None:
    calls: list[str] = []
    clock = FakeClock()
    harness, reference = _sides(calls, clock, [1.1] * 50)
    result = rounds.run_interleaved(harness, reference, rounds.StopRule(min_rounds=6), clock=clock)
    assert len(result.rounds) == 6
    assert result.stopped.startswith("converged")
    assert result.cis["k"].median == pytest.approx(1.1)


def test_a_noisy_ratio_runs_to_the_round_limit() -> None:
    calls: list[str] = []
    clock = FakeClock()
    noisy = [1.0 + (0.2 if i % 2 else -0.2) for i in range(50)]
    harness, reference = _sides(calls, clock, noisy)
    rule = rounds.StopRule(min_rounds=6, max_rounds=9, max_seconds=1e6)
    result = rounds.run_interleaved(harness, reference, rule, clock=clock)
    assert len(result.rounds) == 9
    assert result.stopped.startswith("round limit")
    assert not result.cis["k"].within(0.02)


def test_the_time_budget_stops_before_a_round_that_would_overrun_it() -> None:
    calls: list[str] = []
    clock = FakeClock()
    noisy = [1.0 + (0.2 if i % 2 else -0.2) for i in range(50)]
    harness, reference = _sides(calls, clock, noisy, seconds=10.0)  # 20 s per round
    rule = rounds.StopRule(min_rounds=2, max_rounds=50, max_seconds=100.0)
    result = rounds.run_interleaved(harness, reference, rule, clock=clock)
    assert len(result.rounds) == 5  # after 4 rounds (80 s) one more fits; after 5 (100 s) none
    assert result.stopped.startswith("time budget")


def test_the_time_budget_never_cuts_below_min_rounds() -> None:
    calls: list[str] = []
    clock = FakeClock()
    noisy = [1.0 + (0.2 if i % 2 else -0.2) for i in range(50)]
    harness, reference = _sides(calls, clock, noisy, seconds=10.0)
    rule = rounds.StopRule(min_rounds=6, max_rounds=50, max_seconds=5.0)
    result = rounds.run_interleaved(harness, reference, rule, clock=clock)
    assert len(result.rounds) == 6


def test_warmup_rounds_run_both_sides_unrecorded_and_count_against_the_budget() -> None:
    calls: list[str] = []
    clock = FakeClock()
    # the warm-up round reads 2.0: were it recorded, the median of 6 would not be 1.1
    harness, reference = _sides(calls, clock, [2.0] + [1.1] * 50, seconds=10.0)
    rule = rounds.StopRule(min_rounds=6, max_rounds=50, max_seconds=1e6)
    result = rounds.run_interleaved(harness, reference, rule, clock=clock, warmup_rounds=1)
    assert calls[:2] == ["harness", "reference"]
    assert len(result.rounds) == 6 and result.rounds[0].index == 0
    assert [r.harness["k"] for r in result.rounds] == [1.1] * 6
    assert result.elapsed_s == pytest.approx(7 * 20.0)
    with pytest.raises(ValueError, match="warmup_rounds must be 0 or more"):
        rounds.run_interleaved(harness, reference, rule, clock=clock, warmup_rounds=-1)


def test_drop_converged_stops_measuring_a_settled_key_and_spends_the_rounds_on_the_noisy_one() -> None:
    asked: list[tuple[str, ...] | None] = []
    noisy = iter([1.0 + (0.2 if i % 2 else -0.2) for i in range(100)])

    def side(is_harness: bool):
        def run(pending: tuple[str, ...] | None) -> dict[str, float]:
            asked.append(pending)
            keys = pending if pending is not None else ("steady", "noisy")
            values = {"steady": 1.0, "noisy": next(noisy) if is_harness else 1.0}
            return {k: values[k] for k in keys}

        return run

    rule = rounds.StopRule(min_rounds=6, max_rounds=10, max_seconds=1e6)
    result = rounds.run_interleaved(
        side(True), side(False), rule, clock=FakeClock(), warmup_rounds=1, drop_converged=True
    )
    # the warm-up and the first round's first side: every key; its second side: what the first measured
    assert asked[:4] == [None, None, None, ("steady", "noisy")]
    assert asked[2 + 2 * 6 :] == [("noisy",)] * (2 * 4)  # settled after 6 rounds, never asked again
    assert result.cis["steady"].n == 6 and result.cis["noisy"].n == 10
    assert len(result.values("steady", "harness")) == 6
    assert result.stopped.startswith("round limit")


def test_a_side_that_changes_its_keys_is_an_error() -> None:
    # round 1: harness, reference; round 2: the reference first, then the harness's new key
    answers = iter([{"a": 1.0}, {"a": 1.0}, {"a": 1.0}, {"b": 1.0}])
    with pytest.raises(ValueError, match=r"round 2: the harness side measured \['b'\]"):
        rounds.run_interleaved(
            lambda: next(answers), lambda: next(answers), rounds.StopRule(), clock=FakeClock()
        )


@pytest.mark.parametrize(
    "kwargs", [{"tolerance": 0}, {"min_rounds": 0}, {"min_rounds": 8, "max_rounds": 6}, {"max_seconds": 0}]
)
def test_stop_rule_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        rounds.StopRule(**kwargs)


def test_the_report_gives_medians_a_ratio_line_and_a_ci_line_per_key() -> None:
    calls: list[str] = []
    clock = FakeClock()
    harness, reference = _sides(calls, clock, [1.2] * 10)
    result = rounds.run_interleaved(harness, reference, rounds.StopRule(), clock=clock)
    lines = rounds.report_lines(result, lambda key: f"metric {key}", "s", "harness", "reference")
    ratio_lines = [line for line in lines if "ratio" in line]
    assert len(ratio_lines) == 1
    assert _last_number(ratio_lines[0]) == pytest.approx(1.2)
    assert any(line.strip().startswith("95% CI 1.200-1.200") for line in lines)


@pytest.mark.parametrize(
    ("script", "limits"),
    [("launch_overhead", (60, 170.0)), ("sft_overhead", (30, 175.0)), ("busbw_fidelity", (40, 170.0))],
)
def test_each_benchmark_takes_its_stop_rule_from_the_shared_options(
    script: str, limits: tuple[int, float]
) -> None:
    module = importlib.import_module(script)
    default = rounds.StopRule.from_args(module.parse_args([]))
    assert default == rounds.StopRule(0.02, 0.95, 6, *limits)
    asked = module.parse_args(
        ["--tolerance", "0.05", "--min-rounds", "8", "--max-rounds", "9", "--max-seconds", "60"]
    )
    assert rounds.StopRule.from_args(asked) == rounds.StopRule(0.05, 0.95, 8, 9, 60.0)


def test_a_progress_line_names_the_first_side_and_the_widest_interval() -> None:
    record = rounds.RoundRecord(6, True, {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, 12.4)
    narrow = ratio_stats.median_ci([1.0, 1.0, 1.01, 0.99, 1.0, 1.0])
    wide = ratio_stats.median_ci([1.0, 1.2, 0.9, 1.0, 1.1, 1.0])
    line = rounds.progress_line(record, {"a": narrow, "b": wide}, "per-key ratios 1.000 1.000")
    assert line == "round 7 (harness first, 12 s): per-key ratios 1.000 1.000; widest CI +-20.0%"
    early = ratio_stats.median_ci([1.0, 1.1])
    assert rounds.progress_line(record, {"a": early}, "x").endswith("(harness first, 12 s): x; no CI yet")
    assert rounds.progress_line(record, {"a": narrow}, "x").endswith("; CI +-1.0%")


def test_a_one_key_benchmark_prints_both_sides_and_the_rounds_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = rounds.RoundRecord(1, False, {"step time": 0.5}, {"step time": 0.4}, 3.0)
    rounds.print_one_key("step time", "cluster.run", "torchrun", digits=3)(
        record, {"step time": ratio_stats.median_ci([1.25])}
    )
    assert capsys.readouterr().out == (
        "round 2 (reference first, 3 s): cluster.run 0.500 s, torchrun 0.400 s, this round 1.250; no CI yet\n"
    )


# --- the references -----------------------------------------------------------------------------


REFERENCES = sorted((BENCHMARKS / "reference").glob("*.py"))


def test_there_is_a_reference_for_each_benchmark() -> None:
    assert {p.name for p in REFERENCES} >= {"busbw_bench.py", "sft_plain.py", "noop_job.py"}


@pytest.mark.parametrize("script", REFERENCES, ids=lambda p: p.name)
def test_a_reference_imports_nothing_from_the_package(script: Path) -> None:
    tree = ast.parse(script.read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "pytest_gpucluster"]


@pytest.mark.parametrize("script", REFERENCES, ids=lambda p: p.name)
def test_a_reference_ends_like_the_worker_flushing_then_os_exit(script: Path) -> None:
    """The worker ends with destroy_process_group, flush, os._exit; so must every reference."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    calls = [ast.unparse(n.func) for n in ast.walk(main) if isinstance(n, ast.Call)]
    assert "os._exit" in calls
    assert "dist.destroy_process_group" in calls
    assert "sys.stdout.flush" in calls
    assert (
        calls.index("dist.destroy_process_group") < calls.index("sys.stdout.flush") < calls.index("os._exit")
    )


# --- busbw_fidelity's pure parts ---------------------------------------------------------------


@pytest.fixture(scope="module")
def busbw() -> object:
    return importlib.import_module("busbw_fidelity")


def test_sizes_must_form_one_geometric_series(busbw: object) -> None:
    assert busbw.size_grid("4M,16M,64M") == ([4 << 20, 16 << 20, 64 << 20], 4)
    assert busbw.size_grid("64M,4M,16M") == ([4 << 20, 16 << 20, 64 << 20], 4)
    with pytest.raises(SystemExit, match="one integer factor"):
        busbw.size_grid("4M,16M,48M")


def test_without_gpus_the_nccl_tests_mode_says_what_it_needs(busbw: object, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the message under test is for machines without it")
    message = busbw.nccl_tests_binaries(tmp_path, ["all_reduce"])
    assert isinstance(message, str)
    assert message.startswith("busbw_fidelity --nccl-tests needs CUDA and nccl-tests binaries")


@pytest.fixture
def recorded_nccl_tests(busbw: object, tmp_path: Path) -> object:
    """The nccl-tests reference over a stand-in binary that prints a recorded table (SuperBench, 8 x A100)."""
    log = NCCL_TESTS_DATA / "superbench_a100x8_all_reduce_error_column.log"
    binary = tmp_path / "all_reduce_perf"
    binary.write_text(f"#!/bin/sh\ncat '{log}'\n")
    binary.chmod(0o755)
    args = SimpleNamespace(nproc=8, warmup=5, iters=20)
    return busbw.NcclTestsReference(args, {"all_reduce": binary}, [4 << 20, 8 << 20], 2, tmp_path)


def test_the_nccl_tests_reference_reads_the_out_of_place_busbw(recorded_nccl_tests: object) -> None:
    got = recorded_nccl_tests()
    assert got["all_reduce 4 MiB"] == 65.52  # the out-of-place column; in-place says 66.60
    assert got["all_reduce 8 MiB"] == 90.63


def test_the_harness_sweeps_the_grid_until_points_settle_then_only_the_pending_ones(busbw: object) -> None:
    sizes = [4 << 20, 16 << 20, 64 << 20]
    grid = busbw.sweep_requests(["all_reduce", "all_gather"], sizes, 4, None)
    assert [(r.collective, r.min_bytes, r.max_bytes) for r in grid] == [
        ("all_reduce", 4 << 20, 64 << 20),
        ("all_gather", 4 << 20, 64 << 20),
    ]
    pending = ("all_reduce 4 MiB", "all_reduce 16 MiB", "all_reduce 64 MiB", "all_gather 16 MiB")
    later = busbw.sweep_requests(["all_reduce", "all_gather"], sizes, 4, pending)
    assert [(r.collective, r.min_bytes, r.max_bytes) for r in later] == [
        ("all_reduce", 4 << 20, 64 << 20),
        ("all_gather", 16 << 20, 16 << 20),
    ]


def test_the_nccl_tests_reference_returns_only_the_pending_points(recorded_nccl_tests: object) -> None:
    reference = recorded_nccl_tests
    assert reference(("all_reduce 8 MiB",)) == {"all_reduce 8 MiB": 90.63}
    assert reference(("all_gather 8 MiB",)) == {}  # no binary of that collective is run


def test_the_seed_reference_takes_its_points_in_order_or_as_a_grid() -> None:
    bench = importlib.import_module("reference.busbw_bench")
    args = bench.parse_args(["--points", "all_gather:2048,all_reduce:1024", "--out", "x.json"])
    assert args.point_list == [("all_gather", 2048), ("all_reduce", 1024)]
    args = bench.parse_args(["--collectives", "all_reduce", "--sizes", "1024,4096", "--out", "x.json"])
    assert args.point_list == [("all_reduce", 1024), ("all_reduce", 4096)]
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x.json"])  # neither --sizes nor --points
    with pytest.raises(SystemExit):
        bench.parse_args(["--points", "all_to_all:1024", "--out", "x.json"])  # not covered


# --- agreement between runs ---------------------------------------------------------------------

agreement = importlib.import_module("agreement")


def _printed(cis: dict[str, object]) -> str:
    """What a benchmark prints for these intervals (through the printer, not by hand)."""
    lines = ["some header", "round 1 (harness first): 1.000"]
    for label, ci in cis.items():
        lines += [f"{label}: harness 1 s, reference 1 s (medians)", ratio_stats.ratio_line(label, ci)]
        lines.append(ratio_stats.ci_line(ci, 0.02))
    return "\n".join(lines)


def _ci(median: float, lo: float, hi: float) -> object:
    return ratio_stats.MedianCI(median, lo, hi, 12, 0.95, 0.96)


def test_agreement_reads_what_the_printer_writes() -> None:
    text = _printed({"all_reduce 4 MiB busbw harness/ref": _ci(0.991, 0.975, 1.004)})
    [reading] = agreement.read_ratios(text).values()
    assert reading.label == "all_reduce 4 MiB busbw harness/ref"
    assert (reading.ratio, reading.lo, reading.hi, reading.rounds) == (0.991, 0.975, 1.004, 12)


def test_three_overlapping_close_runs_agree() -> None:
    runs = [agreement.read_ratios(_printed({"x": _ci(m, m - 0.02, m + 0.02)})) for m in (0.99, 1.0, 1.01)]
    [line] = agreement.agreement(runs)
    assert line.endswith("ok")


def test_disjoint_intervals_or_far_medians_disagree() -> None:
    disjoint = [
        agreement.read_ratios(_printed({"x": _ci(m, m - 0.005, m + 0.005)})) for m in (0.99, 1.0, 1.01)
    ]
    assert "do not all overlap" in agreement.agreement(disjoint)[0]
    far = [agreement.read_ratios(_printed({"x": _ci(m, 0.8, 1.2)})) for m in (0.94, 1.0, 1.06)]
    assert "not within +-3%" in agreement.agreement(far)[0]


def test_a_ratio_missing_from_a_run_or_without_interval_disagrees() -> None:
    whole = agreement.read_ratios(_printed({"x": _ci(1.0, 0.99, 1.01), "y": _ci(1.0, 0.99, 1.01)}))
    partial = agreement.read_ratios(_printed({"x": _ci(1.0, 0.99, 1.01)}))
    lines = agreement.agreement([whole, partial])
    assert lines[0].endswith("ok")
    assert "missing from run(s) [2]" in lines[1]
    none_yet = agreement.read_ratios(_printed({"x": ratio_stats.median_ci([1.0, 1.0])}))
    assert "no interval" in agreement.agreement([whole, none_yet])[0]


def test_a_ratio_line_without_its_ci_line_is_named() -> None:
    line = ratio_stats.ratio_line("x", _ci(1.0, 0.99, 1.01))
    with pytest.raises(ValueError, match=r"run1\.txt, line 3: expected the CI line"):
        agreement.read_ratios(f"header\n{line}\nsomething else", "run1.txt")
