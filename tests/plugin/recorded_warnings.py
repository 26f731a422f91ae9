"""The warnings an in-process pytester run recorded, by category.

``assert_outcomes(warnings=N)`` counts every warning of the run, including those the environment
adds (a ``PytestAssertRewriteWarning`` for a plugin module some earlier test in the same worker
had already imported, a ``DeprecationWarning`` from an installed package): a test about the
plugin's own warnings asserts on those alone.
"""

from __future__ import annotations

from typing import Any

from pytest_gpucluster.errors import GpuClusterWarning


def warnings_of(result: Any, category: type[Warning] = GpuClusterWarning) -> list[str]:
    """The messages of the warnings of ``category`` that the run ``result`` recorded
    (``pytester.runpytest_inprocess``'s result, whose ``reprec`` saw every warning)."""
    calls = result.reprec.getcalls("pytest_warning_recorded")
    return [
        str(call.warning_message.message)
        for call in calls
        if issubclass(call.warning_message.category, category)
    ]
