"""Did each side of the NVLink speedup run where it was meant to? Read from its NCCL logs.

``test_speedup`` compares an intra-node all_reduce as configured (the fast side) with the same
all_reduce with NVLink turned off (the slow side: ``NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=0 ...``,
``plans/nvlink.py``). A ratio is only a speedup if the slow side really left NVLink: with
``NCCL_P2P_DISABLE=1`` alone, NVLS (NVLink SHARP) stays on and the "slow" side runs over NVLink,
so the ratio reads ~1 and the test would fail a healthy node. Each side's ranks log NCCL at INFO
(every channel line names its transport, and the NVLS set-up is logged), and this module checks:

- the slow side: no P2P and no NVLS connection (at most 0), SHM or NET only. One P2P/NVLS line
  fails with ``slow side still on NVLink: <quoted line>``, and the speedup is then *not judged*
  (:func:`transport_checks` says why), since its busbw is no "without NVLink" figure;
- the fast side: at least one P2P or NVLS connection (a fast side over SHM measures nothing
  faster than the slow one, which the speedup check then reports as it is).

A side whose logs hold no channel line at all is a check with no value (not measured): the
transports cannot be verified (``NCCL_DEBUG`` overridden, or the log cut off). Each side's own
settings are recorded in the checks' labels (``env``); the session's NCCL environment under
them is in results.json's header.

Pure: log texts in, checks out (``parsers.nccl_log`` reads the lines); no torch, no pytest, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nccl_log import Connection, p2p_or_nvls_connections, parse_nccl_log
from pytest_gpucluster.results.model import Check, Comparison

__all__ = ["FAST_METRIC", "SLOW_METRIC", "SideLogs", "SideTransports", "read_side", "transport_checks"]

SLOW_METRIC = "nvlink.speedup.slow_side_nvlink_connections"
FAST_METRIC = "nvlink.speedup.fast_side_nvlink_connections"
_LOGGING = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
_OFF_NVLINK = ("SHM", "NET", "CollNet")


@dataclass(frozen=True, slots=True)
class SideLogs:
    """One side of the comparison: its name, the environment it set over the session's, and the
    NCCL log of each of its ranks as ``(file name, text)``."""

    name: str
    env: Mapping[str, str]
    logs: Sequence[tuple[str, str]]

    @property
    def env_text(self) -> str:
        """The side's own settings, logging left out: ``NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1``."""
        shown = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()) if k not in _LOGGING)
        return shown or "the session's NCCL environment"


@dataclass(frozen=True, slots=True)
class SideTransports:
    """The connections one side's logs show, each with the file it is in."""

    nvlink: tuple[tuple[str, Connection], ...]
    """P2P (IPC, CUMEM, direct pointer) or NVLS connections, in log order per file."""
    other: tuple[tuple[str, Connection], ...]
    """SHM, NET and CollNet connections."""
    settings: tuple[str, ...]
    """NCCL's own word on the settings it read (``NCCL_P2P_DISABLE set by environment to 1``)."""
    silent: tuple[str, ...]
    """Files with no NCCL line at all."""

    @property
    def verified(self) -> bool:
        return bool(self.nvlink or self.other)


def _quote(found: tuple[str, Connection]) -> str:
    name, connection = found
    return f"{name} line {connection.evidence.line_no}: {connection.evidence.text.strip()}"


def read_side(side: SideLogs) -> SideTransports:
    """Every connection line of the side's rank logs, split into on- and off-NVLink."""
    nvlink: list[tuple[str, Connection]] = []
    other: list[tuple[str, Connection]] = []
    settings: dict[str, None] = {}
    silent: list[str] = []
    for name, text in side.logs:
        try:
            log = parse_nccl_log(text)
        except ParseError:
            silent.append(name)
            continue
        on = set(p2p_or_nvls_connections(log))
        nvlink += [(name, c) for c in log.connections if c in on]
        other += [(name, c) for c in log.connections if c not in on and c.family in _OFF_NVLINK]
        for fact in log.environment:
            variable, value = fact.value
            if variable.startswith(("NCCL_P2P", "NCCL_NVLS", "NCCL_SHM", "NCCL_MNNVL", "NCCL_ALGO")):
                settings[f"{variable}={value}"] = None
    return SideTransports(tuple(nvlink), tuple(other), tuple(settings), tuple(silent))


