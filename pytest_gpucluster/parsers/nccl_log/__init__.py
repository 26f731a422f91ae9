"""Facts from ``NCCL_DEBUG=INFO`` output: version, network, net plugin, transports, GDR, NVLS, ranks,
warnings and errors.

Text in, dataclasses out, no I/O; imports only the standard library and ``pytest_gpucluster.errors``.
Modules, one job each: ``records`` (lines to NCCL records, launcher prefixes, glued records),
``reader`` (messages to facts per rank), ``plugins`` (the net plugin), ``transports`` (channels,
NVLS, GDR), ``interfaces`` (NICs), ``severity`` (which WARNs are errors, and why), ``summary``
(one view of the whole log), ``model`` (the values).

Real logs are messy, and the parser takes them as they come: one rank or many interleaved; with the
``host:pid:tid [dev] NCCL INFO`` prefix, with only ``NCCL INFO``, or with nothing at all; behind
launcher or collector prefixes (Open MPI ``[1,3]<stdout>:``, pdsh ``host: ``, ``[155]`` labels,
timestamps, the CloudWatch ``| time | message`` table); several records glued on one line; NCCL 2.0
to 2.28 wordings (``INFO``/``WARN`` without ``NCCL`` in old releases); and cut off anywhere (a last
line with no line end is dropped as cut mid-write). A line it does not recognise is skipped, never
an error.

Every fact keeps the line it came from (:class:`Evidence`), so an acceptance test can quote the line
that contradicts its expectation. Facts are kept per rank (:class:`RankFacts`, one per
``host:pid[dev]``) so that :func:`disagreements` can name the rank that loaded another plugin or fell
back to sockets.

**Errors and warnings.** A WARN NCCL (or its net plugin) prints is an *error* -- a failed verbs call,
``Connection closed by remote peer``, ``Couldn't open AV``, ``Error: network ... not found``, a proxy
or socket failure, a completion error or timeout -- unless it matches one of the benign shapes in
:mod:`.severity` (deprecated, ignored or clamped settings, fallbacks NCCL carries on from, the RAS
side service...), which stay *warnings*. The module docstring of ``severity`` lists each rule and
why.
"""

from __future__ import annotations

from typing import Any

from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nccl_log.model import (
    Connection,
    Disagreement,
    Evidence,
    Fact,
    Facts,
    NcclLog,
    NetPlugin,
    RankFacts,
    disagreements,
)
from pytest_gpucluster.parsers.nccl_log.reader import read_records
from pytest_gpucluster.parsers.nccl_log.records import iter_records
from pytest_gpucluster.parsers.nccl_log.severity import benign_reason, failure_kind
from pytest_gpucluster.parsers.nccl_log.summary import p2p_or_nvls_connections, summarise

__all__ = [
    "Connection",
    "Disagreement",
    "Evidence",
    "Fact",
    "Facts",
    "NcclLog",
    "NetPlugin",
    "RankFacts",
    "benign_reason",
    "disagreements",
    "failure_kind",
    "p2p_or_nvls_connections",
    "parse_nccl_log",
    "to_json",
]


def parse_nccl_log(text: str) -> NcclLog:
    """Read every NCCL fact in ``text``; raise ParseError when it holds no NCCL line at all."""
    sources, nccl_lines = read_records(iter_records(text))
    if nccl_lines == 0:
        raise ParseError(
            f"No NCCL debug output found in {len(text.splitlines())} lines: expected lines such as "
            "'host:pid:tid [0] NCCL INFO ...' or 'NCCL version 2.x'. Was the job run with NCCL_DEBUG=INFO, "
            "and was stderr captured?"
        )
    return summarise(sources, nccl_lines)


def to_json(log: NcclLog) -> dict[str, Any]:
    """The parsers' common entry point for ``gpucluster parse nccl-log``: :meth:`NcclLog.to_json`."""
    return log.to_json()
