"""The options reference: every option ``pytest_gpucluster.options.add_options`` declares.

The page is rendered from what ``add_options`` actually declares to a recording stand-in of pytest's
parser, so a flag added beside the option table (``--gpucluster-dry-run`` and the other switches) is
listed too; options of the table (`options.OPTIONS`) also show their environment variable, ini key
and default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from docs.gen.md import GENERATED, cell, code, table

__all__ = ["render_options"]


@dataclass
class _Group:
    name: str
    description: str
    options: list[tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=list)

    def addoption(self, *flags: str, **attrs: Any) -> None:
        self.options.append((flags, attrs))


@dataclass
class _RecordingParser:
    """Stands in for ``pytest.Parser``: records what ``add_options`` declares."""

    groups: dict[str, _Group] = field(default_factory=dict)
    inis: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)

    def getgroup(self, name: str, description: str = "") -> _Group:
        return self.groups.setdefault(name, _Group(name, description))

    def addini(self, name: str, help: str, **attrs: Any) -> None:
        self.inis[name] = (help, attrs)


def _default(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, tuple):
        return code(" ".join(map(str, value))) if value else "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    return code(str(value))


def render_options() -> str:
    from pytest_gpucluster.options import OPTIONS, add_options

    parser = _RecordingParser()
    add_options(parser)  # type: ignore[arg-type]
    table_opts = {opt.dest: opt for opt in OPTIONS}
    out = [
        GENERATED,
        "# Options\n",
        "Every option of the plugin, as `pytest --help` lists them under *GPU cluster acceptance*. "
        "An option with a value is also an environment variable and an ini key (in "
        "`[tool.pytest.ini_options]` of `pyproject.toml`, or `pytest.ini`): the command line wins, then "
        "the environment, then the ini file, then the default; the run's header and results.json say "
        "where each value came from. A repeatable option takes several values from the environment "
        "separated by the path separator (`:`), and one per line from the ini file.\n",
    ]
    for group in parser.groups.values():
        valued: list[str] = []
        switches: list[str] = []
        for flags, attrs in group.options:
            opt = table_opts.get(attrs.get("dest", ""))
            if opt is None:
                switches.append(f"### `{' '.join(flags)}`\n\n{cell(attrs.get('help', ''))}\n")
                continue
            title = f"{opt.flag} {opt.metavar}" if opt.metavar else opt.flag
            facts = [
                f"environment {code(opt.env)}",
                f"ini key {code(opt.ini)}",
                f"default {_default(opt.default)}",
            ]
            if opt.multiple:
                facts.append("repeatable")
            valued.append(f"### `{title}`\n\n{cell(opt.help)}\n\n<small>{' · '.join(facts)}</small>\n")
        out.append("## Options with a value\n")
        out += valued
        if switches:
            out.append("## Switches\n")
            out.append("Command line only (no environment variable or ini key): each is off unless given.\n")
            out += switches
    from pytest_gpucluster.plugin import MARKERS

    out.append(
        "\n## Markers\n\nThe plugin registers these markers (`pytest --markers`). The tiers are chosen "
        "with `-m`: see [Tiers](../explanation/tiers.md).\n\n"
    )
    out.append(
        table(
            ("marker", "what it means"),
            ((code(m.partition(": ")[0]), cell(m.partition(": ")[2])) for m in MARKERS),
        )
    )
    return "\n".join(out)
