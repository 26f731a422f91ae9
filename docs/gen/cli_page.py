"""The ``gpucluster`` command reference: every subcommand of ``cli.build_parser()`` (walked
recursively, so a registered subcommand appears by itself) and the ``profiles derive|check`` parsers
(``cli.build_profiles_command_parser``), each with its usage and arguments."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from docs.gen.md import GENERATED, cell, code, table

__all__ = ["render_cli"]

_WIDTH = 100
"""Usage lines are wrapped at a fixed width, whatever the terminal, so the page is reproducible."""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=_WIDTH)


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(help, parser) of every subcommand under ``parser``, depth first, in declaration order."""
    for action in parser._actions:  # argparse has no public walk of its tree
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield helps.get(name, ""), sub
                yield from _subcommands(sub)


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = _formatter
    return parser.format_usage().strip()


def _argument(action: argparse.Action) -> tuple[str, str]:
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0 and action.metavar is not None:
            name += f" {action.metavar}"
        elif action.nargs != 0:
            name += f" {action.dest.upper()}"
    else:
        name = action.metavar if isinstance(action.metavar, str) else action.dest
        if action.nargs in ("+", "*"):
            name += " ..."
        elif action.nargs == "?":
            name = f"[{name}]"
    text = (action.help or "").replace("%%", "%")
    if isinstance(action, argparse._AppendAction):
        text = (text + " (repeatable)").strip()
    if action.required and action.option_strings:
        text = (text + " (required)").strip()
    return code(name), cell(text)


def _section(title: str, help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    out = [f"## `{title}`\n"]
    if help_text:
        out.append(cell(help_text.replace("%%", "%")) + "\n")
    if parser.description and parser.description != help_text:
        out.append(cell(parser.description) + "\n")
    out.append(f"```\n{_usage(parser)}\n```\n")
    rows = [
        _argument(a)
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    if rows:
        out.append(table(("argument", "meaning"), rows))
    return out


def render_cli() -> str:
    from pytest_gpucluster import cli

    root = cli.build_parser()
    out = [
        GENERATED,
        "# The `gpucluster` command\n",
        cell(root.description or "")
        + " Errors the user can fix (a bad file, an unknown profile, no data) print one sentence and "
        "exit 2, never a traceback.\n",
        f"```\n{_usage(root)}\n```\n",
    ]
    for help_text, parser in _subcommands(root):
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) and not [
            a
            for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]:
            out += [f"## `{parser.prog}`\n", cell(help_text) + "\n", f"```\n{_usage(parser)}\n```\n"]
            continue
        out += _section(parser.prog, help_text, parser)
        if parser.prog == "gpucluster profiles":
            for word in cli.PROFILE_COMMANDS:
                sub = cli.build_profiles_command_parser(word)
                out += _section(sub.prog, "", sub)
    return "\n".join(out)
