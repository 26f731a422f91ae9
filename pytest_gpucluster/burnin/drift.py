"""Version drift: every node's driver, CUDA, NCCL, net plugin, torch and firmware versions, against
the profile's pins and bounds and against each other.

Input: one fingerprint per node, ``{"driver": "550.54.15", "nccl": "2.21.5", "torch": "2.4.1", ...}``
(`workloads._node_facts.versions` on the rank side; :func:`node_fingerprints` folds the ranks of a
node into one; :func:`nccl_log_fingerprints` reads NCCL, CUDA and net plugin versions from
recorded ``NCCL_DEBUG=INFO`` logs). Two checks:

- **Pins and bounds** from the profile's ``versions:`` mapping: ``"2.21.5"`` (exactly; a local
  suffix such as ``+cu124`` is ignored, as PEP 440 does), ``">=550"``, ``">=2.18,<2.23"``,
  ``"2.21.*"``, ``"!=2.19.3"``. A value that is not a version (a plugin name) is compared as an
  exact string. A pin on a name no node reports is itself a finding: a typo such as ``ncll``
  must not switch the check off.
- **Agreement**: every node must report the same value for every name, even where the profile is
  silent. The most common value is the reference and every node that differs is named; when the
  nodes split evenly there is no majority and every group is named. Ranks of one node that
  disagree (two GPUs with different VBIOS) are named too.

Pure: standard library and ``packaging`` (a pytest dependency); no torch, no pytest.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.parsers.nccl_log import Facts, NcclLog

__all__ = [
    "DriftFinding",
    "VersionPin",
    "check_agreement",
    "check_pins",
    "fleet_versions",
    "nccl_log_fingerprints",
    "node_fingerprints",
    "parse_pin",
]

_OPERATORS = ("==", "!=", ">=", "<=", "~=", ">", "<", "===")


@dataclass(frozen=True, slots=True)
class VersionPin:
    """One entry of the profile's ``versions:``: a PEP 440 specifier set or an exact string."""

    name: str
    text: str
    specifier: SpecifierSet | None
    """None: the pin is not a version spec and is compared as an exact string."""

    def allows(self, value: str) -> bool:
        """True when ``value`` satisfies the pin; a non-version value fails a version pin."""
        if self.specifier is None:
            return value == self.text
        try:
            version = Version(value)
        except InvalidVersion:
            return False
        return self.specifier.contains(version, prereleases=True)


def parse_pin(name: str, text: str) -> VersionPin:
    """``"2.21.5"`` -> ``==2.21.5``; ``">=550"`` and ``">=2.18,<2.23"`` as written."""
    spec = str(text).strip()
    if not spec:
        raise BurninError(f"versions.{name} is empty; write e.g. '>=550' or '2.21.5'")
    clauses = [c.strip() for c in spec.split(",")]
    has_operator = any(c.startswith(_OPERATORS) for c in clauses)
    if not has_operator and len(clauses) == 1 and not re.match(r"\d", spec):
        return VersionPin(name, spec, None)  # a name, not a version: exact match
    normalized = ",".join(c if c.startswith(_OPERATORS) else f"=={c}" for c in clauses)
    try:
        return VersionPin(name, spec, SpecifierSet(normalized))
    except InvalidSpecifier:
        raise BurninError(
            f"versions.{name}: {spec!r} is not a version pin or bound; write e.g. '2.21.5', '>=550', "
            "'>=2.18,<2.23' or '2.21.*'"
        ) from None


