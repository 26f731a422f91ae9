"""NVSwitch error reports and Fabric Manager's own log: text in, dataclasses out.

- **SXid** lines: the NVSwitch driver's errors in the kernel log, ``nvidia-nvswitch0: SXid
  (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up``. A line of one event may be followed
  by ``Severity``/``Data`` lines for the same SXid (they carry no severity word and are counted
  once with their event). NVIDIA's Fabric Manager guide (appendix "NVSwitch SXid errors") says a
  fatal SXid leaves the switch unusable until the GPUs and switches are reset.
- **Fabric Manager log** (``/var/log/fabricmanager.log``, ``journalctl -u nvidia-fabricmanager``):
  whether it reached "Successfully configured all the available ... NVSwitches" and its
  ``[ERROR]`` lines.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FmLog", "SxidEvent", "parse_fm_log", "parse_sxid_lines"]

_SXID = re.compile(
    r"nvidia-nvswitch(?P<switch>\d+):\s+SXid\s+\((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\):\s+(?P<code>\d+),\s*(?P<rest>.*)$"
)
_SEVERITY = re.compile(r"^(?P<severity>Non-fatal|Fatal)\b,?\s*(?P<detail>.*)$", re.IGNORECASE)
_FM_CONFIGURED = re.compile(r"Successfully configured all the available .*NVSwitches", re.IGNORECASE)
_FM_ERROR = re.compile(r"\[ERROR\]|\bERROR\b|failed", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SxidEvent:
    """One SXid event: its switch, PCI address, code, ``fatal``/``non-fatal`` and the detail."""

    switch: int
    pci: str
    code: int
    severity: str
    detail: str
    line: str

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SxidEvent:
        return cls(**{f: data[f] for f in cls.__dataclass_fields__})


def parse_sxid_lines(text: str) -> list[SxidEvent]:
    """Every SXid event of a kernel log (dmesg, journalctl -k, kern.log or a pasted excerpt); the
    follow-up ``Severity ...``/``Data {...}`` lines of an event are not events of their own."""
    events = []
    for line in text.splitlines():
        match = _SXID.search(line)
        if not match:
            continue
        severity = _SEVERITY.match(match["rest"].strip())
        if severity is None:
            continue  # "20034, Severity 1 Engine instance ..." / "20034, Data {...}": the event's details
        events.append(
            SxidEvent(
                switch=int(match["switch"]),
                pci=match["pci"].lower(),
                code=int(match["code"]),
                severity=severity["severity"].lower(),
                detail=severity["detail"].strip(),
                line=line.strip()[-300:],
            )
        )
    return events


@dataclass(frozen=True, slots=True)
class FmLog:
    """What a Fabric Manager log says: configured the switches or not, and its error lines."""

    configured: bool
    errors: tuple[str, ...]
    sxids: tuple[SxidEvent, ...]
    lines: int

    def to_json(self) -> dict[str, Any]:
        return {"configured": self.configured, "errors": list(self.errors),
                "sxids": [s.to_json() for s in self.sxids], "lines": self.lines}  # fmt: skip


def parse_fm_log(text: str) -> FmLog:
    """Fabric Manager's log (its own file or its journal): the last "Successfully configured"
    line, its error lines (the last 20) and the SXids it reported."""
    lines = text.splitlines()
    configured = any(_FM_CONFIGURED.search(line) for line in lines)
    errors = [line.strip()[-300:] for line in lines if _FM_ERROR.search(line) and "SXid" not in line]
    return FmLog(configured, tuple(errors[-20:]), tuple(parse_sxid_lines(text)), len(lines))
