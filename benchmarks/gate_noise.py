"""Does the regression gate cry wolf, and does it miss a real drop? The default suite, for real.

Runs ``pytest acceptance/`` (cpu-local unless pytest arguments after ``--`` say otherwise) ``--runs``
times back to back: the first is the baseline, every later one runs with ``--baseline`` of it, as
a user gates after an upgrade. Then one more run, also against the first, with a real slowdown:
its ranks share a CPU quota (``testbed/cpu_quota.py``; ``--quota-cpus`` CPUs for the 2 ranks,
0.67 by default: each rank at a third of a core, a 3x slowdown of the 2-rank jobs).

A run is *flagged* when the gate's comparison stored in its results.json (the same judgement that
failed its tests) holds a regression. Printed, each on its own line ending with the ratio:

    false regression ratio (runs flagged / healthy comparisons) ...  target 0
    missed regression ratio (slowed runs not flagged / slowed runs) ...  target 0

Before them, per run: the load average before and after, the regressions named, and threshold
failures (a different gate, issue 18's). After them, per gated metric: the worst distance past the
baseline's noise that healthy runs reached (first measurements, before any confirmation) and the
least the slowed run reached — a tolerance between the two separates them. Timings need a quiet
machine; the load averages say how quiet it was.

With ``--fleet K`` the baseline is the fleet of the first K runs (``gpucluster baseline merge``),
and the runs after them are gated against it (K=1: the first run alone, the default).

With ``--history N`` every run appends to one history store (``--gpucluster-history``), and each
run after the first N is gated with ``--baseline history:N``: per value the median of the last N
healthy runs before it, as a user who keeps a history gates every run (a rolling baseline). The
per-metric margins are taken against the baseline each run was gated with.

    python benchmarks/gate_noise.py [--runs 5] [--fleet 1 | --history N] [--quota-cpus 0.67] [--keep DIR] [-- pytest arguments]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_gpucluster.results.baseline import (  # noqa: E402
    BaselineComparison,
    RunResults,
    compare_runs,
    read_results,
    settings_of,
)
from pytest_gpucluster.results.fleet import merge_runs, write_fleet  # noqa: E402


@dataclass(frozen=True)
class Run:
    name: str
    results: RunResults
    exit_code: int
    load: tuple[float, float]
    slowed: bool = False

    @property
    def comparison(self) -> BaselineComparison | None:
        stored = self.results.baseline
        return BaselineComparison.from_json(stored) if stored else None

    @property
    def flagged(self) -> bool:
        return bool(self.comparison and self.comparison.regressions)


def run_suite(
    name: str,
    out: Path,
    pytest_args: Sequence[str],
    baseline: Path | str | None,
    quota: float | None,
    history: Path | None = None,
) -> Run:
    results = out / name
    argv = [sys.executable, "-m", "pytest", "acceptance/", "-q", "-p", "no:cacheprovider"]
    argv += [f"--results-dir={results}", *pytest_args]
    if baseline is not None:
        argv.append(f"--baseline={baseline}")
    if history is not None:
        argv.append(f"--gpucluster-history={history}")
    if quota is not None:
        argv = [sys.executable, "-m", "pytest_gpucluster.testbed.cpu_quota", f"--cpus={quota}", "--", *argv]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER_", "PYTEST_"))
    }
    before = os.getloadavg()[0]
    with open(out / f"{name}.log", "w", encoding="utf-8") as log:
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    after = os.getloadavg()[0]
    if not (results / "results.json").is_file():
        raise SystemExit(
            f"{name}: pytest wrote no results.json (exit {done.returncode}); see {out / name}.log"
        )
    return Run(
        name, read_results(results / "results.json"), done.returncode, (before, after), quota is not None
    )


def describe(run: Run) -> str:
    comparison = run.comparison
    regs = [c.subject for c in comparison.regressions] if comparison else []
    thresholds = [
        o.test_id.split("::")[-1]
        for o in run.results.outcomes
        if o.category == "performance" and "RegressionFailure" not in o.message
    ]
    what = f"{len(regs)} regression(s)" + (f": {'; '.join(regs)}" if regs else "")
    extra = f"; threshold failures: {', '.join(thresholds)}" if thresholds else ""
    load = f"load average {run.load[0]:.2f} -> {run.load[1]:.2f}"
    return f"{run.name}{' (slowed)' if run.slowed else ''}: exit {run.exit_code}, {what}{extra}; {load}"


def first_tries(run: RunResults) -> RunResults:
    """The run as it was before any confirmation: its first measurement of every key."""
    return replace(run, measurements=tuple(m for m in run.measurements if m.attempt == 1))


def margins(baseline: RunResults, run: RunResults) -> dict[str, list[float]]:
    """Per gated metric, the distance past the baseline's noise of each of its values."""
    tolerances, _ = settings_of(run)
    out: dict[str, list[float]] = defaultdict(list)
    for change in compare_runs(baseline, first_tries(run), tolerances).changes:
        if change.status in ("regression", "ok", "improved", "not gateable") and change.margin is not None:
            out[change.metric].append(change.margin)
    return out


