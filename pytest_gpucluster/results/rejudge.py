"""Re-judge a results.json: the fail-closed verdict derived again from the evidence it records.

``gpucluster report RESULTS.json`` does not trust the verdict a run wrote: from the profile the run
used (``profile.model``; an older file: the profile file it names, else the shipped profile of that
name), the inventory its probe recorded (``nodes``) and its measurements and outcomes, it derives
the per-node, per-GPU fail-closed judgement again with today's rules (`checks/fail_closed.py`). So
a GPU the inventory lists and the measurements lack is NOT MEASURED in the report too, whoever
edited the file and whatever policy wrote it.

Reads one file's parsed content; writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_gpucluster.checks.fail_closed import FAIL_CLOSED_TEST_ID, Coverage, Inventory, coverage
from pytest_gpucluster.cluster.node_facts import ClusterFacts
from pytest_gpucluster.errors import GpuClusterError
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.profiles.snapshot import profile_of_snapshot
from pytest_gpucluster.results.baseline import RunResults
from pytest_gpucluster.results.model import Measurement, TestOutcome
from pytest_gpucluster.results.text import failure_message

__all__ = ["Rejudged", "profile_of_run", "rejudge"]


@dataclass(frozen=True, slots=True)
class Rejudged:
    """The run with its fail-closed checks derived again, and what was derived from."""

    run: RunResults
    coverage: Coverage | None
    note: str
    """Where the profile came from, or why the run could not be re-judged (then ``run`` is as read)."""


def profile_of_run(run: RunResults) -> tuple[ProfileModel, str]:
    """The profile ``run`` was judged under, and where it was read from."""
    recorded = run.profile.get("model")
    if isinstance(recorded, dict):
        return profile_of_snapshot(recorded, run.source), "the profile recorded in the results file"
    for candidate in (run.profile.get("path"), run.profile.get("name")):
        if not candidate:
            continue
        if "/" in str(candidate) and not Path(str(candidate)).is_file():
            continue
        try:
            return load_profile(str(candidate)).model, f"profile {candidate} (the file records no model)"
        except GpuClusterError:
            continue
    raise GpuClusterError(
        f"{run.source} names profile {run.profile.get('name')!r}, which is neither recorded in it nor found"
    )


def _soak_on(run: RunResults, settings: dict[str, Any]) -> bool:
    soak = (settings.get("gpucluster_soak") or {}).get("value")
    return bool(soak) or bool((run.tier or {}).get("soak_s"))


def rejudge(run: RunResults) -> Rejudged:
    """``run`` with its ``gpucluster::every-threshold-measured`` checks and outcome replaced by
    today's per-node, per-GPU judgement of its evidence."""
    try:
        model, source = profile_of_run(run)
    except GpuClusterError as exc:
        return Rejudged(run, None, f"not re-judged: {exc}")
    # a node the session set aside is named by its own finding, not NOT MEASURED again (as in the run)
    aside = {str(s.get("host", "")).split(".")[0] for s in (run.nodes_used or {}).get("set_aside") or ()}
    nodes = [n for n in run.nodes if str(n.get("host", "")).split(".")[0] not in aside]
    facts = ClusterFacts.from_json({"nodes": nodes, "source": "results.json"}) if nodes else None
    inventory = Inventory.of(model, facts, soak=_soak_on(run, run.settings))
    kept = tuple(m for m in run.measurements if m.test_id != FAIL_CLOSED_TEST_ID)
    outcomes = tuple(o for o in run.outcomes if o.test_id != FAIL_CLOSED_TEST_ID)
    found = coverage(model, kept, outcomes, inventory)
    time = max((m.time for m in kept), default=run.started_at or 0.0)
    closed = tuple(Measurement.of(c, test_id=FAIL_CLOSED_TEST_ID, time=time) for c in found.checks)
    if closed:
        where = ", ".join(
            dict.fromkeys(
                c.ref.key + (f" ({', '.join(str(v) for v in c.labels.values())})" if c.labels else "")
                for c in found.checks
                if c.ref is not None
            )
        )
        message = "\n".join(
            [f"NotMeasured: {len(closed)} threshold value(s) of the profile are missing: {where}"]
            + [f"  {failure_message(m)}" for m in closed]
        )
        outcomes += (TestOutcome(FAIL_CLOSED_TEST_ID, "failed", "not measured", 0.0, message[:2000]),)
    note = f"re-judged from the evidence under {source}: {len(found.checks)} value(s) not measured"
    return Rejudged(replace(run, measurements=kept + closed, outcomes=outcomes), found, note)
