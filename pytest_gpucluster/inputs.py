"""The recorded files a session reads instead of launching (``--nccl-log``, ``--train-log``).

A pattern with ``*``, ``?`` or ``[`` is a glob (``**`` recursive), any other a path; both are
read from the directory pytest was started in. A pattern that names no file is a
`SettingsError` saying where it looked. No pytest, no torch.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from pytest_gpucluster.errors import SettingsError

__all__ = ["expand", "read_texts"]


def expand(option: str, pattern: str, root: Path) -> list[Path]:
    """Every file ``pattern`` names, sorted; SettingsError when it names none."""
    path = Path(pattern).expanduser()
    if any(c in pattern for c in "*?["):
        matches = sorted(glob.glob(str(path), root_dir=root, recursive=True))
        if not matches:
            raise SettingsError(f"{option} {pattern}: no file matches (looked from {root})")
        return [root / m for m in matches]
    if not (root / path).is_file():
        raise SettingsError(f"{option} {pattern}: no such file (looked from {root})")
    return [root / path]


def read_texts(option: str, patterns: Sequence[str], root: Path) -> list[tuple[str, str]]:
    """``(name, text)`` of every file the patterns name, once each, in the order given; the name is
    the path as matched from ``root``."""
    named: dict[str, str] = {}
    for pattern in patterns:
        for path in expand(option, pattern, root):
            name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
            if name not in named:
                try:
                    named[name] = path.read_text(encoding="utf-8", errors="replace")
                except OSError as exc:
                    raise SettingsError(f"{option} {path}: {exc.strerror or exc}") from None
    return list(named.items())
