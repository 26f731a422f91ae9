"""`netns_bed`: a testbed that cannot be made is a skip (or a reason) naming what is missing."""

from __future__ import annotations

import re

import netns_bed
import pytest

from pytest_gpucluster.testbed.netns import NetnsUnavailable

REASON = "network namespaces cannot be created here (ip: Operation not permitted)"


def _unavailable(nodes: int, **options: object) -> None:
    raise NetnsUnavailable(REASON)


def test_a_testbed_that_cannot_be_made_skips_with_the_reason_it_gave(monkeypatch):
    monkeypatch.setattr(netns_bed, "create_testbed", _unavailable)
    skipped = pytest.raises(pytest.skip.Exception, match=re.escape(REASON))
    with skipped, netns_bed.netns_bed_or_skip(2, controller=True):
        raise AssertionError("the block must not run without a testbed")


def test_testbed_or_reason_hands_the_reason_to_a_test_that_falls_back(monkeypatch):
    monkeypatch.setattr(netns_bed, "create_testbed", _unavailable)
    with netns_bed.netns_bed_or_reason(4) as bed:
        assert bed == REASON


def test_the_options_reach_create_testbed_and_the_testbed_is_closed_after_the_block(monkeypatch):
    seen: list[tuple[int, dict]] = []

    class Bed:
        closed = False

        def __enter__(self):
            return self

        def __exit__(self, *exc: object) -> None:
            self.closed = True

    made = Bed()

    def create(nodes: int, **options: object) -> Bed:
        seen.append((nodes, options))
        return made

    monkeypatch.setattr(netns_bed, "create_testbed", create)
    with netns_bed.netns_bed_or_skip(2, controller=True, rates={1: "20mbit"}) as bed:
        assert bed is made and not made.closed
    assert made.closed
    assert seen == [(2, {"controller": True, "rates": {1: "20mbit"}})]
