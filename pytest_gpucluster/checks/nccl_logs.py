"""Several NCCL log files read as one job: the facts they agree on, and what each rank said.

A training job leaves one log per rank (or per node); ``--nccl-log`` may name all of them. They
are parsed as one text (the consensus, with line numbers mapped back to ``file:line``) and each on
its own (what the agreement check compares). Pure: no I/O, no pytest.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, fields

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nccl_log import Evidence, NcclLog, RankFacts, parse_nccl_log

__all__ = ["LogSet", "clip", "read_logs"]

_MAX_QUOTE = 300


@dataclass(frozen=True, slots=True)
class LogSet:
    """One or more log files read as one job: the facts they agree on, and what each rank said.

    ``log`` is all files parsed as one text (the consensus, with line numbers in that joined text,
    which :meth:`quote` maps back to ``file:line``). ``sources`` are what the agreement check
    compares: every rank named by a ``host:pid:tid [dev]`` prefix, plus, for a file with no such
    prefix at all (a stripped per-node log), the file itself. Line numbers in ``sources`` are the
    file's own.
    """

    log: NcclLog
    sources: tuple[tuple[str, RankFacts], ...]
    starts: tuple[int, ...]  # first line of each file in the joined text, 1-based
    names: tuple[str, ...]

    def where(self, ev: Evidence) -> str:
        """``file:line`` for a line of the joined text."""
        i = bisect.bisect_right(self.starts, ev.line_no) - 1
        return f"{self.names[i]}:{ev.line_no - self.starts[i] + 1}"

    def quote(self, ev: Evidence) -> str:
        return f"{self.where(ev)}: {clip(ev.text)}"


def clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 3] + "..."


def _complete_lines(text: str) -> str:
    """The text up to its last line end: a last line without one was cut mid-write (as the parser rules)."""
    if text.endswith(("\n", "\r")) or "\n" not in text:
        return text if text.endswith(("\n", "\r")) else text + "\n"
    return text[: text.rindex("\n") + 1]


def read_logs(named: Sequence[tuple[str, str]]) -> LogSet:
    """Parse ``(name, text)`` pairs as the logs of one job; ParseError names a file with no NCCL line."""
    if not named:
        raise ParseError("no NCCL log to read: give at least one file")
    sources: list[tuple[str, RankFacts]] = []
    parts: list[str] = []
    starts: list[int] = []
    line = 1
    for index, (name, text) in enumerate(named):
        try:
            own = parse_nccl_log(text)
        except ParseError as exc:
            raise ParseError(f"{name}: {exc}") from None
        if own.per_rank:
            sources.extend((name, rank) for rank in own.per_rank)
        elif own.unattributed is not None:
            sources.append((name, _renamed(own.unattributed, name)))
        last = index == len(named) - 1
        part = text if last else _complete_lines(text)
        starts.append(line)
        parts.append(part)
        line += len(part.splitlines())
    log = parse_nccl_log("".join(parts)) if len(named) > 1 else own
    return LogSet(log, tuple(sources), tuple(starts), tuple(name for name, _ in named))


def _renamed(rank: RankFacts, name: str) -> RankFacts:
    values = {f.name: getattr(rank, f.name) for f in fields(rank)}
    values["key"] = name
    return RankFacts(**values)
