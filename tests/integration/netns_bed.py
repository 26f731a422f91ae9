"""Network-namespace test beds for integration tests: made, handed over, removed.

`netns_bed_or_skip` is what a test that needs namespace "nodes" uses: the testbed for the block,
or a skip whose reason is `NetnsUnavailable`'s message (what is missing here: root, ``ip``,
``tc``, ...). `netns_bed_or_reason` is the same without the skip, for a test that falls back to
something else where namespaces cannot be made. Either way the testbed is closed when the block
ends, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from pytest_gpucluster.testbed.netns import NetnsTestbed, NetnsUnavailable, create_testbed


@contextlib.contextmanager
def netns_bed_or_reason(nodes: int, **options: object) -> Iterator[NetnsTestbed | str]:
    """`create_testbed(nodes, **options)` for the block, or the reason it cannot be made here."""
    try:
        bed = create_testbed(nodes, **options)  # type: ignore[arg-type]
    except NetnsUnavailable as exc:
        yield str(exc)
        return
    with bed:
        yield bed


@contextlib.contextmanager
def netns_bed_or_skip(nodes: int, **options: object) -> Iterator[NetnsTestbed]:
    """`create_testbed(nodes, **options)` for the block; skips the test, naming what is missing."""
    with netns_bed_or_reason(nodes, **options) as bed:
        if isinstance(bed, str):
            pytest.skip(bed)
        yield bed
