"""DCGM's diagnostics as checks: every test result of ``dcgmi diag`` per GPU, per node.

The rank side (``workloads/dcgm_diag.py``) runs ``dcgmi diag -r <burnin.dcgm.level> -j`` on each
node; :func:`node_reports` parses what each printed (``parsers/dcgm_diag.py``: DCGM 2.x/3.x/4.x JSON,
or the text table) and :func:`diag_checks` turns one report into checks:

- one check per (GPU, test): a ``Fail`` is a failure naming the node, the GPU and the test, with
  DCGM's own warning text (and error id) as the hint, and the GPU goes to the drain list; a
  ``Pass`` passes; ``Warn``, ``Skip`` and ``Not Run`` are recorded with their status, not gated
  (the test turns each ``Warn`` into a pytest warning);
- a result for several GPUs (DCGM 2.x ``gpu_ids: "0,1,2,3"``) fails only the GPUs its warnings name,
  when they name any (``DiagResult.blamed``); the others are recorded with the group's status;
- a failure no GPU is named for (the text table's ``Fail - All``, a 4.x ``test_summary`` that failed
  while every GPU passed) fails as the whole node's (``gpu=all``);
- a ``runtime_error`` (DCGM could not run the suite) fails the node.

Where ``dcgmi`` is missing on every node the test skips with the reason; missing on some nodes
while others have it is a failure naming them (their GPUs went undiagnosed). Pure: no pytest, no
torch, no launching.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.dcgm_diag import DiagReport, DiagResult, parse_dcgm_diag
from pytest_gpucluster.results.model import Check

__all__ = ["DcgmVerdict", "NodeReports", "diag_checks", "missing_check", "node_reports"]

METRIC = "burnin.dcgm"
GATED = ("Pass", "Fail")


@dataclass(frozen=True, slots=True)
class DcgmVerdict:
    checks: tuple[Check, ...]
    suspects: tuple[Suspect, ...]
    warnings: tuple[str, ...]
    """One sentence per ``Warn`` result, for the test to raise as pytest warnings."""


@dataclass(frozen=True, slots=True)
class NodeReports:
    """What came back from every node: parsed reports, nodes without ``dcgmi`` (and why), and
    checks for nodes whose ``dcgmi`` ran but produced no report."""

    reports: tuple[tuple[str, DiagReport], ...]
    missing: tuple[tuple[str, str], ...]
    broken: tuple[Check, ...]


def _node_failure(node: str, hint: str) -> Check:
    """A failing check for all of a node's GPUs at once (no DCGM report to judge them by)."""
    return Check(
        METRIC, 1.0, "failures", 0.0, "<=", labels={"node": node, "gpu": "all", "test": "(dcgmi)"}, hint=hint
    )


def _broken(node: str, why: str, value: Mapping[str, Any]) -> Check:
    stderr = str(value.get("stderr") or "").strip()
    tail = f" stderr: {stderr[-500:]}" if stderr else ""
    return _node_failure(
        node,
        f"dcgmi diag on node {node} gave no report: {why} (exit code {value.get('returncode')}).{tail} "
        "Is nv-hostengine running there (dcgmi discovery -l)?",
    )


def missing_check(node: str, why: str) -> Check:
    """A node without ``dcgmi`` while other nodes have it: its GPUs went undiagnosed."""
    return _node_failure(
        node,
        f"{why}, while other nodes of this run have DCGM: node {node}'s GPUs were not diagnosed. "
        "Install DCGM there (and start nv-hostengine), or take the node out of the hostfile.",
    )


def node_reports(values: Sequence[Mapping[str, Any]]) -> NodeReports:
    """Every node's ``workloads.dcgm_diag:diag`` value, parsed."""
    reports, missing, broken = [], [], []
    for value in values:
        node = str(value.get("host"))
        if not value.get("available"):
            missing.append((node, str(value.get("reason"))))
            continue
        if value.get("error"):
            broken.append(_broken(node, str(value["error"]), value))
            continue
        try:
            reports.append((node, parse_dcgm_diag(str(value.get("stdout") or ""), f"dcgmi diag on {node}")))
        except ParseError as exc:
            broken.append(_broken(node, str(exc), value))
    return NodeReports(tuple(reports), tuple(missing), tuple(broken))


