"""Where one ``nvidia-smi nvlink`` output ends and the next begins, in text that holds several.

A file often holds more than one reading: an idle and a training ``-gt d`` capture, ``-gt d`` then
``-gt r``, ``start:`` and ``end:`` snapshots around a job, with prompts, comments, Markdown fences and
prose between them. This module only finds the spans (text in, :class:`CaptureSpan` values out, no
I/O); ``nvidia_nvlink`` parses each span. Imports only the standard library and ``nvidia_smi``.

A new capture starts at a GPU block after a command line (a line naming ``nvidia-smi``), after a
line of prose, when a GPU index repeats, or when the link lines change kind (``Data`` to ``Raw``
counters, counters to ``-s`` status). Blank lines and elisions (``...``) do not split a capture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_gpucluster.parsers.nvidia_smi import parse_gpu_header

__all__ = ["CaptureSpan", "split_captures"]

# "Link 0: Data Tx: 1 KiB" -> data, "Link 0: Raw Rx: 1 KiB" -> raw, "Link 0: 26.562 GB/s" -> status.
_LINK = re.compile(
    r"^\s*Link\s+\d+:\s*(?:(Data)\s+[TR]x|(Raw)\s+[TR]x|(<inactive>|\d+(?:\.\d+)?\s*GB/s))", re.I
)
_NVML_NOTE = re.compile(r"^\s*NVML:")
_ANY_LINK = re.compile(r"^\s*Link\s+\d+")  # -e error counters, -c capabilities: part of the block
_ELISION = re.compile(r"^\s*\.{2,}\s*$")
_COMMAND = re.compile(r"nvidia-smi\b")
_PROMPT = re.compile(r"^[\s>$#]*(?:\S+@\S+[:~][^$#]*[$#]\s*)?")


@dataclass(frozen=True, slots=True)
class CaptureSpan:
    """Lines ``first``..``last`` (1-based) of one capture, with what stood before it."""

    first: int
    last: int
    kind: str | None  # "status" | "data" | "raw"; None when no link line was readable
    command: str | None  # "nvidia-smi nvlink -i 0 -gt d", from the prompt line before it
    heading: str | None  # the last line of prose before it ("# 模型训练时（LLaMA-13B）", "end:")
    text: str  # its lines, each with its line end


@dataclass
class _Block:
    """One ``GPU <i>: ...`` line and the link lines under it, while lines stream in."""

    first: int
    last: int
    gpu: int
    kind: str | None = None
    command: str | None = None  # the command line since the previous block, if any
    heading: str | None = None  # the prose since the previous block ("" for a bare Markdown fence)


def _link_kind(line: str) -> str | None:
    m = _LINK.match(line)
    if not m:
        return None
    return "data" if m.group(1) else "raw" if m.group(2) else "status"


def _blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    command = heading = None
    current: _Block | None = None
    for n, line in enumerate(lines, start=1):
        header = parse_gpu_header(line)
        kind = _link_kind(line)
        if header is not None:
            current = _Block(n, n, header.index, None, command, heading)
            blocks.append(current)
            command = heading = None
        elif kind is not None or _NVML_NOTE.match(line) or _ANY_LINK.match(line):
            if current is not None:
                current.last = n
                current.kind = current.kind or kind
        elif not line.strip() or _ELISION.match(line):
            continue
        else:
            current = None
            if _COMMAND.search(line):
                command = _PROMPT.sub("", line).strip()
            elif line.lstrip().startswith("```"):
                heading = heading or ""  # a Markdown fence splits, but labels nothing
            else:
                heading = line.strip()
    return blocks


def split_captures(text: str) -> list[CaptureSpan]:
    """The captures in ``text``, in order; each holds at least one GPU block."""
    lines = text.splitlines()
    groups: list[list[_Block]] = []
    for block in _blocks(lines):
        group = groups[-1] if groups else None
        kind = next((b.kind for b in group or () if b.kind), None)
        if (
            group is None
            or block.command is not None
            or block.heading is not None
            or block.gpu in {b.gpu for b in group}
            or (block.kind is not None and kind is not None and block.kind != kind)
        ):
            groups.append([block])
        else:
            group.append(block)
    spans = []
    for group in groups:
        first, last = group[0].first, group[-1].last
        spans.append(
            CaptureSpan(
                first,
                last,
                next((b.kind for b in group if b.kind), None),
                group[0].command,
                group[0].heading or None,
                "\n".join(lines[first - 1 : last]) + "\n",
            )
        )
    return spans
