"""Headless Chromium as this project's tests and benchmarks start it to open a report.

These flags keep Chromium off the network (this machine has none: without them it retries lookups
and background fetches at every start) and out of any earlier profile; the caller adds a fresh
``--user-data-dir`` and what to do (``--dump-dom``, ``--screenshot``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHROMIUM", "headless_flags"]

CHROMIUM = Path("/usr/bin/chromium")


def headless_flags(width: int = 1400, height: int = 900) -> tuple[str, ...]:
    return (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--window-size={width},{height}",
    )
