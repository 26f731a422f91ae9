"""The acceptance suite needs nothing but the plugin (installed via its pytest11 entry point).

The burn-in tests (test_burnin.py) share the session's suspect list (``burnin_suspects``, written to
suspects.json as suspects are found, listed and drained at the end) and ``judge``, which adds a
test's suspects to it and records its checks. Two rules for them concern the whole run:

- The ECC/XID counters and the fabric ports are read first and last: ``test_counters_before`` and
  ``test_fabric_before`` are moved to the front of the run, ``test_counters_after`` and
  ``test_fabric_after`` to its end, so that together they bracket every other test (the soak
  included). (Under pytest-xdist each worker brackets only its own share of the tests.) A before
  test hands its reading to the later tests through the results directory (the ``handoff``
  fixture, ``results/handoff.py``), never pytest's stash, which one process alone sees: the
  fabric before-scan reaches test_pairwise_localization in whichever worker each runs.
- The slow burn-in parts, marked ``@pytest.mark.burnin(slow=True)`` (the pairwise localization,
  about n/2 + 2 jobs), run only when ``-m`` names burnin: ``pytest acceptance/ -m burnin``. A plain
  ``pytest acceptance/`` deselects them and says so in the header (the plugin does, with the
  other tier rules: plugin.py, plans/tiers.py).
- Under a CUDA profile every burn-in test, and every test of a module that sets
  ``NEEDS_CUDA_UNDER_CUDA_PROFILE = True`` (test_numerics.py), needs CUDA on the nodes (``gpucluster(needs=["cuda"])``):
  their jobs take a GPU per rank, and nodes whose torch cannot use one are named in the skip.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pytest_gpucluster.burnin.drain import Suspect, SuspectLog
from pytest_gpucluster.results.model import Check

FIRST = ("test_burnin.py::test_counters_before", "test_fabric.py::test_fabric_before")
LAST = ("test_burnin.py::test_counters_after", "test_fabric.py::test_fabric_after")


def _cuda_profile(config: pytest.Config) -> bool:
    from pytest_gpucluster.session import SESSION_KEY

    session = config.stash.get(SESSION_KEY, None)
    return session is not None and session.profile.model.cluster.device == "cuda"


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n N`` (pytest-xdist's ``--dist load``), distribute by ``loadgroup``: the same
    as ``load`` except that the tests of one ``xdist_group`` run in one worker, in order, so each
    before/after pair (counters; fabric ports with the pairwise burn-in) runs its before test
    first. The readings go through the results directory, so a split pair still joins (the later
    test waits for a selected before test's record); a before test not in the run, or one that
    failed, makes the later one fail NOT MEASURED saying why: never a silent skip."""
    # the mark is pytest-xdist's; declared here too, for runs without xdist (-p no:xdist)
    config.addinivalue_line("markers", "xdist_group(name): run the tests of one group in one xdist worker")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a worker re-reads the command line, which says only -n: tell it
        if workerinput.get("gpucluster_loadgroup"):
            config.option.loadgroup = True  # xdist's worker then suffixes grouped node ids with @group
    elif getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, per worker: say that the run distributes by loadgroup."""
    if node.config.getvalue("dist") == "loadgroup":
        node.workerinput["gpucluster_loadgroup"] = True


def _nodeid(item: pytest.Item) -> str:
    """The node id without the ``@group`` pytest-xdist's loadgroup appends."""
    nodeid = item.nodeid
    return nodeid.rsplit("@", 1)[0] if "@" in nodeid and not nodeid.endswith("]") else nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_profile(config):
        for item in items:
            module = getattr(item, "module", None)
            if item.get_closest_marker("burnin") is not None or getattr(
                module, "NEEDS_CUDA_UNDER_CUDA_PROFILE", False
            ):
                item.add_marker(pytest.mark.gpucluster(needs=["cuda"]))
    first = [item for item in items if _nodeid(item).endswith(FIRST)]
    last = [item for item in items if _nodeid(item).endswith(LAST)]  # str.endswith takes a tuple
    if first or last:
        middle = [item for item in items if item not in first and item not in last]
        items[:] = first + middle + last


@pytest.fixture(scope="session")
def burnin_suspects(gpucluster_session: Any) -> Iterator[SuspectLog]:
    suspects = SuspectLog(gpucluster_session.results_dir)
    yield suspects
    # --gpucluster-drain drains at the end of the session, after any retest and the findings
    suspects.finish(gpucluster_session.progress or print)


@pytest.fixture
def judge(results: Any, burnin_suspects: SuspectLog, request: pytest.FixtureRequest) -> Any:
    """``judge(checks, suspects, remeasure=None)``: the suspects to the drain list, then every
    check to results (``remeasure``: how the regression gate measures a suspect again)."""

    def judge(checks: list[Check], suspects: Sequence[Suspect] = (), remeasure: Any = None) -> None:
        __tracebackhide__ = True
        burnin_suspects.add(suspects, request.node.nodeid)
        results.check_all(checks, remeasure=remeasure)

    return judge
