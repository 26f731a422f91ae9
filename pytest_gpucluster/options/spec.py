"""What one gpucluster option is (`Option`), a resolved value with its source (`Setting`), and the
value parsers several subjects share.

The option table itself is split by subject (`options.cluster`, `options.launch`, `options.files`,
`options.gate`, `options.burnin`); the package's `__init__` puts it together, declares it to pytest
and resolves it. This module, like the subject modules, must not import pytest: only `__init__` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    value: T
    source: str
    """'command line', 'environment GPUCLUSTER_X', 'ini key gpucluster_x' or 'default'."""


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    name: str
    """The `Settings` attribute; the option's dest is ``gpucluster_<name>``."""
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    """Text -> value; raises ValueError with what was expected (the caller adds the source)."""
    metavar: str | None = None
    multiple: bool = False

    @property
    def dest(self) -> str:
        return f"gpucluster_{self.name}"

    @property
    def ini(self) -> str:
        return f"gpucluster_{self.name}"

    @property
    def env(self) -> str:
        return f"GPUCLUSTER_{self.name.upper()}"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise ValueError(f"expected a number of seconds such as 600, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def user_path(text: str) -> Path:
    return Path(text).expanduser()
