"""Records the failing runs of tests/data/history: the health job's rank 1 is made slow.

``pytest acceptance/ -p tests.data.history.slow_rank_plugin`` makes rank 1 of every health job
sleep ``GPUCLUSTER_TEST_SLOW_RANK_S`` (default 0.02 s) inside each timed iteration, through the
health workload's own ``slow_ranks`` option (a synthetic straggler, as the burn-in self-test
uses): the real checks then judge a real slow rank. With ``GPUCLUSTER_TEST_SLOW_TESTS=N`` only
the health jobs of the first N tests set up are slowed (a transient slowdown: a retest of the
suspect, which sets its test up again, runs unslowed); a plan built before any test is set up
is slowed too, which launches nothing.
"""

from __future__ import annotations

import dataclasses
import os

from pytest_gpucluster.plans import burnin

_health_part = burnin.health_part
_set_up = [0]


def pytest_runtest_setup(item):  # type: ignore[no-untyped-def]
    _set_up[0] += 1


def _slow_health_part(*args, **kwargs):  # type: ignore[no-untyped-def]
    part = _health_part(*args, **kwargs)
    limit = os.environ.get("GPUCLUSTER_TEST_SLOW_TESTS")
    if limit is not None and _set_up[0] > int(limit):
        return part
    delay = float(os.environ.get("GPUCLUSTER_TEST_SLOW_RANK_S", "0.02"))
    return dataclasses.replace(part, options={**part.options, "slow_ranks": {"1": delay}})


burnin.health_part = _slow_health_part
