"""How sensitive the cpu-local profile is: healthy ranges, the slowdown each gate fails at, and a real 3x slowdown.

Runs ``pytest acceptance/`` (the CPU default) ``--healthy-runs`` times back to back, then once more
with a real slowdown: every rank in a cgroup whose CPU quota is ``ranks / --slowdown`` CPUs
(`pytest_gpucluster.testbed.cpu_quota`; 2 ranks sharing 0.67 CPU run CPU-bound work 3x slower).
For every gated speed measurement (a threshold from the profile, a unit that is a time, a rate or a
ratio of those) it prints one row:

    metric | healthy min-median-max | threshold | fails at (healthy median / threshold) | slowed value, factor, verdict

"fails at" is the slowdown of the healthy median that crosses the threshold: the profile states it
beside each number, and it must be at most the target slowdown (3 by default) for the gate to catch
a machine that much slower. The slowed run shows it for real; its measured factor is printed beside
the verdict because a CPU quota slows CPU-bound work by the quota and other work (kernel copies,
wake-ups) by whatever it does to them.

    python benchmarks/threshold_sensitivity.py [--healthy-runs 3] [--slowdown 3] [-- pytest args]
    python benchmarks/threshold_sensitivity.py --from-dir DIR   # runs kept by gate_noise.py --keep DIR

With ``--from-dir`` nothing is run: the healthy runs are ``DIR/run*/results.json`` and the slowed
one ``DIR/slowed/results.json`` (the layout `benchmarks/gate_noise.py --keep` leaves, whose slowed
run is the same CPU quota); only first measurements count (a regression gate's confirmation is a
second look, not another run).

Needs root for the cgroup (without it the healthy rows are still printed and the slowed run is
skipped, saying why). The last lines hold the word ``ratio``: the share of gated speed metrics whose
healthy median x slowdown would still pass (target 0), and the share that passed the real slowed run
(target 0).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_gpucluster.results.baseline import read_results  # noqa: E402
from pytest_gpucluster.results.model import Measurement  # noqa: E402

NOT_SPEED_UNITS = frozenset(
    {"B", "KiB", "MiB", "GiB", "bytes", "count", "errors", "", "C", "W", "nodes", "ranks", "GPUs", "bool"}
)
RATIO_UNITS = frozenset({"x", "fraction", "%"})
"""A speedup or an efficiency divides two timings of the same machine: a uniform slowdown leaves
it where it was, by design. Its "fails at" is the slowdown of the fast side alone (the shm path,
the 2-rank run); the slowed run is shown for it but not counted."""


@dataclass(frozen=True)
class Row:
    key: str
    comparison: str
    threshold: float
    unit: str
    healthy: tuple[float, ...]
    slowed: float | None

    @property
    def median(self) -> float:
        return statistics.median(self.healthy)

    @property
    def fails_at(self) -> float:
        """The slowdown of the healthy median at which the value reaches the threshold."""
        if self.comparison == ">=":
            return self.median / self.threshold
        return self.threshold / self.median

    @property
    def slowed_factor(self) -> float | None:
        if self.slowed is None or self.slowed <= 0:
            return None
        return self.median / self.slowed if self.comparison == ">=" else self.slowed / self.median

    @property
    def slowed_passes(self) -> bool | None:
        if self.slowed is None:
            return None
        ok = self.slowed >= self.threshold if self.comparison == ">=" else self.slowed <= self.threshold
        return ok


def gated_speed(measurements: tuple[Measurement, ...]) -> dict[str, Measurement]:
    return {
        m.key: m
        for m in measurements
        if m.threshold is not None
        and m.comparison in (">=", "<=")
        and m.ref is not None
        and m.measured
        and m.unit not in NOT_SPEED_UNITS
        and m.attempt == 1
    }


def run_suite(results_dir: Path, pytest_args: list[str], cpus: float | None) -> Path:
    argv = [sys.executable, "-m", "pytest", "acceptance/", "-q", "-p", "no:cacheprovider"]
    argv += [f"--results-dir={results_dir}", *pytest_args]
    if cpus is not None:
        argv = [
            sys.executable,
            "-m",
            "pytest_gpucluster.testbed.cpu_quota",
            "--cpus",
            f"{cpus:.3f}",
            "--",
            *argv,
        ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
    label = "slowed" if cpus is not None else "healthy"
    print(f"# {label} run -> {results_dir}: exit {done.returncode}: {tail[0]}", flush=True)
    return results_dir / "results.json"


def quota_unavailable() -> str | None:
    from pytest_gpucluster.testbed.cpu_quota import unavailable_reason

    return unavailable_reason()


Gated = dict[str, Measurement]


def run_all(args: argparse.Namespace) -> tuple[list[Gated], Gated]:
    with tempfile.TemporaryDirectory(prefix="gpucluster-sensitivity-") as tmp:
        healthy = [
            gated_speed(
                read_results(run_suite(Path(tmp) / f"healthy-{i}", args.pytest_args, None)).measurements
            )
            for i in range(args.healthy_runs)
        ]
        why_not = quota_unavailable()
        if why_not:
            print(f"# slowed run skipped: {why_not}")
            return healthy, {}
        path = run_suite(Path(tmp) / "slowed", args.pytest_args, args.ranks / args.slowdown)
        return healthy, gated_speed(read_results(path).measurements)


def read_kept(directory: Path) -> tuple[list[Gated], Gated]:
    runs = sorted(directory.glob("run*/results.json"), key=lambda p: int(p.parent.name[3:] or 0))
    if not runs:
        raise SystemExit(f"{directory}: no run*/results.json (expected gate_noise.py --keep's layout)")
    healthy = [gated_speed(read_results(path).measurements) for path in runs]
    slowed_file = directory / "slowed" / "results.json"
    slowed = gated_speed(read_results(slowed_file).measurements) if slowed_file.is_file() else {}
    print(f"# read {len(runs)} healthy run(s){' and the slowed run' if slowed else ''} from {directory}")
    return healthy, slowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy-runs", type=int, default=3)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--ranks", type=int, default=2, help="ranks sharing the quota (cpu-local: 2)")
    parser.add_argument(
        "--from-dir",
        type=Path,
        action="append",
        help="read runs kept by gate_noise.py --keep DIR (repeatable)",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args(argv)
    if args.from_dir is not None:
        healthy, slowed = [], {}
        for directory in args.from_dir:  # healthy runs pooled; the last slowed run read wins
            more, slowed_here = read_kept(directory)
            healthy += more
            slowed = slowed_here or slowed
    else:
        healthy, slowed = run_all(args)
    keys = sorted(set().union(*healthy)) if healthy else []
    rows = []
    for key in keys:
        values = tuple(run[key].value for run in healthy if key in run)
        latest = next(run[key] for run in reversed(healthy) if key in run)  # the profile as it is now
        rows.append(
            Row(
                key,
                latest.comparison,
                float(latest.threshold or 0),
                latest.unit,
                values,
                slowed[key].value if key in slowed else None,
            )
        )
    print(f"{'metric':<70} {'healthy min/median/max':>28} {'threshold':>12} {'fails at':>9}  slowed run")
    for row in rows:
        healthy_text = f"{min(row.healthy):.4g}/{row.median:.4g}/{max(row.healthy):.4g}"
        if row.slowed is None:
            slowed_text = "(not measured)"
        else:
            verdict = "PASS" if row.slowed_passes else "fail"
            factor = row.slowed_factor
            how_slow = "(no rate)" if factor is None else f"({factor:.2f}x slower)"
            slowed_text = f"{row.slowed:.4g} {how_slow} {verdict}"
        print(
            f"{row.key[:70]:<70} {healthy_text:>28} {row.comparison}{row.threshold:>10.4g} "
            f"{row.fails_at:>8.2f}x  {slowed_text}  [{row.unit}, {len(row.healthy)} runs]"
        )
    if not rows:
        print("no gated speed measurement was recorded", file=sys.stderr)
        return 1
    would_pass = sum(row.fails_at > args.slowdown for row in rows)
    print(
        f"gated speed metrics whose healthy median x{args.slowdown:g} still passes ratio {would_pass / len(rows):.3f}"
    )
    measured = [row for row in rows if row.slowed is not None and row.unit not in RATIO_UNITS]
    if measured:
        passed = sum(bool(row.slowed_passes) for row in measured)
        print(
            f"gated speed metrics (ratios aside) passing the real x{args.slowdown:g} slowed run ratio {passed / len(measured):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
