"""Markdown and HTML for the report's blocks: the report decides what it says (``report.py``), this
module only how it reads in each format.

A block is a tuple: ``("h2", text)``, ``("p", text)``, ``("pre", lines)``, ``("table", header,
rows, css_class_column)``, ``("plot", Plot)``, ``("cells", header, rows)`` (a table of values that
are not worth a chart), ``("verdict", Verdict)``, ``("matrix", NodeMatrix)``, ``("findings",
findings, logs_href, limit, out_dir)`` (each finding links the job directories its message names,
else the run's jobs/ folder), ``("skips", groups)``, ``("details", summary, blocks)`` (folded in
HTML). report.html is one file: plots are inlined as data: URIs; report.md links ``plots/``.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_gpucluster.results.findings import ACTIONS, LADDER, Finding
from pytest_gpucluster.results.matrix import CLUSTER, Cell, NodeMatrix, Row
from pytest_gpucluster.results.summary import FAILURE_HEADINGS

__all__ = ["Block", "markdown", "page"]

Block = tuple[Any, ...]
TITLE = "GPU cluster acceptance report"


def _finding_row(f: Finding) -> tuple[str, ...]:
    what = f.metric + (f" [{f.scope}]" if f.scope else "")
    action = f.action + (f": {f.fix}" if f.fix else "")  # a readiness finding's concrete fix
    return (f.where(), what, f.value_text(), f.threshold_text(), f.source or "-", f.reason, action)


FINDING_HEADER = ("where", "what", "measured", "threshold", "threshold from", "reason", "next action")


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows] + [""]


def _md_matrix_cell(cell: Cell) -> str:
    if cell.status in ("pass", "fail"):
        return f"{cell.status.upper()} ({cell.count})" if cell.count else cell.status.upper()
    return cell.status


def markdown(blocks: Sequence[Block]) -> str:
    out = [f"# {TITLE}", ""]
    for kind, *rest in blocks:
        if kind == "verdict":
            verdict = rest[0]
            out += [f"**{verdict.headline}**", ""] + ([verdict.sentence, ""] if verdict.sentence else [])
        elif kind == "h2":
            out += [f"## {rest[0]}", ""]
        elif kind == "p":
            out += [rest[0], ""]
        elif kind == "pre":
            out += ["```", *rest[0], "```", ""]
        elif kind in ("table", "cells"):
            out += _md_table(rest[0], rest[1])
        elif kind == "matrix":
            matrix: NodeMatrix = rest[0]
            header = ["node", *(a.title for a in matrix.areas), *(c.title for c in matrix.columns)]
            rows = [
                [row.name, *(_md_matrix_cell(row.cells[a.key]) for a in matrix.areas)]
                + [c.values.get(row.name, "") for c in matrix.columns]
                for row in matrix.rows
            ]
            out += _md_table(header, rows)
        elif kind == "findings":
            findings, logs, limit, _ = rest
            shown = findings[:limit]
            out += _md_table((*FINDING_HEADER, "message"), [(*_finding_row(f), f.message) for f in shown])
            if len(findings) > limit:
                out += [f"{len(findings) - limit} more findings are in results.json (`findings`).", ""]
            if logs:
                out += [f"Job logs: [{logs}]({logs})", ""]
        elif kind == "skips":
            for group in rest[0]:
                out += [
                    f"- **{group.reason}** ({len(group.tests)}): " + ", ".join(f"`{t}`" for t in group.tests)
                ]
            out.append("")
        elif kind == "details":
            out += [f"### {rest[0]}", ""]
            out += markdown(rest[1]).split("\n", 2)[2].splitlines()
        elif kind == "plot":
            plot = rest[0]
            out += [
                f"### {plot.title}",
                "",
                f"![{plot.title}](plots/{plot.filename})",
                "",
                f"_{plot.caption}_",
                "",
            ]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,sans-serif;margin:1em 1.5em;color:#222}
h1{font-size:1.1em;margin:.2em 0;color:#555}h2{font-size:1.1em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.4em 0;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f0f0f0}
.FAIL,.REGRESSION,.no.value{background:#fdd}.PASS,.improved{background:#efe}
.verdict{font-size:1.4em;font-weight:bold;margin:.2em 0}.bad{color:#b00}.good{color:#070}
.sentence{margin:.2em 0 .6em;font-size:14px}
td.c-pass{background:#d9f2d9}td.c-fail{background:#f5b7b1;font-weight:bold}td.c-na{background:#eee;color:#777}
td.c-notrun{background:#fff3cd}td.c-none{color:#aaa}td small{color:#555;font-weight:normal}
tr.cluster td:first-child{font-style:italic}td.action{max-width:520px}
tr.hardware td:nth-child(7),tr.hardware td:nth-child(6){color:#b00;font-weight:bold}
pre{background:#f6f6f6;padding:.5em 1em;overflow-x:auto;white-space:pre-wrap;max-width:1000px}
figure{margin:1em 0;display:inline-block;vertical-align:top}
figcaption{font-size:12px;color:#555;max-width:660px}img{border:1px solid #ddd;max-width:660px}
.legend{font-size:12px;color:#555;margin:.2em 0}details{margin:.2em 0}summary{cursor:pointer}
"""

