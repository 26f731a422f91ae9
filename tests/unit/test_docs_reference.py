"""The documentation cannot drift from the code: the generated reference pages are current, they
name every option, profile key, finding action and subcommand, every page is in the site's nav,
and the README keeps its two commands on one screen."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from docs.gen import COMMAND, DOCS, PAGES, render_all, stale_pages
from docs.gen.profile_page import walk

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ACCEPTANCE_COMMAND = "python -m pip install torch==2.13.0 -e '.[test]' && python -m pytest acceptance/"
TEST_COMMAND = (
    "bash .ci/install-system-deps && python -m pip install torch==2.13.0 -e '.[test]' "
    "&& python -m pytest tests/ -n 2"
)


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_all()


def test_the_committed_reference_pages_are_what_the_code_generates(rendered: dict[str, str]) -> None:
    stale = [path for path, text in rendered.items() if _committed(path) != text]
    assert not stale, (
        f"stale generated docs page(s): {', '.join('docs/' + p for p in stale)}. An option, profile key, "
        f"finding action or subcommand changed without its reference page: run `{COMMAND}` from the "
        "repository root and commit the pages it writes."
    )


def _committed(path: str) -> str | None:
    file = DOCS / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def test_an_option_added_without_its_page_makes_the_pages_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gpucluster import options
    from pytest_gpucluster.options.spec import Option

    extra = Option("--gpucluster-new-knob", "new_knob", "a knob nobody documented yet", default=3)
    monkeypatch.setattr(options, "OPTIONS", (*options.OPTIONS, extra))
    assert "reference/options.md" in stale_pages()
    assert "GPUCLUSTER_NEW_KNOB" in PAGES["reference/options.md"]()


def test_the_options_page_names_every_option_with_its_env_ini_and_help(rendered: dict[str, str]) -> None:
    from pytest_gpucluster.options import OPTIONS

    page = rendered["reference/options.md"]
    for opt in OPTIONS:
        assert f"### `{opt.flag}" in page, opt.flag
        assert f"`{opt.env}`" in page and f"`{opt.ini}`" in page, opt.flag
    for switch in (
        "--gpucluster-dry-run",
        "--gpucluster-reap",
        "--gpucluster-retest-suspects",
        "--gpucluster-drain",
    ):
        assert f"### `{switch}`" in page


def test_the_profile_keys_page_names_every_schema_key_and_every_threshold_owner(
    rendered: dict[str, str],
) -> None:
    from pytest_gpucluster.checks.fail_closed import OWNERS
    from pytest_gpucluster.profiles.schema import ProfileModel

    page = rendered["reference/profile-keys.md"]
    keys = [k.key for k in walk(ProfileModel)]
    assert len(keys) > 100
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert not missing, missing
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for key in OWNERS:
        assert key in rows, key
        assert ".py::" in rows[key], f"{key}: no test named as its judge"
    assert "test_burnin.py::test_gpu_health" in rows["burnin.min_matmul"]
    assert "test_collectives.py::test_collective[…]" in rows["collectives.checks[].min_busbw"]


def test_the_findings_page_names_every_reason_class_and_rung(rendered: dict[str, str]) -> None:
    from pytest_gpucluster.results.findings import ACTIONS, LADDER, REASONS

    page = rendered["reference/findings.md"]
    for reason in REASONS:
        assert f"`{reason}`" in page
    for rung, action in enumerate(LADDER, start=1):
        assert f"| {rung} | `{action}` |" in page
        assert ACTIONS[action].split()[0] in page


def test_the_cli_page_names_every_subcommand(rendered: dict[str, str]) -> None:
    from pytest_gpucluster import cli

    page = rendered["reference/cli.md"]
    names = []

    def walk_parser(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    names.append(sub.prog)
                    walk_parser(sub)

    walk_parser(cli.build_parser())
    names += [f"gpucluster profiles {word}" for word in cli.PROFILE_COMMANDS]
    assert {"gpucluster health-check", "gpucluster history lemons", "gpucluster profiles derive"} <= set(
        names
    )
    missing = [n for n in names if f"## `{n}`" not in page]
    assert not missing, missing


def _nav_pages(nav: list) -> list[str]:
    out: list[str] = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    missing = sorted(set(pages) - set(nav))
    assert not missing, (
        f"docs page(s) not in the site's nav: {', '.join('docs/' + p for p in missing)}. Add each under "
        "`nav:` in mkdocs.yml (Tutorial, How-to guides, Explanation or Reference); `mkdocs build --strict` "
        "fails on it too."
    )
    assert sorted(set(nav) - set(pages)) == [], "mkdocs.yml's nav names page(s) that do not exist"
    assert set(PAGES) <= set(nav)


def test_the_readme_is_one_screen_or_two_and_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    lines = [line.strip() for line in text.splitlines()]
    assert ACCEPTANCE_COMMAND in lines and TEST_COMMAND in lines
    assert "pytest acceptance" in text  # the before-stop hook greps for it
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), f"README links to {target}, which does not exist"
