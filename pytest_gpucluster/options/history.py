"""Options of the run history: the SQLite store every run appends to at session end.

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.spec import Option, user_path

HISTORY = Option(
    "--gpucluster-history",
    "history",
    "SQLite history store this run is appended to at session end (created if missing); read by "
    "`gpucluster history`, by --baseline history:N, and by the plan, which counts the job times of "
    "its newest run of the same profile and tier",
    None,
    user_path,
    "PATH",
)
