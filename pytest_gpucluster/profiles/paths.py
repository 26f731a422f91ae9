"""Where the shipped thresholds live (``thresholds/`` in a checkout, ``pytest_gpucluster/thresholds``
in a wheel).

A leaf module: the standard library only, so that both the loader and the device table can ask
for the directory without importing each other.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["shipped_thresholds_dir"]


def shipped_thresholds_dir(package_dir: Path | None = None) -> Path:
    """The shipped profiles: ``pytest_gpucluster/thresholds`` in an installed wheel, the top-level
    ``thresholds/`` in a checkout (and an editable install)."""
    package_dir = package_dir or Path(__file__).resolve().parents[1]
    installed = package_dir / "thresholds"
    if installed.is_dir():
        return installed
    return package_dir.parent / "thresholds"
