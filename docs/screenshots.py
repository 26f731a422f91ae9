"""Retake the documentation's pictures from real runs of the suite, with headless Chromium.

    python docs/screenshots.py [--results RESULTS.json] [--nodes 64] [--site]

- ``dry-run-table.png``: the plan of a real ``pytest acceptance/ --hw=h200-spectrumx --hostfile
  <64 hosts> --gpucluster-dry-run -q`` (a dry run probes no node, so the hosts need not exist),
  its ``[dry run]`` lines as a terminal shows them.
- ``report-first-screen-1node.png``: the first screen of the report of a real cpu-local run
  (``--results``; without it, this script runs ``pytest acceptance/ -m quick`` first).
- ``report-first-screen.png`` and ``fleet-chart.png``: that run fanned out to ``--nodes`` x 8 GPUs
  (``pytest_gpucluster.testbed.fanout``: one slow GPU and one failing port planted), its report's
  first screen and its per-GPU matmul chart across the fleet.
- ``report-first-screen-h200.png``: the first screen of the report of the real quick tier recorded
  on a lent H200 (``tests/data/gpu_session/h200_2026_11_28/quick/results.json``; ``--gpu-results``).
- ``--site DIR``: also the built site's home, tutorial and options reference (``mkdocs build``
  first), into DIR rather than docs/ (pictures of the site are for checking it, not for the site).

Every picture is a Chromium screenshot of a page the suite wrote; Pillow, where installed, only
re-encodes it with a palette so that it stays well under 300 KB.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_gpucluster.results.baseline import read_results  # noqa: E402
from pytest_gpucluster.results.report import write_reports  # noqa: E402
from pytest_gpucluster.testbed.chromium import CHROMIUM, headless_flags  # noqa: E402
from pytest_gpucluster.testbed.fanout import dumps, fan_out  # noqa: E402

OUT = REPO / "docs" / "screenshots"
GPU_RESULTS = REPO / "tests" / "data" / "gpu_session" / "h200_2026_11_28" / "quick" / "results.json"
LIMIT = 300 * 1024
TERMINAL_CSS = (
    "body{margin:0;background:#1e1e1e;}pre{margin:0;padding:16px 20px;color:#d4d4d4;"
    "font:13px/1.45 'DejaVu Sans Mono',monospace;white-space:pre;}b{color:#9cdcfe;font-weight:normal}"
)


def screenshot(url: str, png: Path, width: int = 1280, height: int = 800) -> Path:
    """``url`` as headless Chromium draws it in a ``width`` x ``height`` window, into ``png``."""
    if not CHROMIUM.exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: install it (.ci/install-system-deps) to take pictures")
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        argv = [
            str(CHROMIUM),
            *headless_flags(width, height),
            "--hide-scrollbars",
            "--virtual-time-budget=3000",  # let the page's scripts run (the site's search box) before the picture
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            url,
        ]
        subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    _shrink(png)
    print(f"{png.relative_to(REPO) if png.is_relative_to(REPO) else png}: {png.stat().st_size // 1024} KB")
    return png


def _shrink(png: Path) -> None:
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)
    if png.stat().st_size > LIMIT:
        print(f"warning: {png} is {png.stat().st_size // 1024} KB, above {LIMIT // 1024} KB", file=sys.stderr)


def _pytest(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout + done.stderr


def dry_run_table(work: Path, nodes: int) -> Path:
    hosts = work / f"hosts{nodes}"
    hosts.write_text("".join(f"gpu{i:03d} slots=8\n" for i in range(1, nodes + 1)), encoding="utf-8")
    text = _pytest(
        "--hw=h200-spectrumx",
        f"--hostfile={hosts}",
        "--gpucluster-dry-run",
        "-q",
        f"--results-dir={work / 'dry'}",
    )
    lines = [
        line.strip().replace(str(hosts), f"hosts{nodes}") for line in text.splitlines() if "[dry run]" in line
    ]
    if not lines:
        raise SystemExit("the dry run printed no [dry run] lines:\n" + text[-3000:])
    command = f"$ pytest acceptance/ --hw=h200-spectrumx --hostfile hosts{nodes} --gpucluster-dry-run -q"
    body = "\n".join([f"<b>{html.escape(command)}</b>", *(html.escape(line) for line in lines)])
    page = work / "dry-run.html"
    page.write_text(f"<!doctype html><style>{TERMINAL_CSS}</style><pre>{body}</pre>", encoding="utf-8")
    width = 9 * max(len(line) for line in [command, *lines]) + 60
    return screenshot(
        page.as_uri(), OUT / "dry-run-table.png", width=min(width, 1800), height=18 * len(lines) + 60
    )


def real_run(work: Path) -> Path:
    out = work / "run"
    text = _pytest("-m", "quick", f"--results-dir={out}")
    if not (out / "results.json").is_file():
        raise SystemExit("the quick run wrote no results.json:\n" + text[-3000:])
    return out / "results.json"


def reports(results: Path, work: Path, nodes: int) -> None:
    one = work / "report-1"
    write_reports(read_results(results), one)
    screenshot((one / "report.html").as_uri(), OUT / "report-first-screen-1node.png")
    fanned, planted = fan_out(json.loads(results.read_text(encoding="utf-8")), nodes, 8)
    fleet = work / f"report-{nodes}"
    fleet.mkdir(parents=True, exist_ok=True)
    (fleet / "results.json").write_text(dumps(fanned), encoding="utf-8")
    write_reports(read_results(fleet / "results.json"), fleet)
    report = fleet / "report.html"
    screenshot(report.as_uri(), OUT / "report-first-screen.png")
    chart = _chart_page(report, planted.slow_metric or "matmul", fleet / "chart.html")
    screenshot(chart.as_uri(), OUT / "fleet-chart.png", width=690, height=390)


def gpu_report(results: Path, work: Path) -> None:
    out = work / "h200-quick"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(results, out / "results.json")  # the report names the file it was read from
    write_reports(read_results(out / "results.json"), out)
    screenshot((out / "report.html").as_uri(), OUT / "report-first-screen-h200.png", height=470)


def _chart_page(report: Path, metric: str, page: Path) -> Path:
    """The report's chart of ``metric`` alone, with the report's own style: one figure as the report shows it."""
    text = report.read_text(encoding="utf-8")
    style = "".join(re.findall(r"<style>.*?</style>", text, flags=re.S))
    figures = re.findall(r"<figure>.*?</figure>", text, flags=re.S)
    mine = [f for f in figures if metric in f] or figures
    if not mine:
        raise SystemExit(f"{report} has no chart")
    page.write_text(f"<!doctype html>{style}<body style='margin:8px'>{mine[0]}</body>", encoding="utf-8")
    return page


def site(out: Path) -> None:
    subprocess.run(["mkdocs", "build", "--strict"], cwd=REPO, check=True)
    built = REPO / "site"
    for name, path in (
        ("site-home.png", "index.html"),
        ("site-tutorial.png", "tutorial/first-acceptance.html"),
        ("site-options.png", "reference/options.html"),
    ):
        screenshot((built / path).as_uri(), out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="a real cpu-local results.json (default: run -m quick)")
    parser.add_argument("--gpu-results", type=Path, default=GPU_RESULTS, help="a real GPU run's results.json")
    parser.add_argument("--nodes", type=int, default=64, help="the fleet size the run is fanned out to")
    parser.add_argument("--site", type=Path, metavar="DIR", help="also screenshot the built site into DIR")
    parser.add_argument("--only-site", action="store_true", help="only the site's pictures (with --site)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="docs-shots-") as tmp:
        work = Path(tmp)
        if not args.only_site:
            dry_run_table(work, args.nodes)
            reports(args.results or real_run(work), work, args.nodes)
            gpu_report(args.gpu_results, work)
        if args.site:
            site(args.site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
