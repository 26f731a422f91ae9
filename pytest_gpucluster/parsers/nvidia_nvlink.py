"""Parsers for ``nvidia-smi nvlink`` status and throughput counters, and the checks built on them.

Text in, a frozen :class:`NvlinkReport` out; no I/O, no pytest/torch imports.

Three commands, one shape (``kind`` says which)::

    nvidia-smi nvlink -s      (--status)         kind "status": links {"0": LinkStatus(active, speed_gbs)}
    nvidia-smi nvlink -gt d   (--getthroughput)  kind "data":   links {"0": LinkCounters(tx_kib, rx_kib)}
    nvidia-smi nvlink -gt r                      kind "raw":    links {"0": LinkCounters(tx_kib, rx_kib)}

Units: nvidia-smi's own help says ``-gt d`` displays "tx and rx data payload in KiB" and
``-gt r`` "tx and rx data payload and protocol overhead in KiB" (both print ``... KiB``), so
both kinds are stored as KiB (1024 bytes) and :func:`counter_delta` converts to bytes. The
counters are cumulative since the driver loaded (or the last ``nvidia-smi nvlink -r``).

``-s`` prints ``Link 3: <inactive>`` for a link that is down and ``Link 0: 26.562 GB/s`` for a
link that is up; a GPU whose links are all down may print
``NVML: Unable to retrieve NVLink information as all links are inActive`` instead of link lines,
which is kept as the GPU's ``note``. ``Link N:`` lines in any other form (``-e`` error counters,
text a future driver may print) are not guessed at: they are skipped, so such a link counts as
neither active nor inactive -- compare the link count with what the hardware should have.

A text holding several readings (an idle and a training ``-gt d`` capture, ``-gt d`` then ``-gt r``,
prompts and prose between them) is split by ``nvidia_nvlink_captures``: :func:`parse_nvlink_captures`
returns every capture, each with its lines, the command and the prose heading before it;
:func:`parse_nvlink_text` returns the one report of a single-capture text and refuses several.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_nvlink_captures import split_captures
from pytest_gpucluster.parsers.nvidia_smi import parse_gpu_header, text_preview

__all__ = [
    "LinkBytes",
    "LinkCounters",
    "LinkStatus",
    "NvlinkCapture",
    "NvlinkGpu",
    "NvlinkKind",
    "NvlinkReport",
    "captures_to_json",
    "counter_delta",
    "inactive_links",
    "parse_nvlink_captures",
    "parse_nvlink_counters",
    "parse_nvlink_status",
    "parse_nvlink_text",
    "slow_links",
    "to_json",
]

NvlinkKind = Literal["status", "data", "raw"]

# "Link 0: Data Tx: 1390774681 KiB" / "Link 7: Raw Rx: 1957241622 KiB" (one recorded output
# has "KiB()": anything after the unit is ignored).
_COUNTER = re.compile(r"^\s*Link\s+(\d+):\s*(Data|Raw)\s+(Tx|Rx):\s*(\d+)\s*([A-Za-z]*)", re.IGNORECASE)
# "Link 0: 26.562 GB/s" / "Link 3: <inactive>"
_STATUS = re.compile(r"^\s*Link\s+(\d+):\s*(?:(<inactive>)|(\d+(?:\.\d+)?)\s*GB/s)", re.IGNORECASE)
_NVML_NOTE = re.compile(r"^\s*(NVML:.*?)\s*$")


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """One link from ``nvlink -s``: up with its speed (GB/s, per direction), or down."""

    active: bool
    speed_gbs: float | None

    def to_json(self) -> dict:
        return {"active": self.active, "speed_gbs": self.speed_gbs}


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """One link from ``nvlink -gt d|r``, in KiB; None when that line was not in the text."""

    tx_kib: int | None
    rx_kib: int | None

    def to_json(self) -> dict:
        return {"tx_kib": self.tx_kib, "rx_kib": self.rx_kib}


@dataclass(frozen=True, slots=True)
class NvlinkGpu:
    """One ``GPU <i>: <name> (UUID: ...)`` block; ``links`` is keyed by link number as a string."""

    name: str | None
    uuid: str | None
    links: dict[str, LinkStatus | LinkCounters] = field(default_factory=dict)
    note: str | None = None  # e.g. "NVML: Unable to retrieve NVLink information as all links are inActive"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "uuid": self.uuid,
            "links": {n: link.to_json() for n, link in self.links.items()},
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class NvlinkReport:
    """The parsed output of one ``nvidia-smi nvlink`` command; ``gpus`` is keyed by GPU index as a string."""

    kind: NvlinkKind
    gpus: dict[str, NvlinkGpu]

    def to_json(self) -> dict:
        return {"kind": self.kind, "gpus": {i: g.to_json() for i, g in self.gpus.items()}}


@dataclass(frozen=True, slots=True)
class LinkBytes:
    """Traffic on one link between two counter readings, in bytes (None where a reading was missing)."""

    tx_bytes: int | None
    rx_bytes: int | None


@dataclass(frozen=True, slots=True)
class NvlinkCapture:
    """One reading found in a text that may hold several: lines ``first``..``last`` (1-based).

    ``command`` is the ``nvidia-smi nvlink ...`` line before it, without the prompt; ``heading`` the
    last line of prose before it (``# 模型训练时（LLaMA-13B）``, ``end:``): how a person labels idle and
    training readings.
    """

    report: NvlinkReport
    first: int
    last: int
    command: str | None = None
    heading: str | None = None

    def to_json(self) -> dict:
        return {
            "lines": [self.first, self.last],
            "command": self.command,
            "heading": self.heading,
            **self.report.to_json(),
        }


def parse_nvlink_captures(text: str) -> tuple[NvlinkCapture, ...]:
    """Every ``nvlink -s``/``-gt d``/``-gt r`` reading in ``text``, in order, each parsed on its own.

    A capture with GPU lines but no link line of those forms (GPUs without NVLink, ``nvlink -c``
    output) is skipped: its kind cannot be told; read such a text with :func:`parse_nvlink_status`.
    Raises ParseError when no capture is left, saying what was looked for.
    """
    captures = []
    for span in split_captures(text):
        if span.kind is None:
            continue  # GPU lines without any -s/-gt link line: nothing to read
        try:
            report = (
                parse_nvlink_status(span.text)
                if span.kind == "status"
                else parse_nvlink_counters(span.text, span.kind)
            )
        except ParseError as exc:
            raise ParseError(f"nvidia-smi nvlink capture at lines {span.first}-{span.last}: {exc}") from None
        captures.append(NvlinkCapture(report, span.first, span.last, span.command, span.heading))
    if not captures:
        parse_nvlink_text(text)  # raises, saying what was looked for
    return tuple(captures)


def captures_to_json(captures: tuple[NvlinkCapture, ...]) -> list[dict]:
    """``gpucluster parse nvlink``: one JSON object per capture, in the order they appear."""
    return [c.to_json() for c in captures]


def parse_nvlink_text(text: str) -> NvlinkReport:
    """Parse the output of ``nvlink -s``, ``-gt d`` or ``-gt r``, telling which from its link lines.

    A text holding several captures is refused, naming them: parse it with :func:`parse_nvlink_captures`.
    """
    spans = [s for s in split_captures(text) if s.kind is not None]
    if len(spans) > 1:
        listed = ", ".join(f"{s.kind} at lines {s.first}-{s.last}" for s in spans)
        raise ParseError(
            f"nvidia-smi nvlink output holds {len(spans)} captures ({listed}); read them one by one with "
            "parse_nvlink_captures() or `gpucluster parse nvlink FILE`, which prints each."
        )
    kinds = set()
    for line in text.splitlines():
        if m := _COUNTER.match(line):
            kinds.add("data" if m.group(2).lower() == "data" else "raw")
        elif _STATUS.match(line):
            kinds.add("status")
    if not kinds:
        raise ParseError(
            "nvidia-smi nvlink output has no 'Link <n>: ...' line of -s, -gt d or -gt r form; "
            f"got {text_preview(text)}. A GPU without NVLink prints no link lines: "
            "call parse_nvlink_status() to accept that."
        )
    if len(kinds) > 1:
        raise ParseError(
            f"nvidia-smi nvlink output mixes {' and '.join(sorted(kinds))} lines; "
            "parse the output of one command (nvlink -s, -gt d or -gt r) at a time."
        )
    kind = kinds.pop()
    return parse_nvlink_status(text) if kind == "status" else parse_nvlink_counters(text, kind)


def parse_nvlink_status(text: str) -> NvlinkReport:
    """Parse ``nvidia-smi nvlink -s``. A GPU with no link lines (no NVLink, or all down) keeps empty links."""
    gpus = _parse_blocks(text, _status_line)
    if not gpus:
        raise ParseError(f"nvidia-smi nvlink -s output has no 'GPU <i>: ...' line; got {text_preview(text)}.")
    return NvlinkReport("status", gpus)


def parse_nvlink_counters(text: str, kind: Literal["data", "raw"] | None = None) -> NvlinkReport:
    """Parse ``nvidia-smi nvlink -gt d`` or ``-gt r`` (``kind`` checked against the lines when given)."""
    seen = {m.group(2).lower() for line in text.splitlines() if (m := _COUNTER.match(line))}
    if not seen:
        raise ParseError(
            f"nvidia-smi nvlink -gt output has no 'Link <n>: Data|Raw Tx|Rx: <n> KiB' line; got {text_preview(text)}."
        )
    if len(seen) > 1 or (kind is not None and seen != {kind}):
        raise ParseError(
            f"nvidia-smi nvlink -gt output holds {' and '.join(sorted(seen))} counters, "
            f"expected only {kind or 'one kind'}; parse -gt d and -gt r outputs separately."
        )
    return NvlinkReport("data" if seen == {"data"} else "raw", _parse_blocks(text, _counter_line))


def to_json(report: NvlinkReport) -> dict:
    """The JSON form of a parsed nvlink output (same as ``report.to_json()``)."""
    return report.to_json()


def inactive_links(status: NvlinkReport) -> list[tuple[str, str]]:
    """``(gpu, link)`` for every link ``nvlink -s`` printed as ``<inactive>``."""
    _require(status, "status", "inactive_links")
    return [
        (gpu, n)
        for gpu, block in status.gpus.items()
        for n, link in block.links.items()
        if isinstance(link, LinkStatus) and not link.active
    ]


def slow_links(status: NvlinkReport, min_gbs: float) -> list[tuple[str, str, float]]:
    """``(gpu, link, speed_gbs)`` for every active link slower than ``min_gbs`` (inactive ones: inactive_links)."""
    _require(status, "status", "slow_links")
    return [
        (gpu, n, link.speed_gbs)
        for gpu, block in status.gpus.items()
        for n, link in block.links.items()
        if isinstance(link, LinkStatus) and link.speed_gbs is not None and link.speed_gbs < min_gbs
    ]


def counter_delta(before: NvlinkReport, after: NvlinkReport) -> dict[str, dict[str, LinkBytes]]:
    """Bytes moved per GPU and link between two ``-gt`` readings of the same kind.

    Only GPUs and links present in both readings are returned. A counter that went down
    means it was reset between the readings (driver reload, ``nvidia-smi nvlink -r``): that
    raises ParseError rather than report a negative or made-up figure.
    """
    if before.kind == "status" or before.kind != after.kind:
        raise ParseError(
            f"counter_delta needs two nvlink -gt readings of the same kind, got {before.kind!r} and {after.kind!r}."
        )
    out: dict[str, dict[str, LinkBytes]] = {}
    for gpu, b_block in before.gpus.items():
        a_block = after.gpus.get(gpu)
        if a_block is None:
            continue
        links = {}
        for n, b in b_block.links.items():
            a = a_block.links.get(n)
            if isinstance(a, LinkCounters) and isinstance(b, LinkCounters):
                links[n] = LinkBytes(
                    _delta_bytes(gpu, n, "Tx", b.tx_kib, a.tx_kib),
                    _delta_bytes(gpu, n, "Rx", b.rx_kib, a.rx_kib),
                )
        out[gpu] = links
    return out


def _delta_bytes(gpu: str, link: str, way: str, before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    if after < before:
        raise ParseError(
            f"NVLink counter GPU {gpu} link {link} {way} went down from {before} KiB to {after} KiB: "
            "it was reset between the two readings (driver reload or `nvidia-smi nvlink -r`); read both again."
        )
    return (after - before) * 1024


def _parse_blocks(text: str, read_link) -> dict[str, NvlinkGpu]:
    """Split the text into GPU blocks; ``read_link(line, links)`` fills one block's links from one line."""
    headers: dict[str, tuple[str | None, str | None]] = {}
    links: dict[str, dict] = {}
    notes: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        header = parse_gpu_header(line)
        if header is not None:
            current = str(header.index)
            headers.setdefault(current, (header.name or None, header.uuid))
            links.setdefault(current, {})
        elif current is None:
            continue  # link lines above the first GPU line cannot be attributed
        elif note := _NVML_NOTE.match(line):
            notes[current] = note.group(1)
        else:
            read_link(line, links[current])
    return {i: NvlinkGpu(name, uuid, links[i], notes.get(i)) for i, (name, uuid) in headers.items()}


def _status_line(line: str, links: dict) -> None:
    m = _STATUS.match(line)
    if m:
        speed = float(m.group(3)) if m.group(3) is not None else None
        links[m.group(1)] = LinkStatus(active=m.group(2) is None, speed_gbs=speed)


def _counter_line(line: str, links: dict) -> None:
    m = _COUNTER.match(line)
    if not m:
        return
    n, way, value, unit = m.group(1), m.group(3).lower(), int(m.group(4)), m.group(5)
    if unit != "KiB":  # every driver documents and prints KiB; guessing another unit would be off by 1024x
        raise ParseError(
            f"nvidia-smi nvlink -gt line {line.strip()!r} gives its counter in {unit or 'no unit'!r}, "
            "expected KiB; record this output and teach the parser its unit."
        )
    old = links.get(n, LinkCounters(None, None))
    links[n] = LinkCounters(value, old.rx_kib) if way == "tx" else LinkCounters(old.tx_kib, value)


def _require(report: NvlinkReport, kind: str, what: str) -> None:
    if report.kind != kind:
        raise ParseError(f"{what} needs the output of `nvidia-smi nvlink -s`, got a {report.kind!r} report.")