def _families(found: Sequence[tuple[str, Connection]]) -> str:
    return ", ".join(dict.fromkeys(c.transport for _, c in found)) or "none"


def _unverified(side: SideLogs, metric: str, threshold: float, comparison: Comparison) -> Check:
    files = ", ".join(name for name, _ in side.logs) or "none"
    return Check(
        metric, math.nan, "connections", threshold, comparison,
        scope="intra-node", labels={"side": side.name, "env": side.env_text},
        hint=f"cannot tell which transports the {side.name} side used: its NCCL logs ({files}) hold no channel "
        "line ('Channel 00/0 : 0[0] -> 1[1] via ...'). Was NCCL_DEBUG overridden, or did the job end before "
        "NCCL connected?",
    )  # fmt: skip


def _slow_check(side: SideLogs, read: SideTransports) -> Check:
    if not read.verified:
        return _unverified(side, SLOW_METRIC, 0.0, "<=")
    said = f" NCCL read {', '.join(read.settings)}." if read.settings else ""
    if read.nvlink:
        more = len(read.nvlink) - 1
        hint = (
            f"slow side still on NVLink: {_quote(read.nvlink[0])}"
            + (f" (and {more} more P2P/NVLS connection line(s))" if more else "")
            + f". It ran with {side.env_text};{said} its busbw is not a figure without NVLink, so the speedup "
            "is not judged. Look for a setting that brings P2P or NVLS back (NCCL_ALGO forcing NVLS, an "
            "nccl.conf, a tuner plugin) or an NCCL that ignores one of these variables."
        )
    else:
        hint = f"off NVLink as meant: {_families(read.other)} ({_quote(read.other[0])}).{said}"
    return Check(
        SLOW_METRIC, float(len(read.nvlink)), "connections", 0.0, "<=", scope="intra-node",
        labels={"side": side.name, "env": side.env_text}, hint=hint,
    )  # fmt: skip


def _fast_check(side: SideLogs, read: SideTransports) -> Check:
    if not read.verified:
        return _unverified(side, FAST_METRIC, 1.0, ">=")
    if read.nvlink:
        hint = f"on NVLink: {_families(read.nvlink)} ({_quote(read.nvlink[0])})."
    else:
        hint = (
            f"fast side did not use NVLink: no P2P or NVLS connection, only {_families(read.other)} "
            f"({_quote(read.other[0])}). NCCL found no P2P path between the GPUs: check `nvidia-smi topo -m`, "
            "NCCL_P2P_LEVEL/NCCL_P2P_DISABLE in the session's environment, and the fabric manager on NVSwitch nodes."
        )
    return Check(
        FAST_METRIC, float(len(read.nvlink)), "connections", 1.0, ">=", scope="intra-node",
        labels={"side": side.name, "env": side.env_text}, hint=hint,
    )  # fmt: skip


def transport_checks(fast: SideLogs, slow: SideLogs) -> tuple[list[Check], str | None]:
    """Both sides' transport checks, and why the speedup must not be judged (None: it may be).

    Only a slow side shown on NVLink voids the speedup; a fast side off NVLink is a real finding
    that the speedup check reports in its own terms."""
    slow_read = read_side(slow)
    checks = [_fast_check(fast, read_side(fast)), _slow_check(slow, slow_read)]
    untrusted = None
    if slow_read.nvlink:
        untrusted = f"the {slow.name} side still ran over NVLink ({_quote(slow_read.nvlink[0])})"
    return checks, untrusted
