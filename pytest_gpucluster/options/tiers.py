"""Options of the tiers: the session's time budget (``--gpucluster-budget``).

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.burnin import _soak_duration
from pytest_gpucluster.options.spec import Option


def _budget(text: str) -> float:
    """``"30m"``, ``"2h"``, ``"90s"`` or a bare number of seconds -> seconds."""
    return _soak_duration(text)


BUDGET = Option(
    "--gpucluster-budget",
    "budget",
    "refuse to start when the plan's estimated wall time (the dry run's total) exceeds this "
    "(e.g. 30m, 2h), naming the jobs that cost most",
    None,
    _budget,
    "DURATION",
)