def _sentence(node: str, result: DiagResult, gpu: str, level: int) -> str:
    category = f" ({result.category})" if result.category else ""
    where = f"GPU {gpu}" if gpu != "all" else "the node as a whole (no GPU named)"
    said = " ".join(result.warnings) or " ".join(result.info) or "DCGM gave no detail"
    ids = f" DCGM error id {', '.join(map(str, result.error_ids))}." if result.error_ids else ""
    return f"dcgmi diag -r {level} on node {node}: test {result.test!r}{category} {result.status} on {where}: {said}.{ids}"


def _result_checks(node: str, result: DiagResult, level: int) -> tuple[list[Check], list[Suspect], list[str]]:
    checks: list[Check] = []
    suspects: list[Suspect] = []
    warned: list[str] = []
    blamed = set(result.blamed()) if result.status == "Fail" else set()
    for gpu in [str(i) for i in result.ids] or ["all"]:
        status = result.status
        if status == "Fail" and blamed and gpu != "all" and int(gpu) not in blamed:
            status = f"Fail (blamed on GPU {', '.join(map(str, sorted(blamed)))})"
        sentence = _sentence(node, result, gpu, level)
        labels = {"node": node, "gpu": gpu, "test": result.test, "status": status}
        gated = status in GATED
        value = 1.0 if status == "Fail" else 0.0
        checks.append(
            Check(METRIC, value, "failures", 0.0 if gated else None, "<=", labels=labels, hint=sentence)
        )
        if status == "Fail":
            kind = "gpu" if gpu != "all" else "node"
            suspects.append(
                Suspect(
                    node,
                    sentence,
                    "dcgm",
                    kind,
                    gpu=f"GPU {gpu}" if gpu != "all" else None,
                    evidence=result.to_json(),
                )
            )
        elif status == "Warn":
            warned.append(sentence)
    return checks, suspects, warned


def diag_checks(node: str, report: DiagReport, level: int) -> DcgmVerdict:
    """The checks of one node's report (see the module doc)."""
    checks: list[Check] = []
    suspects: list[Suspect] = []
    warned: list[str] = []
    if report.runtime_error:
        sentence = f"dcgmi diag -r {level} on node {node} could not run its tests: {report.runtime_error}"
        checks.append(
            Check(
                METRIC,
                1.0,
                "failures",
                0.0,
                "<=",
                labels={"node": node, "gpu": "all", "test": "(runtime)"},
                hint=sentence,
            )
        )
        suspects.append(Suspect(node, sentence, "dcgm"))
    for result in report.results:
        more, named, said = _result_checks(node, result, level)
        checks += more
        suspects += named
        warned += said
    failed_tests = {r.test for r in report.results if r.status == "Fail"}
    for summary in report.summaries:
        if summary.status == "Fail" and summary.test not in failed_tests:
            whole = DiagResult(summary.test, "Fail", info=summary.info)
            more, named, _ = _result_checks(node, whole, level)
            checks += more
            suspects += named
    return DcgmVerdict(tuple(checks), tuple(suspects), tuple(warned))


def fleet_checks(found: NodeReports, level: int) -> DcgmVerdict:
    """Every node's verdict together: the nodes whose DCGM output was broken, the nodes without
    DCGM while others have it (their GPUs went undiagnosed), and each diagnosed node's results."""
    checks = [*found.broken, *(missing_check(node, why) for node, why in found.missing)]
    suspects: list[Suspect] = []
    warned: list[str] = []
    for node, report in found.reports:
        verdict = diag_checks(node, report, level)
        checks += verdict.checks
        suspects += verdict.suspects
        warned += verdict.warnings
    return DcgmVerdict(tuple(checks), tuple(suspects), tuple(warned))
