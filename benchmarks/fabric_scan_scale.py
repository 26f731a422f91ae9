"""How ``gpucluster fabric scan`` scales: generated rail-optimized fabrics of 8, 64 and 256 nodes x 8
rails under ibsim, each scanned with the real infiniband-diags (issue 37's goal: a 256-node fabric
inside a minute on this machine, and time linear in cables).

Each size gets its own simulator; the scan (ibnetdiscover, iblinkinfo, ibqueryerrors, sminfo, then
the judges) is timed ``--repeats`` times and the median is kept. Prints each scan's time, its time
per cable, the tools' shares, and the 256:8 ratios of time and of cables::

    flock /tmp/heavy.lock python benchmarks/fabric_scan_scale.py

Needs ibsim-utils, infiniband-diags and opensm (``.ci/install-system-deps``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pytest_gpucluster.fabric_scan import ScanSettings, judge, scan
from pytest_gpucluster.testbed.ib_topology import TopologySpec, generate
from pytest_gpucluster.testbed.ibsim import IbSim, missing_tools


def measure(nodes: int, rails: int, repeats: int) -> tuple[float, int, dict[str, float], int]:
    """(median scan seconds, cables, median seconds per tool, findings) for one generated fabric."""
    spec = TopologySpec(nodes=nodes, rails=rails, nodes_per_leaf=32, spines=8)
    with (
        tempfile.TemporaryDirectory(prefix="fabric-scale-") as tmp,
        IbSim(generate(spec).text(), Path(tmp)) as sim,
    ):
        totals: list[float] = []
        tools: dict[str, list[float]] = {}
        findings = 0
        for _ in range(repeats):
            start = time.monotonic()
            model, outputs = scan(sim.prefix, timeout=600)
            found = judge(model, ScanSettings(rails=rails, rail_optimized=True))
            totals.append(time.monotonic() - start)
            for name, seconds in outputs.seconds.items():
                tools.setdefault(name, []).append(seconds)
            findings = len(found)
        return (
            statistics.median(totals),
            len(model.links),
            {k: statistics.median(v) for k, v in tools.items()},
            findings,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256", help="node counts (default 8,64,256)")
    parser.add_argument("--rails", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if missing := missing_tools():
        print(f"cannot run: not installed: {', '.join(missing)}", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    for n in sizes:
        seconds, cables, tools, findings = measure(n, args.rails, args.repeats)
        results[n] = (seconds, cables)
        shares = ", ".join(f"{k} {v:.2f} s" for k, v in tools.items())
        print(f"{n:4d} nodes x {args.rails} rails: {cables:5d} cables, scan {seconds:6.2f} s "
              f"({1e3 * seconds / cables:.2f} ms per cable; {shares}; {findings} findings)")  # fmt: skip
    small, big = min(sizes), max(sizes)
    (t0, c0), (t1, c1) = results[small], results[big]
    print(f"cables {big}:{small} ratio {c1 / c0:.1f}")
    print(f"scan time {big}:{small} ratio {t1 / t0:.1f}")
    print(f"time per cable {big}:{small} ratio {(t1 / c1) / (t0 / c0):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