_CELL_CLASS = {"pass": "c-pass", "fail": "c-fail", "n.a.": "c-na", "not run": "c-notrun", "—": "c-none"}


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], classes: Sequence[str] | None = None) -> str:
    e = html.escape
    head = f"<tr>{''.join(f'<th>{e(str(h))}</th>' for h in header)}</tr>" if any(header) else ""
    body = []
    for i, row in enumerate(rows):
        cls = f" class='{e(classes[i])}'" if classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _matrix(matrix: NodeMatrix) -> str:
    e = html.escape
    head = "".join(
        f"<th>{e(t)}</th>"
        for t in ("node", *(a.title for a in matrix.areas), *(c.title for c in matrix.columns))
    )
    body: list[str] = []
    folded: list[str] = []
    quiet = [r for r in matrix.nodes if _quiet(r)]
    fold = len(quiet) > FOLD_AFTER
    for row in matrix.rows:
        cells = []
        for a in matrix.areas:
            cell = row.cells[a.key]
            count = f" <small>{cell.count}</small>" if cell.count else ""
            title = f" title='{e(cell.note)}'" if cell.note else ""
            cells.append(f"<td class='{_CELL_CLASS[cell.status]}'{title}>{e(cell.status)}{count}</td>")
        extra = "".join(
            f"<td class='{e(c.key)}'>{e(c.values.get(row.name, ''))}</td>" for c in matrix.columns
        )
        name = "cluster (no single node)" if row.name == CLUSTER else row.name
        cls = " class='cluster'" if row.name == CLUSTER else (" class='failing'" if row.failed else "")
        (folded if fold and row.name != CLUSTER and _quiet(row) else body).append(
            f"<tr{cls}><td>{e(name)}</td>{''.join(cells)}{extra}</tr>"
        )
    table = f"<table class='matrix'><tr>{head}</tr>{''.join(body)}</table>"
    if not folded:
        return table
    return (
        f"{table}<details><summary>{len(folded)} more node(s) where every area passed or was not applicable "
        f"(show)</summary><table class='matrix'><tr>{head}</tr>{''.join(folded)}</table></details>"
    )


FOLD_AFTER = 16
"""More nodes than this with nothing to act on are folded under one line, so that the findings
stay on the first screen; each is one click away."""


def _quiet(row: Row) -> bool:
    return all(c.status in ("pass", "n.a.", "—") for c in row.cells.values())


_JOB_DIR = re.compile(r"(/[^\s'\"]*/jobs/[A-Za-z0-9][A-Za-z0-9._-]*)")


def job_dirs(message: str, out_dir: Path | None) -> list[str]:
    """The job directories a failure message names, relative to the report where they lie under
    its folder (a link that survives copying the results folder), else as they are."""
    found = []
    for path in dict.fromkeys(_JOB_DIR.findall(message)):
        if out_dir is not None and Path(path).is_relative_to(out_dir):
            path = os.path.relpath(path, out_dir)
        found.append(path.rstrip("/") + "/")
    return found[:3]