@dataclass(frozen=True, slots=True)
class DriftFinding:
    """One node (or group of nodes) whose version is wrong, with the sentence that says so."""

    name: str
    """The version's name: driver, cuda, nccl, torch, ..."""
    nodes: tuple[str, ...]
    value: str | None
    expected: str
    kind: str
    """``pin``, ``agreement``, ``unknown`` (a pin on a name nobody reports) or ``within-node``."""
    message: str

    def suspects(self) -> list[Suspect]:
        evidence = {"name": self.name, "value": self.value, "expected": self.expected}
        return [Suspect(node=n, check="drift", reason=self.message, evidence=evidence) for n in self.nodes]


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def check_pins(fingerprints: Mapping[str, Mapping[str, Any]], pins: Mapping[str, str]) -> list[DriftFinding]:
    """Every node whose value misses a profile pin, one finding per (name, value)."""
    findings: list[DriftFinding] = []
    known = sorted({k for fp in fingerprints.values() for k in fp})
    for name, text in pins.items():
        pin = parse_pin(name, text)
        if not any(name in fp for fp in fingerprints.values()):
            findings.append(
                DriftFinding(
                    name, tuple(fingerprints), None, pin.text, "unknown",
                    f"the profile pins versions.{name}: {pin.text!r}, but no node reports a version named "
                    f"{name!r} (reported: {', '.join(known) or 'none'})",
                )
            )  # fmt: skip
            continue
        bad: dict[str | None, list[str]] = {}
        for node, fp in fingerprints.items():
            value = fp.get(name)
            if value is None or not pin.allows(str(value)):
                bad.setdefault(None if value is None else str(value), []).append(node)
        for value, nodes in bad.items():
            plural = "s" if len(nodes) > 1 else ""
            has = "have" if plural else "has"
            what = (
                f"report{'' if plural else 's'} no {name} version"
                if value is None
                else f"{has} {name} {value}"
            )
            findings.append(
                DriftFinding(
                    name, tuple(nodes), value, pin.text, "pin",
                    f"node{plural} {', '.join(nodes)} {what}; the profile requires {name} {pin.text}",
                )
            )  # fmt: skip
    return findings


def check_agreement(
    fingerprints: Mapping[str, Mapping[str, Any]], ignore: Iterable[str] = ()
) -> list[DriftFinding]:
    """Every name on which the nodes disagree: the odd nodes out, named against the majority."""
    findings: list[DriftFinding] = []
    skip = set(ignore)
    names = sorted({k for fp in fingerprints.values() for k in fp} - skip)
    for name in names:
        groups: dict[str | None, list[str]] = {}
        for node, fp in fingerprints.items():
            value = fp.get(name)
            groups.setdefault(None if value is None else str(value), []).append(node)
        if len(groups) < 2:
            continue
        counts = Counter({v: len(n) for v, n in groups.items()})
        (top, top_n), *rest = counts.most_common()
        tie = any(n == top_n for _, n in rest)
        summary = "; ".join(f"{_shown(v)} on {', '.join(groups[v])}" for v, _ in counts.most_common())
        if tie:
            for value, nodes in groups.items():
                findings.append(
                    DriftFinding(
                        name, tuple(nodes), value, "the same on every node", "agreement",
                        f"the nodes disagree on {name} with no majority: {summary}",
                    )
                )  # fmt: skip
            continue
        for value, nodes in groups.items():
            if value == top:
                continue
            plural = "s" if len(nodes) > 1 else ""
            findings.append(
                DriftFinding(
                    name, tuple(nodes), value, _shown(top), "agreement",
                    f"node{plural} {', '.join(nodes)} {'have' if plural else 'has'} {name} {_shown(value)} where "
                    f"most nodes ({top_n} of {len(fingerprints)}) have {_shown(top)} ({summary})",
                )
            )  # fmt: skip
    return findings


