"""Physical lines to NCCL records: strip what launchers and collectors add, split glued records.

One job: turn text into :class:`Record` values (who printed it, at which level, the message). What a
message means is ``reader``'s business. Imports only the standard library.

What real logs put around NCCL's own ``host:pid:tid [dev] NCCL INFO msg``:

* launcher prefixes before it -- Open MPI ``[1,3]<stdout>:``, pdsh/DeepSpeed ``host: ``, Slurm
  ``srun -l`` ``0: ``, torchrun ``[rank0]:``, ``[155] `` rank labels -- all left of the device
  bracket, so the record is found by searching, not anchoring;
* a leading timestamp, bare, bracketed (``[2026-04-28 14:14:49] ``) or in a CloudWatch table cell
  (``  | 2025-05-16T16:39:51.208-07:00 | ``), which may be glued to the host name;
* CloudWatch's copy of the message after `` | `` on the same line;
* several records on one physical line, when a console or a paste lost the line ends (runs of
  padding spaces between them, or a record starting mid-word after another process's half line);
* ANSI colour codes;
* a last line without a line end, cut mid-write: dropped, since its values may be cut too.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Record", "iter_records"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# A leading timestamp, bare, bracketed or in a CloudWatch table cell: "  | 2025-05-16T16:39:51.208-07:00 | ".
_LEADING_TS = re.compile(rf"^\s*(?:\|\s*)?\[?{_TS}\]?\s*(?:\|\s*)?")
# [dev] [file.cc:123] [NCCL] LEVEL message -- searched anywhere, so launcher prefixes don't matter --
# and the host:pid:tid (or host:pid) just before it, when there is one.
_HEAD = re.compile(
    r"\[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?(?:NCCL )?(?P<level>INFO|WARN|TRACE|ERROR|ABORT)\b ?(?P<msg>.*)$"
)
_HOST_PID_TID = re.compile(r"([^\s:\[\]|]+):(\d+)(?::\d+)? $")
# Where a second record starts on the same physical line: only the full modern shape counts, so a
# message that merely contains "[0] " cannot split a line.
_RECORD_START = re.compile(r"[^\s:\[\]|]+:\d+(?::\d+)? \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:INFO|WARN|TRACE)\b")
# Prefix stripped down to "NCCL INFO ..." or "file.cc:12 NCCL WARN ..."; or an old "socket.h:344 WARN ...".
_BARE = re.compile(
    r"(?:^|\s)(?:(?P<src>[\w./-]+\.\w+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE) ?(?P<msg>.*)$"
    r"|^(?P<src2>[\w./-]+\.(?:cc|cu|c|h|cpp|hpp):\d+) (?P<level2>WARN|INFO) (?P<msg2>.*)$"
)

Key = tuple[str, int, int]  # host, pid, device


@dataclass(frozen=True, slots=True)
class Record:
    """One NCCL record: ``level`` is None for a line that has no NCCL shape (it may still state facts)."""

    line_no: int
    text: str  # the record as quoted in evidence
    line: str  # the record with leading timestamps removed
    msg: str
    level: str | None = None
    src: str | None = None
    key: Key | None = None


def iter_records(text: str) -> Iterator[Record]:
    """Every record of ``text`` in order; a last line without a line end is dropped as cut mid-write."""
    lines = text.splitlines()
    if len(lines) > 1 and not text.endswith(("\n", "\r")):
        lines.pop()
    for line_no, raw in enumerate(lines, start=1):
        clean = _ANSI.sub("", raw) if "\x1b" in raw else raw
        for segment in _segments(clean):
            yield _record(line_no, segment)


def _segments(line: str) -> list[str]:
    """The line, or its glued records one by one (the text before the first stays with the first)."""
    if line.count(" NCCL ") < 2:
        return [line]
    starts = [m.start() for m in _RECORD_START.finditer(line)]
    if len(starts) < 2:
        return [line]
    bounds = [0, *starts[1:], len(line)]
    return [line[a:b].rstrip() for a, b in itertools.pairwise(bounds)]


def _record(line_no: int, raw: str) -> Record:
    start = raw.lstrip()[:1]
    line = _LEADING_TS.sub("", raw, count=1) if start.isdigit() or start in ("[", "|") else raw
    half = (len(line) - 3) // 2  # CloudWatch repeats the message: "msg | msg"
    if len(line) > 3 and line[half : half + 3] == " | " and line[:half] == line[half + 3 :]:
        line = line[:half]
    text = raw.rstrip() if raw.strip() else raw
    if m := _HEAD.search(line):
        key = None
        if who := _HOST_PID_TID.search(line, 0, m.start()):
            key = (who.group(1), int(who.group(2)), int(m.group("dev")))
        return Record(line_no, text, line, m.group("msg"), m.group("level"), m.group("src"), key)
    if m := _BARE.search(line):
        msg = m.group("msg") or m.group("msg2") or ""
        level = m.group("level") or m.group("level2")
        return Record(line_no, text, line, msg, level, m.group("src") or m.group("src2"))
    return Record(line_no, text, line, line.strip())
