"""Stage 5 of the session's start: the preflight's findings -> the nodes the session runs on
(`NodeSplit`), and whether it stops before launch.

Today's rule (``--gpucluster-strict-nodes``' rule): any error finding stops the session before
the first job; `stop_outcome` is the failed outcome the plugin records in place of the tests.

Plain values in and out (no pytest); imports nothing else of `session/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpucluster.cluster.preflight import PreflightFinding
from pytest_gpucluster.results.model import PREFLIGHT_TEST_ID, TestOutcome

__all__ = ["NodeSplit", "split_nodes", "stop_outcome"]


@dataclass(frozen=True, slots=True)
class NodeSplit:
    """The nodes the session runs on and why it stops before launch (None: it does not)."""

    usable: tuple[str, ...]
    stop: str | None = None


def split_nodes(hosts: Sequence[str], findings: Sequence[PreflightFinding]) -> NodeSplit:
    """Every node usable; an error finding stops the session (module docstring)."""
    errors = [f.message for f in findings if f.severity == "error"]
    if not errors:
        return NodeSplit(tuple(hosts))
    message = f"preflight: {len(errors)} finding(s), nothing launched: " + "; ".join(errors)
    return NodeSplit(tuple(hosts), message[:2000])


def stop_outcome(split: NodeSplit | None) -> TestOutcome | None:
    """The failed outcome standing for the tests a stopping session does not run; None when it runs."""
    if split is None or split.stop is None:
        return None
    return TestOutcome(PREFLIGHT_TEST_ID, "failed", "infrastructure", 0.0, split.stop)
