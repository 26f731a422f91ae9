"""Does an NCCL log show the fabric a profile promises? Compare parsed logs with the ``nccl:`` section.

Pure: texts, an :class:`~pytest_gpucluster.parsers.nccl_log.NcclLog` and a
:class:`~pytest_gpucluster.profiles.schema.NcclSection` in, :class:`Finding` values out, and each
finding as a `Check` (:func:`finding_checks`, :func:`agreement_check`); no I/O, no pytest, no torch.
``acceptance/test_nccl.py`` reads the files (``--nccl-log`` or a launched probe's per-rank logs),
calls `checks.nccl_logs.read_logs`, then judges the checks of :func:`check_expectation` per
expectation, of :func:`check_agreement` and of :func:`check_errors` (the failures NCCL printed) with
``results.check_all``.

Every finding carries its evidence: the log line that contradicts (or confirms) the expectation,
as ``file:line: text``, or the sentence saying which line was looked for and not found -- what an
engineer otherwise does by hand in the rank-0 log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_gpucluster.checks.nccl_hints import LOOKED_FOR, NEXT
from pytest_gpucluster.checks.nccl_logs import LogSet, clip
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.parsers.nccl_log import (
    Evidence,
    Fact,
    NcclLog,
    RankFacts,
    disagreements,
    failure_kind,
)
from pytest_gpucluster.profiles.schema import NcclSection
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = [
    "EXPECTATIONS",
    "Finding",
    "agreement_check",
    "check_agreement",
    "check_errors",
    "check_expectation",
    "check_profile",
    "error_check",
    "expectations_of",
    "finding_checks",
    "version_at_least",
    "version_tuple",
]

EXPECTATIONS = ("min_version", "network", "net_plugin", "provider", "gdr", "nvls")
"""The keys of a profile's ``nccl:`` section, in the order they are checked."""

