"""report.md, a self-contained report.html (plots inlined as data: URIs) and summary.csv.

Input is a parsed results.json (``RunResults``), so the plugin at session end and
``gpucluster report RESULTS.json`` produce the same files. PNGs also go to ``plots/`` next to
report.md, which links them. No pytest import; matplotlib only through plots.py.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.atomic import write_atomic
from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import (
    SUSPECTS_FILE,
    Suspect,
    drain_list_due,
    read_suspects,
    write_findings,
)
from pytest_gpucluster.results.baseline import BaselineComparison, GateMode, RunResults, compare_runs
from pytest_gpucluster.results.chart_groups import uncharted_rows
from pytest_gpucluster.results.comparison_text import (
    COMPARISON_HEADER,
    comparison_head,
    comparison_lines,
    comparison_notes,
    comparison_row,
    regression_sentence,
)
from pytest_gpucluster.results.findings import Finding, findings_of
from pytest_gpucluster.results.gate import Tolerances
from pytest_gpucluster.results.job_times import JOB_TIME_HEADER, job_time_rows, job_time_summary
from pytest_gpucluster.results.matrix import Column, node_matrix
from pytest_gpucluster.results.model import TestOutcome
from pytest_gpucluster.results.plots import Plot, render_plots, unavailable
from pytest_gpucluster.results.recorder import Recorder
from pytest_gpucluster.results.render import Block, markdown, page
from pytest_gpucluster.results.signoff import Verdict, action_column, skip_groups, verdict_of
from pytest_gpucluster.results.summary import FAILURE_HEADINGS, measurement_rows

__all__ = ["BASELINE_TEST_ID", "CSV_COLUMNS", "Finished", "ReportFiles", "finish_run", "write_reports"]

BASELINE_TEST_ID = "gpucluster::baseline"
"""The test id of the synthetic outcome added to results.json when the comparison at the end finds
a regression that no test failed on (a value recorded outside ``check_all``'s gate)."""

CSV_COLUMNS = (
    "test_id",
    "metric",
    "scope",
    "labels",
    "value",
    "unit",
    "threshold",
    "comparison",
    "verdict",
    "median",
    "min",
    "max",
    "mad",
    "repeats",
    "threshold_key",
    "attempt",
    "baseline",
    "change",
    "baseline_status",
)


@dataclass(frozen=True, slots=True)
class ReportFiles:
    markdown: Path
    html: Path
    csv: Path
    plots: tuple[Path, ...]
    note: str | None
    """Why there are no plots (matplotlib missing), else None."""

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.html, self.markdown, self.csv)


