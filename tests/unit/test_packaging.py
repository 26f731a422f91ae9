"""The wheel ships every package of the plugin: pyproject lists packages by hand (the thresholds are
mapped in as a package of their own), so a new sub-package that is not listed would import from a
checkout and fail from an installed wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_with_an_init_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "pytest_gpucluster").rglob("__init__.py")
    }
    assert on_disk - listed == set(), "packages missing from [tool.setuptools] packages in pyproject.toml"
