"""The acceptance suite needs nothing but the plugin (installed via its pytest11 entry point).

Two rules for the burn-in tests (test_burnin.py), both here because they concern the whole run:

- The ECC/XID counters are read first and last: ``test_counters_before`` is moved to the front of
  the run and ``test_counters_after`` to its end, so that together they bracket every other test.
  (Under pytest-xdist each worker brackets only its own share of the tests.)
- The slow burn-in parts, marked ``@pytest.mark.burnin(slow=True)`` (the pairwise localization,
  about n/2 + 2 jobs), run only when ``-m`` names burnin: ``pytest acceptance/ -m burnin``. A plain
  ``pytest acceptance/`` deselects them and says so in the header.
"""

from __future__ import annotations

import pytest

FIRST = "test_burnin.py::test_counters_before"
LAST = "test_burnin.py::test_counters_after"
_DESELECTED = pytest.StashKey[int]()


def _slow_burnin(item: pytest.Item) -> bool:
    return any(mark.kwargs.get("slow") for mark in item.iter_markers("burnin"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "burnin" not in (config.getoption("markexpr", "") or ""):
        slow = [item for item in items if _slow_burnin(item)]
        if slow:
            items[:] = [item for item in items if not _slow_burnin(item)]
            config.hook.pytest_deselected(items=slow)
            config.stash[_DESELECTED] = len(slow)
    first = [item for item in items if item.nodeid.endswith(FIRST)]
    last = [item for item in items if item.nodeid.endswith(LAST)]
    if first or last:
        middle = [item for item in items if item not in first and item not in last]
        items[:] = first + middle + last


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    count = config.stash.get(_DESELECTED, 0)
    if not count:
        return []
    return [
        f"gpucluster: {count} slow burn-in test(s) (pairwise localization) deselected; run them with -m burnin"
    ]
