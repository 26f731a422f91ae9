"""The documentation site as a reader gets it: `mkdocs build --strict` of this checkout, opened
from file:// in headless Chromium. The home page, the tutorial and the options reference render
with their headings, every internal link and image of theirs leads to a page (and an anchor)
that exists, and a screenshot of each is a drawn page, not a blank one."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from pytest_gpucluster.testbed.chromium import CHROMIUM, headless_flags

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
        reason="mkdocs and mkdocs-material are not installed: python -m pip install -e '.[docs]'",
    ),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (.ci/install-system-deps)"),
]

PAGES = {
    "index.html": ("pytest-gpucluster", ["Where to start", "Two commands on a fresh machine"]),
    "tutorial/first-acceptance.html": (
        "First acceptance of a new cluster",
        [
            "1. On the login node: install and choose a profile",
            "2. The dry run: what will run, and how long it takes",
            "3. The quick tier: every node on its own, in minutes",
            "4. The standard run: the acceptance run",
            "5. The burn-in: hours of load, soak and localization",
            "6. The sign-off report",
            "7. Keep the baseline",
        ],
    ),
    "reference/options.html": ("Options", ["Options with a value", "Switches", "Markers"]),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


@pytest.fixture(scope="module")
def opened(site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """Each page opened once in headless Chromium: its DOM after the scripts ran, and a screenshot."""
    tmp = tmp_path_factory.mktemp("chromium")
    out = {}
    for name in PAGES:
        png = tmp / (name.replace("/", "-") + ".png")
        argv = [
            str(CHROMIUM),
            *headless_flags(1280, 900),
            "--virtual-time-budget=3000",  # the theme's scripts run before the DOM is dumped and drawn
            f"--user-data-dir={tmp / 'profile'}",
            f"--screenshot={png}",
            "--dump-dom",
            (site / name).as_uri(),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        out[name] = (done.stdout, png)
    return out


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def _headings(dom: str, level: int) -> list[str]:
    found = re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", dom, flags=re.S)
    return [_text(h).rstrip("¶").strip() for h in found]


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def _broken_links(site: Path, page: Path, dom: str) -> list[str]:
    broken = []
    for attr, target in re.findall(r'\b(href|src)="([^"]+)"', dom):
        parts = urlsplit(html.unescape(target))
        if parts.scheme in ("http", "https", "data", "mailto", "javascript") or (
            parts.scheme == "file" and not parts.path.startswith(str(site))
        ):
            continue
        path = Path(unquote(parts.path)) if parts.scheme == "file" else (page.parent / unquote(parts.path))
        if parts.path == "":
            path = page
        path = path.resolve()
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            broken.append(f"{attr}={target}: no {path}")
        elif parts.fragment and path.suffix == ".html" and parts.fragment not in _ids(path):
            broken.append(f"{attr}={target}: no id {parts.fragment!r} in {path.name}")
    return broken


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_renders_with_its_headings_and_no_broken_internal_link(
    site: Path, opened: dict[str, tuple[str, Path]], name: str
) -> None:
    dom, _ = opened[name]
    title, sections = PAGES[name]
    assert _headings(dom, 1) == [title]
    h2 = _headings(dom, 2)
    assert [s for s in sections if s not in h2] == [], h2
    assert 'class="md-nav' in dom and "Reference" in dom  # the theme's navigation was drawn
    # and its scripts ran from file:// (the built page says class="no-js"; the theme's script replaces it)
    assert re.search(r'<html[^>]*class="[^"]*\bjs\b', dom)
    assert _broken_links(site, site / name, dom) == []
    links = re.findall(r'href="([^"#:]+\.html)', dom)
    assert len(links) > 20  # the nav and the page's own links were all checked above


@pytest.mark.parametrize("name", list(PAGES))
def test_a_screenshot_of_the_page_is_a_drawn_page(opened: dict[str, tuple[str, Path]], name: str) -> None:
    pil = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshots (it comes with matplotlib)")
    _, png = opened[name]
    with pil.open(png) as image:
        rgb = image.convert("RGB")
    assert rgb.size == (1280, 900)
    colours = rgb.getcolors(maxcolors=1 << 16)
    # a blank or unstyled page has a handful of colours; text, the header bar and code spans many
    assert colours is None or len(colours) > 50, f"{name}: {len(colours)} colours"
    assert rgb.getpixel((640, 10)) != (255, 255, 255), (
        f"{name}: no header bar, the theme's stylesheet did not load"
    )


def test_the_link_checker_names_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text('<h2 id="here">Here</h2>', encoding="utf-8")
    page = tmp_path / "index.html"
    dom = '<a href="a.html#here">ok</a><a href="a.html#gone">anchor</a><a href="b.html">page</a>'
    broken = _broken_links(tmp_path, page, dom)
    assert [b.split(":")[0] for b in broken] == ["href=a.html#gone", "href=b.html"]
