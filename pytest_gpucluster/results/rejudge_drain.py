"""The drain list of a re-judged run: ``gpucluster report RESULTS.json`` writes the drain list its
re-judged findings order, so the report and ``suspects.json`` say the same thing again.

A run's ``suspects.json`` holds the drain commands of the policy that judged it. Re-judged under
today's rules (`results/rejudge.py`), its findings may no longer drain a host the old file drains
(a miss now called ``threshold; rerun``) or may drain one it lacks. Operator scripts and
``--gpucluster-drain`` read the file named ``suspects.json``, so that is the file rewritten, from
the re-judged findings (`burnin.drain.write_findings`): beside the results file (the run's own
file kept once, unchanged, as ``suspects.json.orig``), or, with ``--out DIR``, a new
``DIR/suspects.json`` beside the report it agrees with (the run's file untouched).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import (
    SUSPECTS_FILE,
    drain_list_due,
    listed_drain_commands,
    write_findings,
)
from pytest_gpucluster.results.baseline import RunResults
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.report import suspects_beside

__all__ = ["ORIGINAL_SUFFIX", "rejudge_drain_list"]

ORIGINAL_SUFFIX = ".orig"
"""``suspects.json.orig``: the drain list as the run wrote it, kept when the re-judged one replaces it."""


def _hosts(commands: list[list[str]]) -> str:
    return ", ".join(argv[2].removeprefix("NodeName=") for argv in commands) or "no host"


def rejudge_drain_list(run: RunResults, out_dir: Path) -> str | None:
    """Write the drain list of ``run``'s findings (``run`` as `rejudge` returned it) to
    ``out_dir/suspects.json`` (module docstring) and say what it drains against the run's. None
    when there is nothing to write: no drain list beside the run and no finding that drains."""
    results = Path(run.source)
    source = results.parent / SUSPECTS_FILE
    hosts = [str(h) for h in run.fingerprint.get("hosts") or ()]
    findings = [
        f.to_json() for f in findings_of(run.measurements, run.outcomes, hosts, suspects_beside(results))
    ]
    if not drain_list_due(source, findings):
        return None
    target = out_dir / SUSPECTS_FILE
    try:
        before = listed_drain_commands(source)
    except BurninError as exc:
        return f"drain list not re-judged: {exc}"
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = ""
    if source.exists():
        if target.resolve() == source.resolve():
            original = source.with_name(SUSPECTS_FILE + ORIGINAL_SUFFIX)
            if not original.exists():  # a second report keeps the run's file, not the first re-judged one
                shutil.copy2(source, original)
            kept = f"; the run's drain list is kept as {original}"
        else:
            shutil.copy2(source, target)
            kept = f"; the run's drain list {source} is unchanged"
    write_findings(target, findings)
    after = listed_drain_commands(target)
    change = "unchanged" if after == before else f"the run's drained {_hosts(before)}"
    return f"drain list re-judged: {target} drains {_hosts(after)} ({change}){kept}"
