"""``gpucluster history``: ``add RESULTS.json...``, ``node HOST``, ``lemons``, ``trend METRIC``.

Each takes ``--db PATH`` (default: ``$GPUCLUSTER_HISTORY``, the variable the plugin's
``--gpucluster-history`` reads too). Errors the user can fix raise `GpuClusterError` (the
``gpucluster`` entry point prints one sentence and exits 2). ``lemons`` exits 1 when it names a
node, so a cron job can alert on it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.history import HISTORY_ENV
from pytest_gpucluster.results.history.nodes import (
    DEFAULT_MAX_FAILURE_RATE,
    DEFAULT_RECURRING,
    DEFAULT_WINDOW,
    find_lemons,
    node_history,
    trend,
    when,
)
from pytest_gpucluster.results.history.store import HistoryStore
from pytest_gpucluster.results.text import format_value

__all__ = ["add_history_command"]


def _db(args: argparse.Namespace) -> Path:
    text = args.db or os.environ.get(HISTORY_ENV)
    if not text:
        raise GpuClusterError(f"which history store? pass --db PATH or set {HISTORY_ENV}")
    return Path(text).expanduser()


def cmd_add(args: argparse.Namespace) -> int:
    db = _db(args)
    with HistoryStore.open(db) as store:
        for name in args.results:
            run = read_results(Path(name))
            result = store.append(run)
            state = "added as" if result.added else "already stored as"
            print(f"{name}: {state} run #{result.run_id} ({len(run.measurements)} measurements)")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    with HistoryStore.open(_db(args), create=False) as store:
        history = node_history(store, args.host, window=args.last)
    if not history.runs:
        raise GpuClusterError(f"the history holds no run on node {args.host}")
    failed = len({f.run.id for f in history.failures})
    print(f"node {args.host}: {len(history.runs)} run(s), failed in {failed}")
    for reason, count in history.by_reason.items():
        print(f"  {reason}: {count} run(s)")
    if history.failures:
        print("failures:")
        for failure in history.failures:
            print(f"  {failure.line()}")
    if history.counters:
        print("counters over time:")
        for name, points in sorted(history.counters.items()):
            shown = ", ".join(f"#{run.id}: {format_value(v, '')}".rstrip() for run, v in points)
            print(f"  {name}: {shown}")
    return 0


def cmd_lemons(args: argparse.Namespace) -> int:
    with HistoryStore.open(_db(args), create=False) as store:
        runs = store.runs(last=args.last)
        lemons = find_lemons(
            store, window=args.last, max_failure_rate=args.max_failure_rate, recurring=args.recurring
        )
    rule = (
        f"failure rate above {args.max_failure_rate:.0%} (2+ failed runs), or a component failing in "
        f"{args.recurring}+ runs"
    )
    print(f"lemon nodes over the last {len(runs)} run(s) ({rule}): {len(lemons) or 'none'}")
    for lemon in lemons:
        print(f"{lemon.host}: {'; '.join(lemon.why)}")
        for failure in lemon.evidence:
            print(f"  {failure.line()}")
    return 1 if lemons else 0


def cmd_trend(args: argparse.Namespace) -> int:
    with HistoryStore.open(_db(args), create=False) as store:
        runs, series = trend(store, args.metric, window=args.last)
        units = store.query("SELECT unit FROM measurements WHERE metric = ? LIMIT 1", (args.metric,))
    if not series:
        raise GpuClusterError(f"the history holds no value of {args.metric!r}")
    unit = units[0][0] if units else ""
    hosts = list(series)
    print(f"{args.metric} per node, median of its values in each run (n = how many):")
    print("  " + "  ".join(["run".ljust(6), "started".ljust(20), *(h.ljust(22) for h in hosts)]))
    for run in runs:
        cells = []
        for host in hosts:
            point = series[host].get(run.id)
            cells.append(
                "-".ljust(22) if point is None else f"{format_value(point[0], unit)} (n={point[1]})".ljust(22)
            )
        print("  " + "  ".join([f"#{run.id}".ljust(6), when(run).ljust(20), *cells]))
    if args.plot:
        from pytest_gpucluster.results.history.trend_plot import trend_png
        from pytest_gpucluster.results.plots import unavailable

        if (why := unavailable()) is not None:
            raise GpuClusterError(f"no chart: {why}")
        Path(args.plot).write_bytes(trend_png(args.metric, unit, runs, series))
        print(f"chart: {args.plot}")
    return 0


def cmd_add_fabric(args: argparse.Namespace) -> int:
    from pytest_gpucluster.results.history.cables import add_fabric_scan

    with HistoryStore.open(_db(args)) as store:
        for name in args.scans:
            result = add_fabric_scan(store, Path(name))
            state = "added as" if result.added else "already stored as"
            print(f"{name}: {state} fabric scan #{result.run_id} ({result.measurements} findings)")
    return 0


def cmd_cables(args: argparse.Namespace) -> int:
    from pytest_gpucluster.results.history.cables import failing_cables

    with HistoryStore.open(_db(args), create=False) as store:
        cables = failing_cables(store, window=args.last, recurring=args.recurring)
        scans = store.query("SELECT COUNT(*) FROM fabric_scans")[0][0]
    print(
        f"cables failing in {args.recurring}+ of the last {min(scans, args.last)} fabric scan(s): {len(cables) or 'none'}"
    )
    for cable in cables:
        print(cable.line())
        for line in cable.lines:
            print(f"  {line}")
    return 1 if cables else 0


def _rate(text: str) -> float:
    try:
        value = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.2 or 20%, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a failure rate between 0 and 1, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_history_command(sub: Any) -> None:
    """Register ``gpucluster history`` on the ``gpucluster`` subparsers ``sub``."""
    history = sub.add_parser(
        "history",
        help="the run history store: `history add|node|lemons|trend|add-fabric|cables` (--db or $GPUCLUSTER_HISTORY)",
    )
    actions = history.add_subparsers(dest="action", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("--db", metavar="PATH", help=f"the history store (default: ${HISTORY_ENV})")
        return parser

    add = action("add", "store earlier results.json files (any version the results reader accepts)")
    add.add_argument("results", nargs="+", metavar="RESULTS.json")
    add.set_defaults(func=cmd_add)

    node = action("node", "one node: its runs, failures by reason class, counters over time")
    node.add_argument("host")
    node.add_argument("--last", type=_positive, default=None, metavar="N", help="only the last N runs")
    node.set_defaults(func=cmd_node)

    lemons = action("lemons", "nodes that fail too often, or on the same GPU or port again; exit 1 if any")
    lemons.add_argument("--last", type=_positive, default=DEFAULT_WINDOW, metavar="N",
                        help=f"the window: the last N runs (default {DEFAULT_WINDOW})")  # fmt: skip
    lemons.add_argument("--max-failure-rate", type=_rate, default=DEFAULT_MAX_FAILURE_RATE, metavar="RATE",
                        help=f"name a node failing in more of its runs (default {DEFAULT_MAX_FAILURE_RATE:g})")  # fmt: skip
    lemons.add_argument("--recurring", type=_positive, default=DEFAULT_RECURRING, metavar="K",
                        help=f"name a node whose same component failed in K runs (default {DEFAULT_RECURRING})")  # fmt: skip
    lemons.set_defaults(func=cmd_lemons)

    fab = action(
        "add-fabric", "store fabric scans' findings (gpucluster fabric scan --out DIR: DIR/fabric.json)"
    )
    fab.add_argument("scans", nargs="+", metavar="FABRIC.json")
    fab.set_defaults(func=cmd_add_fabric)

    cab = action("cables", "cables with a fabric-scan finding in K of the last N scans; exit 1 if any")
    cab.add_argument("--last", type=_positive, default=DEFAULT_WINDOW, metavar="N",
                     help=f"the window: the last N fabric scans (default {DEFAULT_WINDOW})")  # fmt: skip
    cab.add_argument("--recurring", type=_positive, default=DEFAULT_RECURRING, metavar="K",
                     help=f"name a cable with findings in K scans (default {DEFAULT_RECURRING})")  # fmt: skip
    cab.set_defaults(func=cmd_cables)

    tr = action("trend", "one metric per node across runs")
    tr.add_argument("metric")
    tr.add_argument("--last", type=_positive, default=None, metavar="N", help="only the last N runs")
    tr.add_argument("--plot", metavar="FILE.png", help="also draw the fleet's median, band and outlier nodes")
    tr.set_defaults(func=cmd_trend)
