"""``gpucluster fabric localize RESULTS.json --fabric SCAN/fabric.json``: the pairwise burn-in's
pairs joined with a fabric scan, so slow pairs that all cross one leaf's uplinks, one leaf, one rail
or the only spine between their leaves are reported as that element (``checks/ib_localize.py``).

A pair is slow when its first-round busbw (``burnin.pair_busbw``, round 1) is below ``1 - tolerance``
of the round's median. Exit 0 when nothing is slow or no element explains the slow pairs, 1 when an
element (or one host) does, 2 when an input cannot be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from pytest_gpucluster.checks.ib_localize import PairOutcome, localize_on_fabric
from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.parsers.ib_fabric import FabricModel
from pytest_gpucluster.results.baseline import read_results

__all__ = ["add_localize_command", "pair_outcomes"]


def pair_outcomes(results: Any, tolerance: float) -> list[PairOutcome]:
    """Round 1's pairs of a run (`RunResults`), slow when below (1 - tolerance) x the round's median."""
    pairs: list[tuple[str, str, float]] = []
    for m in results.measurements:
        if m.metric != "burnin.pair_busbw" or m.labels.get("round", 1) != 1:
            continue
        a, _, b = str(m.labels.get("pair", "")).partition("<->")
        if a and b:
            pairs.append((a, b, m.value))
    if not pairs:
        return []
    median = statistics.median(v for _, _, v in pairs)
    return [PairOutcome(a, b, None, v < (1 - tolerance) * median) for a, b, v in pairs]


def cmd_localize(args: argparse.Namespace) -> int:
    try:
        results = read_results(Path(args.results))
        model = FabricModel.from_json(json.loads(Path(args.fabric).read_text())["model"], args.fabric)
    except (OSError, ValueError, KeyError, GpuClusterError) as exc:
        print(f"fabric localize: cannot read the inputs: {exc}")
        return 2
    outcomes = pair_outcomes(results, args.tolerance)
    slow = sum(p.slow for p in outcomes)
    print(
        f"fabric localize: {len(outcomes)} pair(s) in round 1, {slow} slow (below {1 - args.tolerance:.0%} of the median)"
    )
    verdict = localize_on_fabric(model, outcomes)
    if verdict is None:
        print("  no single element (leaf uplinks, leaf, rail, spine or host) explains the slow pairs")
        return 0
    print(f"  {verdict.line()}")
    return 1


def add_localize_command(fabric_actions: Any) -> None:
    p = fabric_actions.add_parser(
        "localize",
        help="join a run's pairwise burn-in with a fabric scan: the leaf uplinks, leaf, rail or spine all slow pairs "
        "cross; exit 1 when one explains them",
    )
    p.add_argument("results", metavar="RESULTS.json", help="a burn-in run's results.json (burnin.pair_busbw)")
    p.add_argument(
        "--fabric", required=True, metavar="SCAN/fabric.json", help="a gpucluster fabric scan's output"
    )
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="a pair is slow below (1 - TOLERANCE) x the median pair (default 0.1)")  # fmt: skip
    p.set_defaults(func=cmd_localize)
