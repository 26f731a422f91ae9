"""Options of the burn-in: the soak duration (the store-true ``--gpucluster-drain`` flag is declared
with the other flags in `options`).

Part of the option table that `options` assembles; must not import pytest.
"""

from __future__ import annotations

from pytest_gpucluster.options.spec import Option


def _soak_duration(text: str) -> float:
    """``"10m"``, ``"10min"``, ``"90s"``, ``"1h"`` or a bare number of seconds -> seconds."""
    from pytest_gpucluster.profiles.quantities import parse_duration

    value = text.strip()
    if value.replace(".", "", 1).isdigit():
        value += "s"
    elif value.endswith("m") and value[:-1].replace(".", "", 1).isdigit():
        value += "in"  # "10m" is minutes here: a soak is never measured in metres or milliseconds
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise ValueError(f"expected a duration such as 10m, 90s or 1h, got {text!r}") from None
    if seconds <= 0:
        raise ValueError(f"expected a positive duration such as 10m, got {text!r}")
    return seconds


SOAK = Option(
    "--gpucluster-soak",
    "soak",
    "burn-in soak: repeat the gated collectives for this long (e.g. 10m, 90s, 1h) and gate the lowest "
    "busbw and its variation over the window (acceptance/test_fabric.py::test_soak)",
    None,
    _soak_duration,
    "DURATION",
)
