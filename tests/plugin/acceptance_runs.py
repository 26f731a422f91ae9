"""Acceptance files run whole inside pytester, as a user runs them, and what their run recorded.

The plugin tests of an area copy ``acceptance/<area>.py`` into pytester's directory, run it in
process with ``--results-dir=<tmp_path>/res`` and read that run's results.json; this is that
routine once. Which machine the run sees (`node_fakes.use_machine`) stays with each test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

SESSION_ENV = ("GPUCLUSTER_HW", "_GPUCLUSTER_SESSION_RESULTS_DIR")
"""Set by an outer gpucluster session (or the user's shell): the inner run must not inherit them."""


def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "res"


def acceptance_run(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    files: Mapping[str, Path],
    *args: str,
    conftest: Path | None = None,
) -> Callable[..., pytest.RunResult]:
    """``run(*more_args)``: pytest in process over ``files`` (test module name -> the acceptance
    file it copies), with ``args`` and the results under `results_dir`."""
    for name in SESSION_ENV:
        monkeypatch.delenv(name, raising=False)
    if conftest is not None:
        pytester.makeconftest(conftest.read_text(encoding="utf-8"))
    pytester.makepyfile(**{name: path.read_text(encoding="utf-8") for name, path in files.items()})

    def run(*more: str) -> pytest.RunResult:
        return pytester.runpytest_inprocess(
            "-rs", "-p", "no:cacheprovider", *args, f"--results-dir={results_dir(tmp_path)}", *more
        )

    return run


def results(tmp_path: Path) -> dict:
    """The results.json of the last `acceptance_run`."""
    return json.loads((results_dir(tmp_path) / "results.json").read_text())


def measurements(tmp_path: Path) -> list[dict]:
    """The measurements the last `acceptance_run` recorded."""
    return results(tmp_path)["measurements"]