def _findings(findings: Sequence[Finding], logs: str | None, limit: int, out_dir: Path | None = None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in (*FINDING_HEADER, "raw message and logs"))
    body = []
    for f in findings[:limit]:
        cells = "".join(f"<td>{e(c)}</td>" for c in _finding_row(f))
        named = job_dirs(f.message, out_dir)
        link = "".join(f" <a href='{e(d)}'>job {e(Path(d).name)}</a>" for d in named) or (
            f" <a href='{e(logs)}'>job logs</a>" if logs else ""
        )
        raw = (
            f"<details><summary>{e(f.why)}</summary><pre>{e(f.message)}</pre>"
            f"<div>test: <code>{e(f.test_id)}</code>{link}</div></details>"
        )
        body.append(f"<tr class='{e(f.reason.replace(' ', '-'))}'>{cells}<td>{raw}</td></tr>")
    more = (
        f"<p>{len(findings) - limit} more findings are in results.json (<code>findings</code>).</p>"
        if len(findings) > limit
        else ""
    )
    return f"<table class='findings'><tr>{head}</tr>{''.join(body)}</table>{more}"


def _ladder() -> str:
    return " &rarr; ".join(f"<span title='{html.escape(ACTIONS[a])}'>{html.escape(a)}</span>" for a in LADDER)


def _body(blocks: Sequence[Block]) -> list[str]:
    e = html.escape
    parts: list[str] = []
    for kind, *rest in blocks:
        if kind == "verdict":
            v = rest[0]
            parts.append(f"<p class='verdict {'good' if v.fit else 'bad'}'>{e(v.headline)}</p>")
            if v.sentence:
                parts.append(f"<p class='sentence'>{e(v.sentence)}</p>")
        elif kind == "h2":
            bad = rest[0].startswith(tuple(h for _, h in FAILURE_HEADINGS))
            parts.append(f"<h2{' class=bad' if bad else ''}>{e(rest[0])}</h2>")
        elif kind == "p":
            parts.append(f"<p>{e(rest[0])}</p>")
        elif kind == "pre":
            parts.append(f"<pre>{e(chr(10).join(rest[0]))}</pre>")
        elif kind == "table":
            header, rows, class_col = rest
            parts.append(
                _table(header, rows, [r[class_col] for r in rows] if class_col is not None else None)
            )
        elif kind == "cells":
            parts.append(_table(rest[0], rest[1]))
        elif kind == "matrix":
            parts.append(_matrix(rest[0]))
            parts.append(
                "<p class='legend'>cells: pass / fail / n.a. (skipped: hover for the reason) / not run / — (values "
                f"in the other row); the small number is how many measurements. Action ladder: {_ladder()}</p>"
            )
        elif kind == "findings":
            parts.append(_findings(*rest))
        elif kind == "skips":
            items = "".join(
                f"<li>{e(g.reason)} ({len(g.tests)}): {', '.join(f'<code>{e(t)}</code>' for t in g.tests)}</li>"
                for g in rest[0]
            )
            parts.append(f"<ul class='skips'>{items}</ul>")
        elif kind == "details":
            parts.append(f"<details><summary>{e(rest[0])}</summary>{''.join(_body(rest[1]))}</details>")
        elif kind == "plot":
            plot = rest[0]
            data = base64.b64encode(plot.png).decode("ascii")
            parts.append(
                f"<figure><img alt='{e(plot.title)}' src=\"data:image/png;base64,{data}\">"
                f"<figcaption>{e(plot.title)}: {e(plot.caption)}</figcaption></figure>"
            )
    return parts


def page(blocks: Sequence[Block]) -> str:
    """report.html: one file, no script, no external resource."""
    return "\n".join(
        [
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{TITLE}</title>",
            f"<style>{_CSS}</style></head><body><h1>{TITLE}</h1>",
            *_body(blocks),
            "</body></html>",
        ]
    )
