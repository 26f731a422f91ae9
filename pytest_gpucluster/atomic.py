"""Files a reader never sees half-written: write beside, then rename (``os.replace`` is atomic on
one filesystem). For results, reports, drain lists and readings handed between tests, which
another process (an xdist worker, an operator script) may read while the run writes them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8) in one step."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)
