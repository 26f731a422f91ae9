"""The reference pages of the docs site, generated from the code so they cannot drift from it.

``python -m docs.gen`` writes them (``docs/reference/*.md``, committed); ``python -m docs.gen --check``
exits 1 naming the stale ones. ``tests/unit/test_docs_reference.py`` renders them in memory and
fails when a committed page differs, so a new option, profile key, finding action or subcommand
cannot land without its reference page.

Each page is a pure function of the package's tables (no I/O but importing the package and reading
its shipped profiles): the option table (``options``), the profile schema and the fail-closed owner
table (``profiles.schema``, ``checks.fail_closed``), the findings' reason classes and action ladder
(``results.findings``), the ``gpucluster`` argparse tree (``cli``) and the part profiles' floors
(``profiles.part_rules`` over ``thresholds/devices.yaml``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from docs.gen.cli_page import render_cli
from docs.gen.findings_page import render_findings
from docs.gen.floors_page import render_part_floors
from docs.gen.options_page import render_options
from docs.gen.profile_page import render_profile_keys

__all__ = ["COMMAND", "DOCS", "PAGES", "render_all", "stale_pages", "write_all"]

DOCS = Path(__file__).resolve().parent.parent
"""The docs/ directory (the site's ``docs_dir``)."""

COMMAND = "python -m docs.gen"
"""The one command that regenerates every reference page (run from the repository root)."""

PAGES: dict[str, Callable[[], str]] = {
    "reference/options.md": render_options,
    "reference/profile-keys.md": render_profile_keys,
    "reference/findings.md": render_findings,
    "reference/cli.md": render_cli,
    "reference/part-floors.md": render_part_floors,
}
"""Each generated page (relative to docs/) and the function that renders it."""


def render_all() -> dict[str, str]:
    """Every generated page's text, by its path relative to docs/."""
    return {path: re.sub(r"\n{3,}", "\n\n", render()).rstrip("\n") + "\n" for path, render in PAGES.items()}


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The generated pages whose committed text differs from what the code renders now."""
    stale = []
    for path, text in render_all().items():
        file = docs / path
        if not file.is_file() or file.read_text(encoding="utf-8") != text:
            stale.append(path)
    return stale


def write_all(docs: Path = DOCS) -> list[str]:
    """Write every generated page; return the paths that changed."""
    changed = []
    for path, text in render_all().items():
        file = docs / path
        if file.is_file() and file.read_text(encoding="utf-8") == text:
            continue
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
        changed.append(path)
    return changed
