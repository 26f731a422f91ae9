"""Suspects and the drain list: ``suspects.json`` and the ``scontrol`` commands that drain them.

Every burn-in check that names a node, GPU or link produces a `Suspect`. The session writes all
of them to ``<results dir>/suspects.json`` (node, reason, evidence) and prints, per suspect node,
the command an operator would run::

    scontrol update NodeName=node17 State=DRAIN Reason="gpucluster burn-in: ..."

The commands are argv lists, never shell strings (a reason may hold any character), and they are
run only when the user asked for it (``--gpucluster-drain``): the caller decides, this module
only builds and, on request, executes them. Until the run is judged the commands are the
suspects' own (provisional); once its findings are written (`write_findings`), they are the
findings' alone (`judged_drain_commands`): a suspect whose finding says ``rerun`` is not drained. A link suspect (a pair that is slow while each of
its nodes is fine against others) is listed but never drained: the cable or switch port is the
suspect, not either node.

Standard library only; no torch, no pytest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_gpucluster.atomic import write_atomic
from pytest_gpucluster.burnin import BurninError

__all__ = [
    "SUSPECTS_FILE",
    "DrainOutcome",
    "Suspect",
    "SuspectLog",
    "clear_suspects",
    "drain_argv",
    "drain_commands",
    "drain_list_due",
    "drain_listed",
    "drains",
    "finding_of",
    "judged_drain_commands",
    "listed_drain_commands",
    "read_suspects",
    "run_drain",
    "slurm_reason",
    "write_findings",
    "write_suspects",
]

SUSPECTS_FILE = "suspects.json"
SCHEMA_VERSION = 1
REASON_PREFIX = "gpucluster burn-in: "
MAX_REASON = 200
"""Slurm keeps the reason as one string; long ones are cut so ``sinfo -R`` stays readable."""
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A single Slurm node name. Commas, brackets and spaces would make scontrol drain a list or
range of nodes, so they are refused rather than passed on."""

Kind = Literal["node", "gpu", "link"]
DRAINING_ACTIONS = ("drain node", "reset GPU", "RMA", "reseat/replace cable or NIC")
"""The next actions (``results/findings.py``) that take the host out of scheduling first; a finding
on a link between two nodes names no single host, so neither is drained for it."""


@dataclass(frozen=True, slots=True)
class Suspect:
    """A node, a GPU of a node, or the link between two nodes that a burn-in check named."""

    node: str
    reason: str
    """One sentence with the numbers: what was measured, against what."""
    check: str
    """The check that named it: ``straggler``, ``pairwise``, ``health``, ``counters``, ``drift``."""
    kind: Kind = "node"
    peer: str | None = None
    """The other end of a link suspect."""
    rank: int | None = None
    gpu: str | None = None
    """The GPU of a gpu suspect, e.g. ``GPU 3 (00000000:3B:00.0)``."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    """The test that found it (its node id)."""

    @property
    def drainable(self) -> bool:
        return self.kind != "link"

    def where(self) -> str:
        if self.kind == "link":
            return f"link {self.node} <-> {self.peer}"
        if self.kind == "gpu" and self.gpu:
            return f"{self.gpu} of {self.node}"
        return f"node {self.node}" + (f" (rank {self.rank})" if self.rank is not None else "")

    def line(self) -> str:
        return f"{self.where()}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.node,
            "kind": self.kind,
            "check": self.check,
            "reason": self.reason,
            "evidence": dict(self.evidence),
        }
        for name in ("peer", "rank", "gpu"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.source:
            out["source"] = self.source
        if self.drainable:
            out["drain_command"] = drain_argv(self.node, self.reason)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Suspect:
        return cls(
            node=str(data["node"]),
            reason=str(data["reason"]),
            check=str(data.get("check", "")),
            kind=data.get("kind", "node"),
            peer=data.get("peer"),
            rank=data.get("rank"),
            gpu=data.get("gpu"),
            evidence=dict(data.get("evidence") or {}),
            source=str(data.get("source", "")),
        )

    def key(self) -> tuple[Any, ...]:
        return (self.kind, self.node, self.peer, self.gpu, self.check, self.reason)


def _check_node_name(node: str) -> str:
    if not _NODE_NAME.fullmatch(node):
        raise BurninError(
            f"cannot build a drain command for node {node!r}: a Slurm node name is letters, digits, "
            "'.', '_' and '-' (a list or range such as 'n[1-3]' would drain several nodes)"
        )
    return node


def slurm_reason(text: str) -> str:
    """``text`` as Slurm keeps a node's reason: one line (a newline would end it), white space
    folded, cut to `MAX_REASON` characters with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def drain_argv(node: str, reason: str, *, prefix: str = REASON_PREFIX) -> list[str]:
    """``["scontrol", "update", "NodeName=<node>", "State=DRAIN", "Reason=<prefix><reason>"]``.

    ``prefix`` says who drained the node; ``gpucluster health-check`` passes ``""`` because its
    reason line already starts with ``gpucluster health-check on <node>:``.
    """
    text = slurm_reason(prefix + reason)
    return ["scontrol", "update", f"NodeName={_check_node_name(node)}", "State=DRAIN", f"Reason={text}"]