def node_fingerprints(
    rank_values: Sequence[Mapping[str, Any]], key: str = "versions"
) -> tuple[dict[str, dict[str, Any]], list[DriftFinding]]:
    """Per-rank fingerprints (``value[key]``, with ``host`` and ``rank``) folded into one per node;
    ranks of a node that disagree are findings (``within-node``) and the name is left out."""
    per_node: dict[str, dict[str, dict[str | None, list[int]]]] = {}
    for value in sorted(rank_values, key=lambda v: int(v["rank"])):
        host = str(value.get("host") or f"rank {value['rank']}")
        for name, version in (value.get(key) or {}).items():
            seen = per_node.setdefault(host, {}).setdefault(name, {})
            seen.setdefault(None if version is None else str(version), []).append(int(value["rank"]))
    merged: dict[str, dict[str, Any]] = {}
    findings: list[DriftFinding] = []
    for host, names in per_node.items():
        merged[host] = {}
        for name, values in names.items():
            if len(values) == 1:
                only = next(iter(values))
                merged[host][name] = only
                continue
            detail = "; ".join(
                f"{_shown(v)} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
                for v, r in values.items()
            )
            findings.append(
                DriftFinding(
                    name, (host,), None, "the same on every rank of the node", "within-node",
                    f"the ranks of {host} disagree on {name}: {detail}",
                )
            )  # fmt: skip
    return merged, findings


def _facts_versions(facts: Facts, fallback: Facts | None = None) -> dict[str, str | None]:
    def value(name: str) -> Any:
        fact = getattr(facts, name) or (getattr(fallback, name) if fallback is not None else None)
        return None if fact is None else fact.value

    out: dict[str, str | None] = {}
    nccl = value("nccl_version")
    if nccl is not None:
        release, _, build = str(nccl).partition("+")
        out["nccl"] = release
        if build.startswith("cuda"):
            out["nccl_cuda"] = build.removeprefix("cuda")
    driver = value("cuda_driver_version")
    if driver is not None:
        code = int(driver)
        out["cuda_driver"] = f"{code // 1000}.{code % 1000 // 10}"
    plugin = value("net_plugin")
    if plugin is not None:
        out["net_plugin"] = plugin.project or plugin.name  # aws-ofi-nccl, not NCCL's "Libfabric"
        if plugin.version:
            out["net_plugin_version"] = plugin.version
    return out


def nccl_log_fingerprints(
    logs: Sequence[tuple[str, NcclLog]],
) -> tuple[dict[str, dict[str, Any]], list[DriftFinding]]:
    """Per host: ``nccl`` (and ``nccl_cuda``, the CUDA it was built for), ``cuda_driver`` and
    ``net_plugin`` (``net_plugin_version``) from parsed ``NCCL_DEBUG=INFO`` logs.

    Every rank prints its CUDA driver version, but NCCL prints its own version once per job, on
    rank 0 and often without the host prefix: a log's version then stands for every host in that
    log. Per-node versions therefore need one log per node, such as the single-node jobs of the
    burn-in's intra-node phase write. Returns the fingerprints and the within-node findings.
    """
    pseudo: list[dict[str, Any]] = []
    for name, log in logs:
        ranks = [r for r in log.per_rank if r.host] or []
        if not ranks:
            pseudo.append({"rank": len(pseudo), "host": name, "versions": _facts_versions(log)})
        for rank in ranks:
            pseudo.append({"rank": len(pseudo), "host": rank.host, "versions": _facts_versions(rank, log)})
    return node_fingerprints(pseudo)


def fleet_versions(
    rank_values: Sequence[Mapping[str, Any]],
    pins: Mapping[str, str],
    logs: Sequence[tuple[str, NcclLog]] = (),
) -> tuple[dict[str, dict[str, Any]], list[DriftFinding]]:
    """Every node's versions (the ranks' own, completed by NCCL's word in ``logs``) and every
    finding: ranks of a node that disagree, pins missed, and nodes that differ from the others."""
    fingerprints, findings = node_fingerprints(rank_values)
    if logs:
        from_logs, log_findings = nccl_log_fingerprints(logs)
        findings += log_findings
        for host, versions in from_logs.items():
            fingerprints.setdefault(host, {}).update(versions)
    findings += check_pins(fingerprints, pins) + check_agreement(fingerprints)
    return fingerprints, findings
