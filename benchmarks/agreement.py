"""Do several runs of one benchmark agree? Reads their saved outputs and says, per ratio.

Issue 21's test of a benchmark worth believing: three consecutive runs print, for every
ratio, intervals that overlap and medians within +-3% of each other. Save each run's output and
give the files here::

    for i in 1 2 3; do python benchmarks/busbw_fidelity.py | tee run$i.txt; done
    python benchmarks/agreement.py run1.txt run2.txt run3.txt

It reads the pairs of lines ``ratio_stats`` prints (the line ending in ``ratio X``, then
``  95% CI lo-hi ...``), matches ratios across runs by their label, and exits 1 when any label
disagrees or is missing from a run. Pure standard library.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RatioReading", "agreement", "read_ratios"]

_RATIO = re.compile(
    r"^(?P<label>.*?)\s*\(median of (?P<n>\d+) paired rounds;.*\bratio (?P<ratio>[-+0-9.eE]+)\s*$"
)
_CI = re.compile(r"^\s+\d+(?:\.\d+)?% CI (?P<lo>[-+0-9.eE]+)-(?P<hi>[0-9.eE+]+) ")


@dataclass(frozen=True, slots=True)
class RatioReading:
    label: str
    ratio: float
    lo: float | None
    hi: float | None
    rounds: int


def read_ratios(text: str, source: str = "the output") -> dict[str, RatioReading]:
    """Every ratio line and the CI line under it; ValueError names the line it cannot read."""
    lines = text.splitlines()
    out: dict[str, RatioReading] = {}
    for number, line in enumerate(lines, 1):
        match = _RATIO.match(line)
        if not match:
            continue
        following = lines[number] if number < len(lines) else ""
        ci = _CI.match(following)
        if ci is None and "CI: none yet" not in following:
            raise ValueError(
                f"{source}, line {number + 1}: expected the CI line under the ratio, got {following!r}"
            )
        out[match["label"]] = RatioReading(
            match["label"],
            float(match["ratio"]),
            float(ci["lo"]) if ci else None,
            float(ci["hi"]) if ci else None,
            int(match["n"]),
        )
    return out


def agreement(runs: Sequence[dict[str, RatioReading]], spread: float = 0.03) -> list[str]:
    """One line per label: ``ok`` or what disagrees (a missing run, no interval, intervals that
    do not overlap, medians further apart than ``spread`` of their mean)."""
    labels = list(dict.fromkeys(label for run in runs for label in run))
    report = []
    for label in labels:
        readings = [run.get(label) for run in runs]
        problems = []
        if any(r is None for r in readings):
            problems.append(f"missing from run(s) {[i + 1 for i, r in enumerate(readings) if r is None]}")
        present = [r for r in readings if r is not None]
        if any(r.lo is None or r.hi is None for r in present):
            problems.append("a run has no interval")
        elif present and max(r.lo for r in present) > min(r.hi for r in present):  # type: ignore[type-var]
            problems.append("the intervals do not all overlap")
        medians = [r.ratio for r in present]
        centre = sum(medians) / len(medians) if medians else 0.0
        if medians and (max(medians) - centre > spread * centre or centre - min(medians) > spread * centre):
            problems.append(f"medians {', '.join(f'{m:.3f}' for m in medians)} are not within +-{spread:.0%}")
        status = "ok" if not problems else "DISAGREE: " + "; ".join(problems)
        shown = " | ".join(
            f"{r.ratio:.3f} ({r.lo:.3f}-{r.hi:.3f}, {r.rounds})" if r and r.lo is not None else "-"
            for r in readings
        )
        report.append(f"{label}: {shown}  {status}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="saved outputs of runs of one benchmark")
    parser.add_argument("--spread", type=float, default=0.03, help="medians within +- this fraction")
    args = parser.parse_args(argv)
    try:
        runs = [read_ratios(p.read_text(encoding="utf-8"), str(p)) for p in args.outputs]
    except (OSError, ValueError) as exc:
        print(f"cannot read the runs: {exc}", file=sys.stderr)
        return 2
    if not any(runs):
        print("no ratio lines in these files: are they outputs of benchmarks/*.py?", file=sys.stderr)
        return 2
    lines = agreement(runs, args.spread)
    print("\n".join(lines))
    return 0 if all(line.endswith("ok") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
