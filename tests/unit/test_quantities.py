import pytest

from pytest_gpucluster.profiles.quantities import (
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
    parse_fraction,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("115GB/s", 115e9),
        ("920Gbps", 115e9),  # seed 002's 920 Gbps is 115 GB/s
        ("400Gb/s", 50e9),  # bits
        ("26.562 GB/s", 26.562e9),
        ("1.5GiB/s", 1.5 * 2**30),
        ("100Mbps", 12.5e6),
    ],
)
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64MiB", 64 * 2**20), ("16GB", 16e9), ("1KiB", 1024), ("8", 8), (4096, 4096), ("32GB", 32e9)],
)
def test_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("7.8s", 7.8), ("50us", 50e-6), ("3ms", 3e-3), ("2min", 120), ("10µs", 1e-5)]
)
def test_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


def test_flops_and_fraction():
    assert parse_flops("989TFLOP/s") == pytest.approx(989e12)
    assert parse_fraction("92%") == pytest.approx(0.92)
    assert parse_fraction(0.5) == 0.5


@pytest.mark.parametrize(
    ("parser", "text", "fragment"),
    [
        (parse_bandwidth, "100", "no unit"),
        (parse_bandwidth, "-3GB/s", "non-negative"),
        (parse_bandwidth, "12 parsecs", "unknown unit"),
        (parse_duration, "fast", "such as '50us'"),
        (parse_bytes, "64 MiBs", "unknown unit"),
        (parse_fraction, "-5%", "non-negative"),
        (parse_bandwidth, True, "such as"),
    ],
)
def test_bad_quantities_say_what_was_expected(parser, text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parser(text)
