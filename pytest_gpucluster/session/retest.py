"""``--gpucluster-retest-suspects`` in a pytest session: after the main test loop, the tests whose
findings named a node to drain run again, on those nodes only and with the next longer tier's
durations (quick -> standard -> burnin, ``plans/tiers.py``), their values recorded as retests
(``results/retest.py`` decides which tests and judges the two measurements); the drain list
then keeps only the suspects the retest confirmed; ``--gpucluster-drain`` drains them at the
end of the session.

Called by `plugin.pytest_runtestloop`; runs items through pytest's own hooks (``item.ihook``),
and does not import pytest itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest import Session

    from pytest_gpucluster.plans.tiers import TierDurations
    from pytest_gpucluster.session.core import GpuClusterSession

__all__ = ["keep_confirmed", "retest_suspects"]


def retest_suspects(session: Session, gc: GpuClusterSession) -> None:
    """Run the tests that named a node to drain once more on those nodes (module docstring)."""
    from pytest_gpucluster.burnin.drain import SUSPECTS_FILE, read_suspects
    from pytest_gpucluster.results.retest import (
        RETEST_ATTEMPT,
        confirmed_hosts,
        plan_retest,
        retest_record,
        retest_rows,
    )

    recorder, hosts = gc.recorder, gc.hosts
    order = [item.nodeid for item in session.items]
    listed = [(s.node, s.source) for s in read_suspects(gc.results_dir / SUSPECTS_FILE) if s.drainable]
    plan = plan_retest(recorder.measurements, recorder.outcomes, hosts, order, listed)
    if not plan.hosts:
        return
    if session.config.pluginmanager.hasplugin("dsession"):  # pytest-xdist runs the tests elsewhere
        recorder.header["retest"] = {
            "suspects": list(plan.hosts),
            "note": "not retested: the run used pytest-xdist (-n); run without -n to retest suspects",
        }
        return
    first_tier, longer = gc.tier, _longer_tier(gc)
    line = plan.line()
    if first_tier is not None and longer is not None:
        line += f" with the {longer.tier} tier's durations (the run's: {first_tier.tier})"
    (gc.progress or print)(line)
    items = [item for item in session.items if item.nodeid in plan.test_ids]
    gc.retest_on(plan.hosts)
    recorder.attempt = RETEST_ATTEMPT
    gc.tier = longer
    try:
        for index, item in enumerate(items):
            following = items[index + 1] if index + 1 < len(items) else None
            item.ihook.pytest_runtest_protocol(item=item, nextitem=following)
    finally:
        recorder.attempt = 1
        gc.tier = first_tier
        gc.retest_on(())
    confirmed = confirmed_hosts(plan, recorder.measurements, recorder.outcomes, hosts)
    rows = retest_rows(recorder.measurements, plan.hosts, plan.reruns)
    record = retest_record(plan, rows, [i.nodeid for i in items], confirmed)
    if longer is not None:
        record["tier"] = longer.tier
    recorder.header["retest"] = record
    recorder.flush()
    keep_confirmed(gc, record["cleared"])


def _longer_tier(gc: GpuClusterSession) -> TierDurations | None:
    """The retest's durations: the next longer tier than the run's (quick -> standard -> burnin;
    burn-in stays burn-in), from the profile's ``tiers:`` section (`plans.tiers`)."""
    from pytest_gpucluster.plans.tiers import TIERS, tier_durations

    if gc.tier is None:
        return None
    longer = TIERS[min(TIERS.index(gc.tier.tier) + 1, len(TIERS) - 1)]
    return tier_durations(gc.profile.model, longer)


def keep_confirmed(gc: GpuClusterSession, cleared: list[str]) -> None:
    """The drain list without the suspects whose retest passed (``--gpucluster-drain`` drains
    what is left at the end of the session, `burnin.drain.drain_listed`)."""
    from pytest_gpucluster.burnin.drain import SUSPECTS_FILE, clear_suspects

    clear_suspects(gc.results_dir / SUSPECTS_FILE, cleared)