def _environment(run: RunResults) -> list[tuple[str, str]]:
    fp = run.fingerprint
    versions = fp.get("versions") or {}
    rows = [
        ("profile", f"{run.profile.get('name', '?')} ({run.profile.get('reason', '')})".replace(" ()", "")),
        ("thresholds", f"{run.profile.get('path', '?')} (sha256 {str(run.profile.get('sha256', ''))[:12]})"),
        ("hosts", ", ".join(fp.get("hosts") or []) or "?"),
        ("GPUs", f"{fp.get('gpu_count', 0)} x {fp.get('gpu_model') or 'none'}"),
        ("platform", str(fp.get("platform", "?"))),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "error")),
    ]
    env = {**(fp.get("environment") or {}), **run.nccl_env}
    rows.append(("NCCL environment", ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(none set)"))
    if run.started_at:
        rows.append(("started", time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(run.started_at))))
    return rows


MEASUREMENT_ROWS = 300
"""Rows of the measurement table in the report (failures first); every value is in summary.csv."""
FINDING_ROWS = 500
SUMMARY_FINDINGS = 20
"""Findings printed in the terminal summary (all of them are in results.json and the report)."""


def _logs_href(run: RunResults, out_dir: Path) -> str | None:
    jobs = Path(run.source).parent / "jobs"
    if not jobs.is_dir():
        return None
    return os.path.relpath(jobs, out_dir) + "/"


def _blocks(
    run: RunResults,
    comparison: BaselineComparison | None,
    plots: list[Plot],
    note: str | None,
    out_dir: Path,
    columns: Sequence[Column] = (),
) -> list[Block]:
    """The report's content once; Markdown and HTML only render it (``render.py``). Order: the
    sign-off (verdict, node x area matrix with the next action per node, findings, skips), then
    the raw failures and the baseline comparison, the charts, every number, the setup."""
    hosts = [str(h) for h in run.fingerprint.get("hosts") or ()]
    findings = findings_of(run.measurements, run.outcomes, hosts, suspects_beside(Path(run.source)))
    matrix = node_matrix(run.measurements, run.outcomes, findings, hosts)
    matrix.add_column(action_column(findings, [r.name for r in matrix.nodes]))
    if run.history:
        from pytest_gpucluster.results.history.column import history_column

        matrix.add_column(history_column(run.history))
    for column in columns:
        matrix.add_column(column)
    verdict = verdict_of(run.outcomes, findings, matrix, len(run.measurements))
    blocks: list[Block] = [("verdict", verdict)]
    if run.nodes_used and run.nodes_used.get("line"):
        blocks.append(("p", f"Nodes: {run.nodes_used['line']}"))
    blocks.append(("matrix", matrix))
    if findings:
        blocks += [
            ("h2", f"Findings: {len(findings)} (reason class and next action for each)"),
            ("findings", findings, _logs_href(run, out_dir), FINDING_ROWS, out_dir.resolve()),
        ]
    if run.retest and run.retest.get("rows"):
        retest = run.retest
        blocks += [
            ("h2", f"Retest of suspects: confirmed {', '.join(retest['confirmed']) or 'none'}, "
                   f"cleared {', '.join(retest['cleared']) or 'none'}"),
            ("table", retest["header"], retest["rows"], None),
        ]  # fmt: skip
    skips = skip_groups(run.outcomes)
    if skips:
        skipped = sum(len(g.tests) for g in skips)
        blocks += [("h2", f"Skipped: {skipped} test(s), {len(skips)} reason(s)"), ("skips", skips)]
    raw: list[Block] = []
    for category, heading in FAILURE_HEADINGS:
        failed = [o for o in run.outcomes if o.category == category]
        if failed:
            rows = [(o.test_id, o.message or o.outcome) for o in failed]
            raw += [("p", f"{heading}: {len(failed)}"), ("table", ("test", "message"), rows, None)]
    if raw:
        failed_tests = sum(o.outcome in ("failed", "error") for o in run.outcomes)
        blocks.append(("details", f"Failed tests, raw messages ({failed_tests})", raw))
    blocks.append(("p", f"Results: {run.source}"))
    if comparison is not None:
        blocks += [("h2", "Comparison with the baseline"), ("pre", comparison_head(comparison))]
        shown = [c for c in comparison.changes if c.status not in ("ok", "info")]
        if shown:
            rows = [comparison_row(c) for c in shown]
            blocks.append(("table", tuple(h.lower() for h in COMPARISON_HEADER), rows, 0))
        gated = sum(c.status == "ok" for c in comparison.changes)
        info = sum(c.status == "info" for c in comparison.changes)
        if gated or info:
            blocks.append(
                (
                    "p",
                    f"{gated} more gated within tolerance, {info} more compared but not gated (every row in "
                    "summary.csv: baseline, change, status).",
                )
            )
        blocks.append(("pre", comparison_notes(comparison)))
    blocks.append(("h2", "Plots"))
    if note:
        blocks.append(("p", f"Plots are not included: {note}."))
    elif not plots:
        blocks.append(("p", "Nothing to plot: no metric has a size, rank, host or node series."))
    blocks += [("plot", plot) for plot in plots]
    cells = uncharted_rows(run.measurements)
    if cells:
        blocks += [
            ("h2", "Values not charted: booleans, single values, per-port counters (one row per metric)"),
            ("cells", ("metric", "values", "median / value", "range", "failed"), cells),
        ]
    blocks.append(("h2", "Measurements"))
    if run.measurements:
        header = ("verdict", "metric", "measured", "threshold")
        rows = measurement_rows(run.measurements)
        blocks.append(("table", header, rows[:MEASUREMENT_ROWS], 0))
        more = f"{len(rows) - MEASUREMENT_ROWS} more rows, and " if len(rows) > MEASUREMENT_ROWS else ""
        blocks.append(("p", f"{more}every value, one row each, in summary.csv."))
    else:
        blocks.append(("p", "No measurements were recorded."))
    if run.jobs:
        blocks += [
            ("h2", f"Job times: estimated and taken ({len(run.jobs)} job(s))"),
            ("p", job_time_summary(run.jobs, run.plan)),
            ("table", JOB_TIME_HEADER, job_time_rows(run.jobs), None),
        ]
    blocks += [("h2", "Environment"), ("table", ("", ""), _environment(run), None)]
    return blocks


def _csv(run: RunResults, comparison: BaselineComparison | None) -> str:
    changes = {k: c for c in comparison.changes for k in c.members} if comparison is not None else {}
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for m in run.measurements:
        s = m.spread
        c = changes.get(m.key)
        writer.writerow(
            [
                m.test_id,
                m.metric,
                m.scope or "",
                ";".join(f"{k}={v}" for k, v in m.labels.items()),
                "" if m.value != m.value else repr(m.value),
                m.unit,
                "" if m.threshold is None else repr(m.threshold),
                m.comparison if m.threshold is not None else "",
                m.verdict,
                *(("", "", "", "", "") if s is None else (s.median, s.min, s.max, s.mad, s.n)),
                "" if m.ref is None else str(m.ref),
                m.attempt,
                "" if c is None or c.old is None else repr(c.old),
                "" if c is None or c.change is None else f"{c.change:.6g}",
                "" if c is None else c.status,
            ]
        )
    return buffer.getvalue()


def write_reports(
    run: RunResults,
    out_dir: Path,
    comparison: BaselineComparison | None = None,
    *,
    charts: bool = True,
    columns: Sequence[Column] = (),
) -> ReportFiles:
    """Write report.md, report.html, summary.csv and plots/*.png into ``out_dir`` (``charts=False``:
    no plots, the report says so; ``columns``: more columns of the node matrix, after the next
    action, e.g. each node's history)."""
    if comparison is None and run.baseline:
        comparison = BaselineComparison.from_json(run.baseline)
    out_dir.mkdir(parents=True, exist_ok=True)
    note = unavailable() if charts else "charts were not asked for"
    old_values = (
        {c.key: c.old for c in comparison.changes if c.basis in ("same point", "per host")}
        if comparison is not None
        else {}
    )
    plots = [] if note else render_plots(run.measurements, old_values)
    plot_paths: list[Path] = []
    if plots:
        plot_dir = out_dir / "plots"
        plot_dir.mkdir(exist_ok=True)
        for stale in plot_dir.glob("*.png"):
            stale.unlink()
        for plot in plots:
            plot_paths.append(plot_dir / plot.filename)
            write_atomic(plot_paths[-1], plot.png)
    files = ReportFiles(
        markdown=out_dir / "report.md",
        html=out_dir / "report.html",
        csv=out_dir / "summary.csv",
        plots=tuple(plot_paths),
        note=note,
    )
    blocks = _blocks(run, comparison, plots, note, out_dir, columns)
    write_atomic(files.markdown, markdown(blocks))
    write_atomic(files.html, page(blocks))
    write_atomic(files.csv, _csv(run, comparison))
    return files


@dataclass(frozen=True, slots=True)
class Finished:
    """What the end of a session produced, for the terminal summary."""

    comparison: BaselineComparison | None
    files: ReportFiles | None
    error: str | None = None
    findings: tuple[Finding, ...] = ()
    verdict: Verdict | None = None

    def summary_args(self) -> dict[str, Any]:
        note = self.error or (f"no plots: {self.files.note}" if self.files and self.files.note else None)
        shown = [f"  {f.line()}" for f in self.findings[:SUMMARY_FINDINGS]]
        if len(self.findings) > SUMMARY_FINDINGS:
            shown.append(f"  ... {len(self.findings) - SUMMARY_FINDINGS} more in results.json and the report")
        return {
            "finding_lines": (
                [f"FINDINGS (where: what -> reason class; next action): {len(self.findings)}", *shown]
                if self.findings
                else ()
            ),
            "comparison_lines": (
                comparison_lines(self.comparison, show_ok=False, limit=40) if self.comparison else ()
            ),
            "reports": self.files.paths if self.files else (),
            "report_note": note,
            "signoff_line": (
                f"SIGN-OFF {self.verdict.headline}. {self.verdict.sentence}".rstrip(". ") + "."
                if self.verdict
                else ""
            ),
        }


def finish_run(
    recorder: Recorder,
    out_dir: Path,
    baseline: RunResults | None,
    tolerances: Tolerances | float,
    *,
    mode: GateMode = "fail",
    tests_failed: bool = False,
) -> Finished:
    """The end of a pytest session: compare with the baseline, then write the reports.

    The tests have already been gated value by value (``check_all``); this comparison is the same
    judgement over the whole run (``gpucluster compare`` gives it again from the two files), stored
    under ``baseline`` so ``gpucluster report`` can show it. A regression it finds while no test
    failed (a value recorded outside the gate) becomes a failed outcome, category performance. A
    report that cannot be written is an error line in the summary, never a lost results.json.
    """
    comparison = None
    if baseline is not None:
        current = RunResults.from_json(recorder.to_json(), str(recorder.path))
        comparison = compare_runs(baseline, current, tolerances, mode=mode)
        recorder.header["baseline"] = comparison.to_json()
        if comparison.fails and not tests_failed:
            recorder.add_outcome(
                TestOutcome(
                    test_id=BASELINE_TEST_ID,
                    outcome="failed",
                    category="performance",
                    duration_s=0.0,
                    message=_unreported(comparison),
                )
            )
    findings = tuple(record_findings(recorder, out_dir))
    verdict = signoff_of(recorder, findings)
    recorder.flush()
    try:
        run = RunResults.from_json(recorder.to_json(), str(recorder.path))
        return Finished(
            comparison, write_reports(run, out_dir, comparison), findings=findings, verdict=verdict
        )
    except Exception as exc:  # a plotting bug or a full disk must not hide the test results
        error = f"could not be written to {out_dir}: {type(exc).__name__}: {exc}"
        return Finished(comparison, None, error, findings, verdict)


def signoff_of(recorder: Recorder, findings: Sequence[Finding]) -> Verdict:
    """The report's FIT / NOT FIT verdict, also in results.json (``signoff``: ``fit``, ``verdict``,
    ``why``), so that a script gating on the run reads one boolean."""
    hosts = [str(h) for h in (recorder.header.get("fingerprint") or {}).get("hosts") or ()]
    matrix = node_matrix(recorder.measurements, recorder.outcomes, list(findings), hosts)
    verdict = verdict_of(recorder.outcomes, findings, matrix, len(recorder.measurements))
    recorder.header["signoff"] = {"fit": verdict.fit, "verdict": verdict.headline, "why": verdict.sentence}
    return verdict


def record_findings(recorder: Recorder, out_dir: Path) -> list[Finding]:
    """The run's findings into results.json (``findings``) and into the drain list (suspects.json,
    where burn-in wrote one or a finding needs a host drained)."""
    hosts = [str(h) for h in (recorder.header.get("fingerprint") or {}).get("hosts") or ()]
    suspects = suspects_beside(out_dir / "results.json")
    findings = findings_of(recorder.measurements, recorder.outcomes, hosts, suspects)
    recorder.header["findings"] = [f.to_json() for f in findings]
    drain_list = out_dir / SUSPECTS_FILE
    if drain_list_due(drain_list, recorder.header["findings"]):
        write_findings(drain_list, recorder.header["findings"])
    return findings


def suspects_beside(results: Path) -> list[Suspect]:
    """The burn-in's suspects in the suspects.json next to a results.json (none: no file, or one
    that cannot be read — the report is still written, from the values alone)."""
    try:
        return read_suspects(results.parent / SUSPECTS_FILE)
    except BurninError:
        return []


def _unreported(comparison: BaselineComparison) -> str:
    """First line names the worst offenders (one-line summaries show it), then all."""
    regs = comparison.regressions
    more = f"; and {len(regs) - 3} more" if len(regs) > 3 else ""
    lines = [
        f"{len(regs)} measurement(s) regressed against baseline {comparison.baseline}: "
        + "; ".join(c.subject for c in regs[:3])
        + more
    ]
    lines += [f"  {regression_sentence(c)}" for c in regs]
    if comparison.environment:
        lines.append("  what changed: " + "; ".join(str(e) for e in comparison.environment))
    return "\n".join(lines)
