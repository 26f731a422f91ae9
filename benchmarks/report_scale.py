"""How the report scales with the fleet: a real results.json fanned out to 1, 64 and 512 nodes x 8 GPUs.

The results of a real ``pytest acceptance/ --hw=cpu-local`` run (default: the one kept in
``tests/data/results/``; ``--results`` takes any other) are fanned out
(``pytest_gpucluster.testbed.fanout``: every per-host value on each node, every per-rank value on
each GPU, ±2% noise around the real run's median, one GPU's matmul at 60% and one port's error
counter at 37 planted), written as results.json, and the report is built from each file as
``gpucluster report`` does (read + findings + matrix + charts + report.md/html/summary.csv).

Rounds interleave the smallest and the largest scale (the order alternating every round), so a
shared machine's load drift cancels in each round's ratio; the verdict is the median paired ratio
with its order-statistic 95% interval (``ratio_stats.py``; an interval needs 6+ rounds).

    python benchmarks/report_scale.py [--rounds 6] [--scales 1 64 512] [--gpus 8] [--keep DIR]

Prints per scale: results.json size (and bytes per GPU: linear growth keeps it flat), report.html
and report.md sizes, the number of charts (it must not grow with the nodes), the median report
time, and whether the report's findings name the planted GPU and port with their actions; then a
line holding ``ratio`` that ends with the median paired report-time ratio largest/smallest scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratio_stats import ci_line, median_ci, paired_ratios, ratio_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_gpucluster.results.baseline import read_results  # noqa: E402
from pytest_gpucluster.results.report import write_reports  # noqa: E402
from pytest_gpucluster.testbed.chromium import CHROMIUM, headless_flags  # noqa: E402
from pytest_gpucluster.testbed.fanout import Planted, dumps, fan_out  # noqa: E402

DEFAULT_RESULTS = REPO / "tests" / "data" / "results" / "cpu_local_run.json"
LIMIT_BYTES = 50 * 2**20
CHROMIUM_FLAGS = headless_flags()


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MB"


def build(results: Path, out: Path) -> tuple[float, int]:
    """Seconds to build the report from ``results`` (as ``gpucluster report`` does), and its charts."""
    start = time.perf_counter()
    files = write_reports(read_results(results), out)
    return time.perf_counter() - start, len(files.plots)


def names_planted(report_md: str, planted: Planted) -> bool:
    gpu = f"{planted.slow_node}, GPU {planted.slow_gpu} | {planted.slow_metric}"
    port = f"{planted.port_node}, {planted.port} | {planted.port_metric}"
    lines = report_md.splitlines()
    return any(gpu in line and "| reset GPU |" in line for line in lines) and any(
        port in line and "| reseat/replace cable or NIC |" in line for line in lines
    )


def browser_seconds(page: Path) -> float | None:
    """Seconds for headless Chromium to load and lay out ``page`` (None: no chromium here)."""
    if not CHROMIUM.exists():
        return None
    with tempfile.TemporaryDirectory() as profile:
        argv = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        seconds = time.perf_counter() - start
    return seconds if "</html>" in done.stdout else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="a real results.json")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 64, 512], help="node counts")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument(
        "--rounds", type=int, default=6, help="paired rounds of the smallest and largest scale"
    )
    parser.add_argument("--keep", type=Path, help="keep the fanned-out results and reports here")
    args = parser.parse_args(argv)
    real = json.loads(args.results.read_text(encoding="utf-8"))
    base = args.keep or Path(tempfile.mkdtemp(prefix="report-scale-"))
    scales = sorted(set(args.scales))
    small, large = scales[0], scales[-1]
    files: dict[int, Path] = {}
    planted: dict[int, Planted] = {}
    print(f"source: {args.results} ({len(real['measurements'])} measurements, {len(real['outcomes'])} tests)")
    for nodes in scales:
        fanned, planted[nodes] = fan_out(real, nodes, args.gpus)
        path = base / f"{nodes}x{args.gpus}" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(fanned), encoding="utf-8")
        files[nodes] = path
    times: dict[int, list[float]] = {n: [] for n in scales}
    charts: dict[int, int] = {}
    for n in scales[1:-1]:  # the middle scales once each: sizes and chart counts
        seconds, charts[n] = build(files[n], files[n].parent)
        times[n].append(seconds)
    for round_ in range(args.rounds):
        order = (small, large) if round_ % 2 == 0 else (large, small)
        for n in order:
            seconds, charts[n] = build(files[n], files[n].parent)
            times[n].append(seconds)
        print(
            f"  round {round_ + 1}: {small} node(s) {times[small][-1]:.2f} s, {large} nodes {times[large][-1]:.2f} s"
        )
    print("(timings on a shared, loaded 2-core machine)")
    for n in scales:
        path = files[n]
        size = path.stat().st_size
        html = (path.parent / "report.html").stat().st_size
        md = (path.parent / "report.md").read_text(encoding="utf-8")
        found = "yes" if names_planted(md, planted[n]) else "NO"
        gpus = n * args.gpus
        print(
            f"scale {n}x{args.gpus}: results.json {_mb(size)} ({size / gpus:.0f} B per GPU), report.html "
            f"{_mb(html)}, report.md {_mb(len(md.encode()))}, charts {charts[n]}, report time median "
            f"{statistics.median(times[n]):.2f} s; findings name the planted GPU "
            f"({planted[n].slow_node} GPU {planted[n].slow_gpu}) and port ({planted[n].port_node} "
            f"{planted[n].port}) with their actions: {found}"
        )
    top = files[large].stat().st_size
    print(
        f"results.json at {large}x{args.gpus}: {_mb(top)}, limit {_mb(LIMIT_BYTES)}: {'ok' if top < LIMIT_BYTES else 'OVER'}"
    )
    print(
        f"charts per scale: {', '.join(f'{n} nodes {charts[n]}' for n in scales)}"
        f" ({'constant' if len(set(charts.values())) == 1 else 'NOT constant'})"
    )
    opened = browser_seconds(files[large].parent / "report.html")
    if opened is not None:
        print(
            f"chromium opens the {large}x{args.gpus} report.html (headless --dump-dom, browser start included) in {opened:.2f} s"
        )
    ci = median_ci(paired_ratios(times[large], times[small]))
    print(ratio_line(f"report time {large}-node / {small}-node", ci))
    print(ci_line(ci, 0.10))
    if not args.keep:
        print(f"(fanned-out files in {base})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
