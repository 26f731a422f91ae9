"""The files a job leaves in its directory, read by the controller: agent logs, rank files, progress.

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["ProgressTail", "agent_log_paths", "read_rank_states", "tail_lines"]


def tail_lines(path: Path, count: int = 15, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``count`` lines of a text file ([] if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(size - max_bytes, 0))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]


_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")


def read_rank_states(job_dir: Path) -> dict[int, dict]:
    """``rank -> record`` for every rank file written so far (see workloads._runtime)."""
    states: dict[int, dict] = {}
    try:
        names = os.listdir(job_dir)
    except OSError:
        return states
    for name in names:
        match = _RANK_FILE.match(name)
        if not match:
            continue
        try:
            states[int(match.group(1))] = json.loads((job_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # written atomically, so only a vanished file can land here
    return states


def _safe_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"


def agent_log_paths(job_dir: Path, hosts: Sequence[str]) -> list[Path]:
    """``agent-<host>.log`` per command; a host listed twice gets ``agent-<host>.<i>.log``."""
    paths: list[Path] = []
    seen: dict[str, int] = {}
    for host in hosts:
        name = _safe_name(host)
        count = seen.get(name, 0)
        seen[name] = count + 1
        paths.append(job_dir / (f"agent-{name}.log" if count == 0 else f"agent-{name}.{count}.log"))
    return paths


class ProgressTail:
    """Hands each new complete line of rank 0's progress file to a callback (a failing callback
    is dropped, never the job)."""

    def __init__(self, path: Path, callback: Callable[[str], None] | None) -> None:
        self.path = path
        self.callback = callback
        self.offset = 0
        self.partial = b""

    def poll(self, final: bool = False) -> None:
        if self.callback is None:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = b"" if final else lines.pop()
        for line in lines:
            if line:
                try:
                    self.callback(line.decode("utf-8", errors="replace"))
                except Exception:
                    self.callback = None
                    return
