"""Which NCCL WARN lines are failures (errors) and which are benign notices (warnings).

One job: the rule, in data, with the reason for each entry. Imports only the standard library.

**The rule.** NCCL prints ``WARN`` almost only when something failed: of the ~330 ``WARN(...)``
format strings in NCCL 2.27's source, all but about twenty are followed by an error return (a
failed verbs or socket call, a peer that closed its connection, a network or device that is not
there, a proxy operation that failed, a CUDA failure). aws-ofi-nccl and the HPC-X plugin print
their failures the same way (``NET/OFI Couldn't open AV``, ``SHARP group create: ... failed``).
So a WARN is an **error** unless it matches one of the benign shapes below, each of which is NCCL
saying it adjusted, ignored or fell back and carried on:

========================  ==================================================================  =====================================
benign rule               matches                                                             why it is not a failure
========================  ==================================================================  =====================================
deprecated setting        ``... is deprecated``                                               a renamed variable still works
ignored setting           ``ignoring``/``is being ignored`` (``CollNet is not supported or    NCCL dropped an optional setting and
                          fails to initialize, ignoring NCCL_ALGO=COLLNET``)                   runs with its defaults
clamped setting           ``..., setting to 16``, ``setting NCCL_NSOCKS_PERTHREAD to 4``,      a value out of range was clamped
                          ``using default``
fallback                  ``falling back``, ``using point-to-point network instead``,        NCCL chose another working path
                          ``not using it``, ``Continue without profiler``, ``, disabling``
older driver or CUDA      ``not supported prior to CUDA``, ``due to old driver``,             a feature is off on this build; the
                          ``MNNVL is not supported on this system``                          job runs without it
internal net plugin       ``No plugin found ... using internal``, ``Using internal network    no external plugin; NCCL's own
                          plugin``                                                            transport is used (the profile's
                                                                                              net_plugin check judges that)
GDR notice                aws-ofi-nccl ``GDR disabled on GDR-supported instance type``         a configuration notice; the profile's
                                                                                              gdr check judges it
RDMA library absent       ``Failed to open libibverbs.so[.1]`` (NCCL 2.4; INFO since 2.19)     NCCL falls back to sockets; the
                                                                                              profile's network check judges it
RAS side service          a WARN printed from ``ras/*`` (``ras/client_support.cc:159 NCCL    NCCL's monitoring service could not
                          WARN Call to bind failed: Address already in use``)                open its client socket; communication
                                                                                              is not affected
========================  ==================================================================  =====================================

Everything else is an error: ``Call to ibv_create_qp failed``, ``NET/IB : Unable to open device``,
``NET/IB : Got completion from peer ... error 4`` / ``status=12``, ``socketProgress: Connection
closed by remote peer``, ``socketStartConnect: Connect to ... failed``, ``[Proxy Service 0] Failed
to execute operation Connect``, ``Error: network AWS Libfabric not found``, ``NET/OFI Couldn't open
AV``, ``SHARP group create: Streaming Tree lock failed``, ``Call to connect failed : Connection
refused`` (NCCL 2.0's wording, without the word NCCL), ``Cuda failure 'out of memory'``. An unknown
WARN counts as an error on purpose: a gate that let an unrecognised failure pass would be worse
than one that asks a person to look at a notice.

Lines that are not WARNs are errors when they report a failed NCCL call: ``NCCL error in: ...``,
``NCCL failure ... 'unhandled system error'``, ``ncclInternalError``, ``Cuda failure``,
``DistBackendError``, and PyTorch's watchdog ``WorkNCCL(...) ran for ... before timing out``.
"""

from __future__ import annotations

import re

__all__ = ["BENIGN_WARNS", "ERROR_LINE", "benign_reason", "failure_kind", "is_torch_nccl_deprecation"]