def calibration_lines(
    healthy: Sequence[tuple[RunResults, Run]], slowed: Sequence[tuple[RunResults, Run]]
) -> list[str]:
    """Per gated metric, the worst margin of the healthy runs and the least of the slowed ones,
    each against the baseline it was gated with."""
    noise: dict[str, list[float]] = defaultdict(list)
    drop: dict[str, list[float]] = defaultdict(list)
    for baseline, run in healthy:
        for metric, values in margins(baseline, run.results).items():
            noise[metric] += values
    for baseline, run in slowed:
        for metric, values in margins(baseline, run.results).items():
            drop[metric] += values
    tolerances, _ = settings_of((healthy or slowed)[0][1].results)

    def pct(value: float | None) -> str:
        return "-" if value is None else ("inf" if math.isinf(value) else f"{value * 100:+.0f}%")

    lines = ["past the baseline's noise, per gated metric (first measurements; + is the worse side):"]
    lines.append(f"  {'metric':44} {'healthy worst':>13} {'slowed least':>13} {'tolerance':>10}")
    for metric in sorted(set(noise) | set(drop)):
        worst = max(noise[metric]) if noise[metric] else None
        least = min(drop[metric]) if drop[metric] else None
        tol, _ = tolerances.lookup(metric)
        shown = "off" if tol is None else f"{tol * 100:g}%"
        lines.append(f"  {metric:44} {pct(worst):>13} {pct(least):>13} {shown:>10}")
    return lines


def history_baselines(db: Path, last: int, runs: Sequence[Run]) -> list[RunResults]:
    """The baseline each run was gated with: the store's history:N as it was before the run."""
    from pytest_gpucluster.results.history.baseline import history_baseline
    from pytest_gpucluster.results.history.store import HistoryStore

    out = []
    with HistoryStore.open(db, create=False) as store:
        stored = {r.started_at: r.id for r in store.runs()}
        for run in runs:
            before = stored[run.results.started_at]
            profile = run.results.profile.get("name")
            out.append(history_baseline(store, last, profile=profile, before=before).results)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        type=int,
        default=5,
        help="healthy runs, the first --fleet (or --history) of them the baseline",
    )
    parser.add_argument("--fleet", type=int, default=1, help="how many first runs make the baseline (merged)")
    parser.add_argument(
        "--history",
        type=int,
        default=None,
        metavar="N",
        help="every run appends to a history store; runs after the first N are gated with --baseline history:N",
    )
    parser.add_argument("--quota-cpus", type=float, default=2 / 3, help="CPUs the slowed run's ranks share")
    parser.add_argument("--no-slowdown", action="store_true", help="skip the slowed run")
    parser.add_argument("--keep", type=Path, help="keep every run's results and log in this directory")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (put them after --)")
    args = parser.parse_args(argv)
    first = args.history if args.history is not None else args.fleet
    if args.history is not None and args.fleet != 1:
        parser.error("--history and --fleet are two ways to make the baseline: give one")
    if not 1 <= first < args.runs:
        parser.error(
            "--runs must exceed --fleet/--history (>= 1): a baseline and at least one run against it"
        )
    out = args.keep or Path(tempfile.mkdtemp(prefix="gpucluster-gate-noise-"))
    out.mkdir(parents=True, exist_ok=True)
    db = (out / "history.db").resolve() if args.history is not None else None
    try:
        bases = []
        for index in range(1, first + 1):
            bases.append(run_suite(f"run{index}", out, args.pytest_args, None, None, db))
            print(describe(bases[-1]), flush=True)
        baseline_file: Path | str = out / "run1" / "results.json"
        if db is not None:
            baseline_file = f"history:{args.history}"
        elif args.fleet > 1:
            baseline_file = out / "fleet.json"
            write_fleet(merge_runs([b.results for b in bases]), baseline_file)
        healthy = []
        for index in range(first + 1, args.runs + 1):
            healthy.append(run_suite(f"run{index}", out, args.pytest_args, baseline_file, None, db))
            print(describe(healthy[-1]), flush=True)
        slowed = []
        if not args.no_slowdown:
            slowed.append(run_suite("slowed", out, args.pytest_args, baseline_file, args.quota_cpus, db))
            print(describe(slowed[-1]), flush=True)
        if db is not None:
            gated = history_baselines(db, args.history, [*healthy, *slowed])
        else:
            gated = [read_results(Path(baseline_file))] * (len(healthy) + len(slowed))
        pairs = list(zip(gated, [*healthy, *slowed], strict=True))
        for line in calibration_lines(pairs[: len(healthy)], pairs[len(healthy) :]):
            print(line)
        flagged = sum(r.flagged for r in healthy)
        print(
            f"false regression ratio ({flagged} flagged of {len(healthy)} healthy comparisons) {flagged / len(healthy):.3f}"
        )
        if slowed:
            missed = sum(not r.flagged for r in slowed)
            print(
                f"missed regression ratio ({missed} not flagged of {len(slowed)} slowed run(s), ranks on "
                f"{args.quota_cpus:.3g} CPUs) {missed / len(slowed):.3f}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