_METRICS = {
    "min_version": "nccl.version",
    "net_plugin.min_version": "nccl.net_plugin_version",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One expectation checked against the log.

    ``evidence`` quotes the line the verdict rests on (``file:line: text``) or says which line was
    looked for and not found; ``found`` is None when the log does not say.
    """

    expectation: str  # "network", "net_plugin", "net_plugin.min_version", ..., "agreement.network"
    expected: str
    found: str | None
    evidence: str
    ok: bool
    hint: str = ""  # what to look at next when it fails
    quoted: bool = True  # evidence is a log line (False: it says what was looked for)

    @property
    def metric(self) -> str:
        """The results.json metric: ``nccl.network``, ``nccl.version``, ``nccl.agreement.network``..."""
        return _METRICS.get(self.expectation, f"nccl.{self.expectation}")

    @property
    def because(self) -> str:
        """The evidence as a clause: "the log says <file:line: text>" or "looked for ... and found no such line"."""
        return f"the log says {self.evidence}" if self.quoted else self.evidence

    @property
    def message(self) -> str:
        found = "nothing" if self.found is None else self.found
        verdict = "as expected" if self.ok else f"expected {self.expected}"
        text = f"nccl {self.expectation}: found {found}, {verdict}; {self.because}"
        return f"{text}. Next: {self.hint}" if self.hint and not self.ok else text


# --- versions -----------------------------------------------------------------------------------------

_NUMBERS = re.compile(r"\d+(?:\.\d+)*")


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``"2.27.3+cuda12.9"`` -> ``(2, 27, 3)``; ``"v1.16.2-aws"`` -> ``(1, 16, 2)``; None without digits."""
    m = _NUMBERS.search(text)
    return tuple(int(p) for p in m.group(0).split(".")) if m else None


def version_at_least(found: str, minimum: str) -> bool:
    """Whether ``found`` is at least ``minimum``, comparing the leading dotted numbers (missing parts = 0).

    ``"2.27.3+cuda12.9" >= "2.21"``; ``"2.21" >= "2.21.0"``. Raises ValueError when either has no digits.
    """
    have, want = version_tuple(found), version_tuple(minimum)
    if have is None or want is None:
        raise ValueError(f"cannot compare versions {found!r} and {minimum!r}: no x.y.z number in one of them")
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


# --- expectations -------------------------------------------------------------------------------------

Quote = Callable[[Evidence], str]


def _default_quote(ev: Evidence) -> str:
    return f"line {ev.line_no}: {clip(ev.text)}"


def expectations_of(section: NcclSection | None) -> tuple[str, ...]:
    """The expectations a profile sets, in :data:`EXPECTATIONS` order.

    ``net_plugin: null`` written in the profile is an expectation (no plugin may load); an absent
    ``net_plugin`` is not -- pydantic's ``model_fields_set`` tells the two apart.
    """
    if section is None:
        return ()
    return tuple(
        name
        for name in EXPECTATIONS
        if getattr(section, name) is not None or (name == "net_plugin" and name in section.model_fields_set)
    )


def check_profile(log: NcclLog, section: NcclSection, quote: Quote = _default_quote) -> list[Finding]:
    """Every expectation the section sets, checked against the log."""
    return [f for name in expectations_of(section) for f in check_expectation(log, section, name, quote)]


def check_expectation(
    log: NcclLog, section: NcclSection, name: str, quote: Quote = _default_quote
) -> list[Finding]:
    """The findings for one key of the ``nccl:`` section (two for a plugin with a ``min_version``)."""
    if name not in EXPECTATIONS:
        raise ValueError(f"unknown NCCL expectation {name!r}; known: {', '.join(EXPECTATIONS)}")
    if name == "min_version":
        return [_check_version(log.nccl_version, section.min_version or "", "min_version", quote)]
    if name == "network":
        return [_check_network(log, section.network or "", quote)]
    if name == "net_plugin":
        return _check_plugin(log, section, quote)
    if name == "provider":
        return [_check_equal(log.provider, section.provider or "", "provider", quote)]
    return [_check_flag(getattr(log, name), getattr(section, name), name, quote)]


def _missing(name: str, expected: str, extra: str = "") -> Finding:
    looked = f"looked for {LOOKED_FOR[name]} and found no such line{extra}"
    return Finding(name, expected, None, looked, False, NEXT.get(name, ""), quoted=False)


def _check_version(fact: Fact | None, minimum: str, name: str, quote: Quote) -> Finding:
    expected = f"at least {minimum}"
    if version_tuple(minimum) is None:
        raise ProfileError(f"nccl.{name} {minimum!r} in the profile is not a version such as '2.21'")
    if fact is None:
        return _missing(name, expected)
    found = str(fact.value)
    try:
        ok = version_at_least(found, minimum)
    except ValueError:
        ok = False
    return Finding(name, expected, found, quote(fact.evidence), ok, NEXT[name])


def _network_key(name: str) -> str:
    """Names NCCL printed for the same network over the years compare equal.

    aws-ofi-nccl called its network "AWS Libfabric" before 1.7 and "Libfabric" since; NCCL's HPC-X
    plugin appends its API version ("IBext_v8"). "IB" stays apart from "IBext": one is NCCL's own
    transport, the other a plugin, and a profile that says which it wants means it.
    """
    key = re.sub(r"_v\d+$", "", name.strip()).casefold()
    return key.removeprefix("aws ")


_BUILT_IN_NETWORKS = frozenset({"ib", "socket"})
"""Networks NCCL has without a plugin; any other name in 'Using network X' comes from one."""


def _note(fact: Fact) -> str:
    return f" ({fact.note})" if fact.note else ""


def _check_network(log: NcclLog, expected: str, quote: Quote) -> Finding:
    fact = log.network
    if fact is None:
        return _missing("network", expected)
    found = str(fact.value)
    ok = _network_key(found) == _network_key(expected)
    return Finding("network", expected, found, quote(fact.evidence) + _note(fact), ok, NEXT["network"])


def _check_equal(fact: Fact | None, expected: str, name: str, quote: Quote) -> Finding:
    if fact is None:
        return _missing(name, expected)
    found = str(fact.value)
    ok = found.casefold() == expected.casefold()
    return Finding(name, expected, found, quote(fact.evidence) + _note(fact), ok, NEXT[name])


def _yes_no(flag: bool) -> str:
    return "on" if flag else "off"


def _check_flag(fact: Fact | None, expected: bool, name: str, quote: Quote) -> Finding:
    if fact is None:
        return _missing(name, _yes_no(expected))
    ok = bool(fact.value) == expected
    return Finding(
        name,
        _yes_no(expected),
        _yes_no(bool(fact.value)),
        quote(fact.evidence) + _note(fact),
        ok,
        NEXT[name],
    )


def _plugin_text(fact: Fact) -> str:
    return fact.value.label  # "aws-ofi-nccl 1.16.2 (Libfabric)": project and version, NCCL's name


def _check_plugin(log: NcclLog, section: NcclSection, quote: Quote) -> list[Finding]:
    want = section.net_plugin
    fact = log.net_plugin
    if want is None:  # written as null: NCCL's built-in transport only
        if fact is not None:
            return [
                Finding(
                    "net_plugin",
                    "none",
                    _plugin_text(fact),
                    quote(fact.evidence),
                    False,
                    NEXT["net_plugin.none"],
                )
            ]
        net = log.network
        if net is not None and _network_key(str(net.value)) not in _BUILT_IN_NETWORKS:
            # The plugin's own load line is missing (a cut log), but only a plugin provides this network.
            found = f"a plugin providing network {net.value}"
            return [Finding("net_plugin", "none", found, quote(net.evidence), False, NEXT["net_plugin.none"])]
        said = log.net_plugin_error
        if said is not None:
            return [Finding("net_plugin", "none", "none", quote(said.evidence), True)]
        return [
            Finding(
                "net_plugin", "none", "none", "no line says an external net plugin loaded", True, quoted=False
            )
        ]
    if fact is None:
        failed = log.net_plugin_error
        if failed is not None:
            return [
                Finding("net_plugin", want.name, "none", quote(failed.evidence), False, NEXT["net_plugin"])
            ]
        return [_missing("net_plugin", want.name)]
    plugin = fact.value
    ok = plugin.matches(want.name)  # NCCL's name, the project or the library file
    found = [
        Finding("net_plugin", want.name, _plugin_text(fact), quote(fact.evidence), ok, NEXT["net_plugin"])
    ]
    if ok and want.min_version:
        version = Fact(plugin.version, fact.evidence) if plugin.version else None
        found.append(_check_version(version, want.min_version, "net_plugin.min_version", quote))
    return found


# --- every rank the same ------------------------------------------------------------------------------


def check_agreement(logs: LogSet) -> list[Finding]:
    """A finding per fact on which ranks (or per-node files) differ, naming each odd rank and its line.

    Besides the facts :func:`~pytest_gpucluster.parsers.nccl_log.disagreements` compares, a rank that
    says its plugin failed to load while others loaded one is named: a plugin on only some nodes is
    a known cause of hangs and silent slowness.
    """
    file_of = {id(rank): name for name, rank in logs.sources}
    ranks = tuple(rank for _, rank in logs.sources)

    def cite(rank: RankFacts, fact: Fact) -> str:
        return f"{file_of[id(rank)]}:{fact.evidence.line_no}: {clip(fact.evidence.text)}"

    findings = []
    for d in disagreements(NcclLog(per_rank=ranks)):
        found = "; ".join(f"{r.label} says {f.value!r}" for r, f in d.odd)
        evidence = " | ".join(cite(r, f) for r, f in d.odd[:3])
        expected = f"{d.majority!r} on every rank ({d.majority_count} say so)"
        findings.append(Finding(f"agreement.{d.fact}", expected, found, evidence, False, NEXT["agreement"]))
    loaded = [r for r in ranks if r.net_plugin is not None]
    failed = [r for r in ranks if r.net_plugin is None and r.net_plugin_error is not None]
    if loaded and failed:
        names = sorted({_plugin_text(r.net_plugin) for r in loaded if r.net_plugin})
        found = "; ".join(f"{r.label} loaded no plugin" for r in failed)
        evidence = " | ".join(cite(r, r.net_plugin_error) for r in failed[:3] if r.net_plugin_error)
        expected = f"{' or '.join(names)} loaded on every rank ({len(loaded)} loaded it)"
        findings.append(Finding("agreement.net_plugin", expected, found, evidence, False, NEXT["agreement"]))
    return findings


# --- failures NCCL printed ----------------------------------------------------------------------------

_MAX_QUOTED_ERRORS = 3


def check_errors(logs: LogSet) -> Finding:
    """NCCL printed no failure: each failing WARN or failed-call line is an error (rule: parsers.nccl_log.severity).

    The finding quotes the first line of up to three distinct errors, ``file:line: text``, and names what
    kind of failure each is; ``found`` counts them.
    """
    errors = logs.log.errors
    if not errors:
        return Finding(
            "errors",
            "no NCCL error",
            "none",
            "no NCCL WARN or error line reports a failure",
            True,
            quoted=False,
        )
    first: dict[str, Fact] = {}
    for fact in errors:
        first.setdefault(str(fact.value), fact)
    shown = list(first.values())[:_MAX_QUOTED_ERRORS]
    kinds = ", ".join(dict.fromkeys(failure_kind(str(f.value)) for f in shown))
    more = f" (and {len(first) - len(shown)} more distinct)" if len(first) > len(shown) else ""
    evidence = " | ".join(logs.quote(f.evidence) for f in shown) + more
    found = f"{len(errors)} error line(s): {kinds}"
    return Finding("errors", "no NCCL error", found, evidence, False, NEXT["errors"])


# --- findings as checks ----------------------------------------------------------------------------


def _hint(finding: Finding, origin: str, probe_nodes: int | None) -> str:
    text = f"{finding.because[0].upper()}{finding.because[1:]} (logs from {origin})"
    if finding.hint:
        text += f". Next: {finding.hint}"
    if finding.found is None and probe_nodes == 1:
        text += (
            "; the probe ran on 1 node, where NCCL may not need the network at all: pass --hostfile with "
            "2 or more hosts"
        )
    return text


def finding_checks(
    findings: Sequence[Finding], profile: str, origin: str, probe_nodes: int | None = None
) -> list[Check]:
    """One check per finding: the log agrees with the profile's key (1) or not (0).

    ``origin`` says where the logs come from; ``probe_nodes`` is the node count of a launched
    probe (None for ``--nccl-log``): on 1 node a missing network line is no surprise."""
    return [
        Check(
            f.metric,
            float(f.ok),
            "bool",
            1.0,
            "==",
            ThresholdRef(profile, ("nccl", *f.expectation.split("."))),
            labels={"expected": f.expected, "found": f.found or "not in the log"},
            hint=_hint(f, origin, probe_nodes),
        )
        for f in findings
    ]


def agreement_check(findings: Sequence[Finding], ranks: int, origin: str) -> Check:
    """Every rank loaded the same NCCL, plugin and network (1), or the facts they differ on (0)."""
    return Check(
        "nccl.ranks_agree",
        float(not findings),
        "bool",
        1.0,
        "==",
        labels={"ranks": ranks, "differ_on": ", ".join(f.expectation for f in findings) or "nothing"},
        hint=" ".join(f"{f.message}." for f in findings) + f" (logs from {origin})",
    )


def error_check(logs: LogSet, origin: str) -> Check:
    """The failing lines NCCL printed (at most 0), quoting the first few (:func:`check_errors`)."""
    finding = check_errors(logs)
    return Check(
        "nccl.errors",
        float(len(logs.log.errors)),
        "lines",
        0.0,
        "<=",
        labels={"found": finding.found or "none"},
        hint=f"{finding.message} (logs from {origin})",
    )