BENIGN_WARNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deprecated setting", re.compile(r"\bdeprecated\b", re.IGNORECASE)),
    # "ignoring"/"ignored", not "ignore": MNNVL's failure says "Set NCCL_MNNVL_ENABLE=0 to ignore this issue".
    ("ignored setting", re.compile(r"\bignor(?:ed|ing)\b", re.IGNORECASE)),
    ("clamped setting", re.compile(r"\bsetting (?:NCCL_\w+ )?to \d+|\busing default\b")),
    (
        "fallback",
        re.compile(
            r"\bfall(?:ing)? ?back\b|\busing [\w -]+ instead\b(?! of)|\btrying to use \w+ instead\b"
            r"|\bnot using it\b|\bContinue without\b|, disabling\b|\bDisabling other rings\b",
            re.IGNORECASE,
        ),
    ),
    (
        "older driver or CUDA",
        re.compile(r"not supported prior to CUDA|due to old driver|MNNVL is not supported on this system"),
    ),
    (
        "internal net plugin",
        re.compile(
            r"No plugin found.*using internal|Using internal (?:network )?(?:plugin|implementation)", re.I
        ),
    ),
    ("GDR notice", re.compile(r"GDR disabled on GDR-supported instance type")),
    ("RDMA library absent", re.compile(r"Failed to open lib(?:ibverbs|mlx5)\b")),
)

# What kind of failure an error WARN is, for the message a person reads first. First match wins.
_FAILURE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("network completion error", re.compile(r"Got completion|completed with error|\bwc\b.*status", re.I)),
    ("verbs call failed", re.compile(r"\bibv_\w+|NET/IB\s*:.*(?:Unable to|failed|async)", re.I)),
    ("connection closed", re.compile(r"Connection closed|closed by remote|Connection reset", re.I)),
    ("timeout", re.compile(r"tim(?:ed|e|ing)[ -]?out|Timeout", re.I)),
    (
        "network not found",
        re.compile(r"Error: network .* not found|no (?:usable )?(?:IP |socket )?interface", re.I),
    ),
    ("connection failed", re.compile(r"connect\w*\b.*failed|Connection refused|unreachable|abort", re.I)),
    ("libfabric (aws-ofi-nccl) failure", re.compile(r"NET/OFI")),
    ("proxy failure", re.compile(r"\[Proxy|proxy", re.I)),
    ("socket failure", re.compile(r"socket", re.I)),
    ("CUDA failure", re.compile(r"Cuda failure|CUDA error|cuda", re.I)),
    ("SHARP/CollNet failure", re.compile(r"SHARP|CollNet", re.I)),
    ("system error", re.compile(r"system error|failed|failure|error|unable|couldn't|cannot", re.I)),
)

ERROR_LINE = re.compile(
    r"\bNCCL (?:error|failure)\b|\bnccl[A-Z]\w*Error\b|\bCuda failure\b|\bDistBackendError\b"
    r"|\bWorkNCCL\(.*\btiming out\b|Watchdog caught collective operation timeout"
)
"""A line that is not a WARN but reports a failed NCCL call (application or PyTorch output)."""

_TORCH_DEPRECATION = re.compile(r"Warning: Environment variable (?:TORCH_)?NCCL_\w+ is deprecated")


def benign_reason(message: str, source: str | None = None) -> str | None:
    """The benign rule a WARN matches, or None when the WARN is a failure (an error)."""
    if source and source.startswith("ras/"):
        return "RAS side service"
    for reason, pattern in BENIGN_WARNS:
        if pattern.search(message):
            return reason
    return None


def failure_kind(message: str) -> str:
    """A short name for what failed, read from an error's message ("verbs call failed", "timeout"...)."""
    for kind, pattern in _FAILURE_KINDS:
        if pattern.search(message):
            return kind
    return "failure"


def is_torch_nccl_deprecation(line: str) -> bool:
    """PyTorch's ``Warning: Environment variable NCCL_X is deprecated; use TORCH_NCCL_X`` notice."""
    return "deprecated" in line and bool(_TORCH_DEPRECATION.search(line))
