"""The testbed's pure parts: link rates (bits only), tbf arguments, unique names."""

from __future__ import annotations

import pytest

from pytest_gpucluster.testbed.netns import default_tag, parse_rate, tbf_args


@pytest.mark.parametrize(
    ("text", "bits"),
    [("100mbit", 100_000_000), ("2.5gbit", 2_500_000_000), ("800kbit", 800_000), ("70Mbit", 70_000_000),
     (" 1gbit ", 10**9), ("12345", 12345), (64_000, 64_000)],
)  # fmt: skip
def test_rates_in_bits_per_second(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["100mbps", "fast", "-5mbit", "0", "1e9", "", True])
def test_a_rate_that_is_not_bits_per_second_is_refused(text):
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_tbf_keeps_a_full_frame_in_the_bucket_and_5_ms_at_high_rates():
    assert tbf_args("20mbit") == ["tbf", "rate", "20000000bit", "burst", "32768", "latency", "100ms"]
    assert tbf_args("10gbit")[4] == str(10**10 // 8 // 200)
    # A queue made to overflow: the bucket and the queue given in bytes.
    assert tbf_args("1mbit", burst=1024, limit=1024) == [
        "tbf",
        "rate",
        "1000000bit",
        "burst",
        "1024",
        "limit",
        "1024",
    ]


def test_tags_are_unique_and_name_the_worker_and_process(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    first, second = default_tag(), default_tag()
    assert first != second and first.startswith("g3p")
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert default_tag().startswith("gmp")