def drain_commands(suspects: Iterable[Suspect]) -> list[list[str]]:
    """One drain command per suspect node (first the node's first reason, then how many more)."""
    reasons: dict[str, list[str]] = {}
    for suspect in suspects:
        if suspect.drainable:
            reasons.setdefault(suspect.node, [])
            if suspect.reason not in reasons[suspect.node]:
                reasons[suspect.node].append(suspect.reason)
    commands = []
    for node, texts in reasons.items():
        more = f" (+{len(texts) - 1} more in suspects.json)" if len(texts) > 1 else ""
        commands.append(drain_argv(node, texts[0] + more))
    return commands


def shell_line(argv: Sequence[str]) -> str:
    """For people to copy: the argv quoted as one shell line (never executed as one)."""
    return shlex.join(argv)


@contextlib.contextmanager
def _locked(path: Path) -> Any:
    """pytest-xdist workers add to the same file: hold an exclusive flock while merging."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_drain_list(path: Path) -> dict[str, Any] | None:
    """The drain list's JSON object; None when there is no file. Unreadable or not JSON: an error
    naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise BurninError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def read_suspects(path: Path) -> list[Suspect]:
    """The suspects in ``path``; an absent file has none. A damaged one is an error naming it."""
    data = _read_drain_list(path)
    if data is None:
        return []
    if not isinstance(data.get("suspects"), list):
        raise BurninError(f"{path} has no 'suspects' list; it was not written by pytest-gpucluster")
    try:
        return [Suspect.from_json(item) for item in data["suspects"]]
    except (KeyError, TypeError) as exc:
        raise BurninError(f"{path}: a suspect entry lacks {exc}") from None


def write_suspects(path: Path, suspects: Iterable[Suspect]) -> list[Suspect]:
    """Add ``suspects`` to ``path`` (merged with what is there, duplicates dropped), atomically.

    Returns every suspect now in the file. The file always exists afterwards, so an operator can
    tell "no suspects" (an empty list) from "burn-in did not run" (no file).
    """
    with _locked(path):
        merged = read_suspects(path)
        seen = {s.key() for s in merged}
        for suspect in suspects:
            if suspect.key() not in seen:
                merged.append(suspect)
                seen.add(suspect.key())
        _write_payload(path, merged, _stored_findings(path))
    return merged


def _stored_findings(path: Path) -> list[dict[str, Any]] | None:
    """The run's findings in the drain list; None while the run has not been judged yet."""
    try:
        data = _read_drain_list(path) or {}
    except BurninError:
        return None
    findings = data.get("findings")
    return list(findings) if isinstance(findings, list) else None


def finding_of(suspect: Suspect, findings: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run's finding that judged ``suspect``: the one of its test (``test_id`` = the suspect's
    ``source``) on its node (``results/findings.py``, `findings_of`, turns every suspect into a
    finding of its own or counts it under a failed value of its test that names the same host)."""
    if suspect.kind == "link":
        return None
    for finding in findings:
        if finding.get("test_id", "") == suspect.source and finding.get("host") == suspect.node:
            return finding
    return None


def drains(finding: Mapping[str, Any] | None) -> bool:
    """Whether a finding takes its host out of scheduling: a host, and an action of
    `DRAINING_ACTIONS`. A ``rerun`` (or ``fix node setup``) finding never drains."""
    return finding is not None and finding.get("action") in DRAINING_ACTIONS and bool(finding.get("host"))


def drain_list_due(path: Path, findings: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a run's findings go into the drain list at ``path``: it exists (burn-in wrote one),
    or a finding drains its host."""
    return path.exists() or any(drains(f) for f in findings)


def judged_drain_commands(
    suspects: Sequence[Suspect], findings: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """The drain list once the run is judged: one command per host that a finding drains
    (`drains`), and no other. The run's findings are the one judgement (ARCHITECTURE: the report,
    results.json and the drain list say the same thing): a suspect whose finding says ``threshold;
    rerun`` (one of two ranks below a floor, every peer missing alike) stays listed in suspects.json
    but drains nothing; a host drained carries the reasons of the suspects its draining findings
    judged, else the finding's metric and action."""
    kept = [s for s in suspects if s.drainable and drains(finding_of(s, findings))]
    commands = drain_commands(kept)
    drained = {argv[2] for argv in commands}
    for finding in findings:
        host = finding.get("host")
        if drains(finding) and f"NodeName={host}" not in drained:
            with contextlib.suppress(BurninError):  # not a Slurm node name: listed, never drained
                commands.append(drain_argv(str(host), f"{finding.get('metric')}: {finding.get('action')}"))
                drained.add(f"NodeName={host}")
    return commands


def _judged_suspect(suspect: Suspect, findings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A suspect as the judged drain list shows it: ``drained``, and the finding's reason class and
    action; the ``drain_command`` only on a suspect that is drained."""
    out = suspect.to_json()
    finding = finding_of(suspect, findings)
    out["drained"] = suspect.drainable and drains(finding)
    if finding is not None:
        why = f": {finding['why']}" if finding.get("why") else ""
        out["judged"] = f"{finding.get('reason')}; {finding.get('action')}{why}"
    if not out["drained"]:
        out.pop("drain_command", None)
    return out


def _write_payload(
    path: Path, suspects: Sequence[Suspect], findings: Sequence[Mapping[str, Any]] | None
) -> None:
    """``findings`` None: the run is not judged yet, and the drain commands are the suspects'
    (provisional: nothing drains before the end of the session). Judged: `judged_drain_commands`."""
    payload: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    if findings is None:
        payload["suspects"] = [s.to_json() for s in suspects]
        payload["drain_commands"] = drain_commands(suspects)
    else:
        payload["suspects"] = [_judged_suspect(s, findings) for s in suspects]
        payload["drain_commands"] = judged_drain_commands(suspects, findings)
        payload["findings"] = [dict(f) for f in findings]
    write_atomic(path, json.dumps(payload, indent=1, default=str))


def clear_suspects(path: Path, cleared: Iterable[str]) -> list[Suspect]:
    """Drop the suspects on ``cleared`` nodes (their retest passed, ``results/retest.py``) from
    ``path``; returns those left. A missing file stays missing."""
    gone = set(cleared)
    if not gone or not path.exists():
        return read_suspects(path)
    with _locked(path):
        kept = [s for s in read_suspects(path) if s.node not in gone]
        _write_payload(path, kept, _stored_findings(path))
    return kept


def write_findings(path: Path, findings: Sequence[Mapping[str, Any]]) -> None:
    """Put a run's findings (``Finding.to_json``: reason class and next action each) in the drain
    list beside its suspects, and from then on derive its drain commands from them alone
    (`judged_drain_commands`): a command for each host whose action needs it drained (a GPU to
    reset or return, a node, a port of the node), none for a suspect judged ``rerun``. The report,
    results.json and the drain list say the same thing. The findings replace those of an earlier call."""
    with _locked(path):
        _write_payload(path, read_suspects(path), findings)


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    argv: tuple[str, ...]
    returncode: int | None
    """None when the command could not be started (no scontrol here)."""
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def line(self) -> str:
        if self.returncode is None:
            return f"could not run {shell_line(self.argv)}: {self.output}"
        status = "done" if self.ok else f"FAILED with exit code {self.returncode}"
        tail = f": {self.output.strip()}" if self.output.strip() else ""
        return f"{status}: {shell_line(self.argv)}{tail}"


Runner = Callable[..., subprocess.CompletedProcess[str]]


def run_drain(
    commands: Iterable[Sequence[str]], *, run: Runner = subprocess.run, timeout_s: float = 30.0
) -> list[DrainOutcome]:
    """Run each drain command (argv, no shell); one failing does not stop the others."""
    outcomes = []
    for argv in commands:
        argv = tuple(argv)
        try:
            done = run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            outcomes.append(DrainOutcome(argv, None, f"{type(exc).__name__}: {exc}"))
            continue
        outcomes.append(DrainOutcome(argv, done.returncode, (done.stdout or "") + (done.stderr or "")))
    return outcomes


class SuspectLog:
    """A session's suspects: added to ``suspects.json`` as they are found, listed (and, when asked,
    drained) when the session ends. The file exists from the start: "no suspects" is an answer."""

    def __init__(self, results_dir: Path) -> None:
        self.path = results_dir / SUSPECTS_FILE
        self.found: list[Suspect] = []
        write_suspects(self.path, [])

    def add(self, suspects: Iterable[Suspect], source: str) -> None:
        """Record ``suspects`` found by the test ``source`` (its node id)."""
        named = [dataclasses.replace(s, source=source) for s in suspects]
        self.found += named
        write_suspects(self.path, named)

    def finish(self, write: Callable[[str], None]) -> None:
        """Say who is suspect. Which of them are drained waits for the end of the session, when the
        run's findings judge them (`judged_drain_commands`; `drain_listed` runs the commands)."""
        if not self.found:
            write(f"burn-in: no suspect node ({self.path})")
            return
        write(f"burn-in: {len(self.found)} suspect(s), written to {self.path}:")
        for suspect in self.found:
            write(f"  {suspect.line()}")
        if any(s.drainable for s in self.found):
            write(
                "burn-in: the run's findings decide at the end of the session which hosts are drained "
                f"(a finding whose action is rerun drains nothing): the drain_commands of {self.path} "
                "(run by --gpucluster-drain)"
            )


def listed_drain_commands(path: Path) -> list[list[str]]:
    """The drain commands the drain list at ``path`` holds: one per host that a suspect or a finding
    needs drained (`_write_payload`). No file: none. A damaged one is an error naming it."""
    data = _read_drain_list(path)
    if data is None:
        return []
    commands = data.get("drain_commands")
    if not isinstance(commands, list) or not all(
        isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv) for argv in commands
    ):
        raise BurninError(f"{path}: 'drain_commands' is not a list of argv lists of strings")
    return [list(argv) for argv in commands]


def drain_listed(path: Path, *, run: Runner = subprocess.run) -> list[str]:
    """``--gpucluster-drain`` at the end of a session: run every command of the drain list (the
    burn-in's suspects and the findings whose next action takes a host out of scheduling), once
    each, in the controller; the lines say what was done. Argv lists, never a shell."""
    try:
        commands = listed_drain_commands(path)
    except BurninError as exc:
        return [f"drain (--gpucluster-drain): nothing drained: {exc}"]
    if not commands:
        return [f"drain (--gpucluster-drain): no host to drain ({path})"]
    lines = [f"drain (--gpucluster-drain): {len(commands)} host(s) from {path}:"]
    lines += [f"  {outcome.line()}" for outcome in run_drain(commands, run=run)]
    return lines
