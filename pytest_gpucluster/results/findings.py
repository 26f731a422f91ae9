"""Failures as findings: what failed, where, by how much, why, and what to do next.

A `Finding` is one failure of a run as an operator acts on it: the metric, the host, the GPU or
port it names, the measured value against its threshold and the profile key that threshold comes
from, a **reason class** and the **next action** from one ladder. `findings_of` builds them from a
run's measurements and test outcomes (pure: the same run always gives the same findings, so
``gpucluster report`` rebuilds them from any results.json, old ones included).

Reason classes (`REASONS`):

- ``hardware`` — a named host, GPU or port misses while most of its peers (the same metric, scope
  and point on the other hosts/GPUs/ports; `MIN_PEERS` or more) pass, or a health metric that only hardware fails (ECC,
  XID, remapped rows, link state, port errors, PCIe width...) failed.
- ``threshold`` — the value missed its threshold alike across the fleet (more than half of its
  peers missed too), or no peer can tell: a cluster-wide value (an inter-node sweep, scaling,
  SFT). Either the profile's number does not fit this hardware/site or the whole fabric is slow;
  the profile key in ``source`` is what to review.
- ``workload failed`` — a test failed with no value below its threshold: the job could not run, a
  rank crashed or hung, a wrong result.
- ``not measured`` — the profile sets a threshold the run has no value for, or the value is a
  broken measurement (above the physical ceiling of its path): a set-up gap, never a pass.
- ``node setup`` — a node readiness check (`checks.readiness`) failed on something an operator
  fixes without touching hardware: a service, a kernel module, a limit, a BIOS setting. Its
  ``fix`` says exactly what (``start nvidia-fabricmanager``, ``load nvidia_peermem``).

The action ladder (`LADDER`), cheapest first; a finding gets the lowest rung that its evidence
supports, and an operator climbs one rung when the same finding comes back after the action:

1. ``rerun`` — the run (or the named test) once more: every threshold, workload and not-measured
   finding, after fixing what its message names (set-up, profile key).
2. ``fix node setup`` — do the finding's ``fix`` on the node (start a service, load a module,
   raise a limit, change a BIOS setting), then rerun: node readiness findings of class ``node setup``.
3. ``drain node`` — take the host out of scheduling (``scontrol update ... State=DRAIN``): a host
   that misses while its peers pass and no GPU or port is named.
4. ``reset GPU`` — ``nvidia-smi -r`` on the drained node: a GPU that misses while its peers pass,
   or a GPU health counter (uncorrected ECC, XID under load, clocks, throttling).
5. ``reseat/replace cable or NIC`` — a port or a link (a pair of nodes) that is down, slow or
   counting errors.
6. ``RMA`` — return the part: a GPU whose memory can no longer be repaired (row-remap failure,
   retired pages), or any hardware finding that persists after the rungs above.

Node readiness findings carry their rung and their ``fix`` from `checks.readiness.REMEDIES` (a
pending row remap: ``reset GPU``, fix "reset GPU to apply pending row remaps"). A symptom (an
NVLink, GPUDirect or busbw value that failed) on a node with a failed readiness check names it as
its likely ``cause``: "GPUDirect off on gpu-node-017: nvidia_peermem not loaded".

Pure data; no pytest, no I/O.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.checks.readiness import REMEDIES, cause_of, readiness_causes
from pytest_gpucluster.results.model import PREFLIGHT_TEST_ID, SET_ASIDE_METRIC, Measurement, TestOutcome
from pytest_gpucluster.results.text import failure_message, format_value

__all__ = [
    "ACTIONS",
    "LADDER",
    "REASONS",
    "Action",
    "Finding",
    "ReasonClass",
    "findings_of",
    "host_of",
    "problem_of",
]

ReasonClass = Literal["hardware", "threshold", "workload failed", "not measured", "node setup"]
Action = Literal["rerun", "fix node setup", "drain node", "reset GPU", "reseat/replace cable or NIC", "RMA"]
REASONS: tuple[ReasonClass, ...] = ("hardware", "node setup", "threshold", "workload failed", "not measured")
LADDER: tuple[Action, ...] = (
    "rerun", "fix node setup", "drain node", "reset GPU", "reseat/replace cable or NIC", "RMA"
)  # fmt: skip
ACTIONS: Mapping[Action, str] = {
    "rerun": "run it again after fixing what the message names; climb the ladder if it comes back",
    "fix node setup": "do the finding's fix on the node (start a service, load a module, raise a limit, "
    "change a BIOS setting), then rerun",
    "drain node": "drain the host (scontrol update NodeName=<host> State=DRAIN) and look at it",
    "reset GPU": "drain the host, reset the GPU (nvidia-smi -r -i <gpu>) and rerun its burn-in",
    "reseat/replace cable or NIC": "reseat or replace the cable, transceiver or NIC of the port/link",
    "RMA": "return the part to the vendor (it cannot be repaired in place)",
}
"""What each rung means to an operator (the report prints it beside the findings)."""

HOST_LABELS = ("host", "node")
GPU_LABELS = ("gpu",)
WHO_LABELS = ("host", "node", "gpu", "rank", "device", "port", "pair", "peer")
"""Labels that say who a value belongs to; the rest say which point it is (size, case...)."""
HARDWARE_METRICS = (
    "burnin.ecc_",
    "burnin.xid",
    "burnin.remapped_rows",
    "burnin.retired_pages",
    "burnin.row_remap_failure",
    "burnin.dcgm",
    "burnin.pcie_",
    "burnin.throttle",
    "burnin.gpu_clock_violation",
    "burnin.gpu_temperature",
    "burnin.counter_increases",
    "fabric.",
    "nvlink.links_up",
    "nvlink.link_speed",
    "inventory.gpus_per_node",
    "inventory.gpus_matching_model",
    "numerics.agreement",  # bits unlike the majority's, or unlike its own earlier runs, or a wrong
    "numerics.repeat_stability",  # answer: silent data corruption, whether or not peers failed too
    "numerics.known_answer",
)
"""Metrics only hardware fails: their failure is a hardware finding even with no peer to compare."""
MIN_PEERS = 3
"""A value is an outlier (hardware) only when at least this many peers were judged and most of them
passed: one of two ranks being slow on a shared machine says nothing about which one is broken."""
RMA_METRICS = ("burnin.row_remap_failure", "burnin.retired_pages")
PORT_METRICS = ("fabric.", "burnin.pair_", "burnin.soak.")
"""Metrics whose ``device``/``port``/``pair`` labels name a NIC port, an interface or a link between
two nodes (elsewhere a "pair" may be two transports, a device a GPU)."""
_NOT_MEASURED = ("not measured", "broken measurement")


@dataclass(frozen=True, slots=True)
class Finding:
    """One failure as an operator acts on it (module docstring: reason classes and the ladder)."""

    metric: str
    """The metric, or the test id for a workload that failed without a value."""
    reason: ReasonClass
    action: Action
    why: str
    """Why this class and action, in one sentence (peers that passed, a health counter...)."""
    host: str | None = None
    gpu: str | None = None
    port: str | None = None
    """A NIC port (``mlx5_0 port 1``), an interface, or a link (``node-a <-> node-b``)."""
    measured: float | None = None
    threshold: float | None = None
    comparison: str = ""
    unit: str = ""
    source: str = ""
    """Where the threshold comes from: ``profile h200: collectives.checks[0].min_busbw``, or the
    rule of the check when the profile has no key for it."""
    scope: str | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)
    test_id: str = ""
    message: str = ""
    """The raw failure text (the check's failure sentence or the test's message)."""
    problem: str | None = None
    """``not measured`` / ``broken measurement`` when the check said so."""
    fix: str | None = None
    """The concrete action of a readiness finding: ``start nvidia-fabricmanager``."""
    cause: str | None = None
    """For a symptom, the failed readiness check on its node that likely explains it."""

    @property
    def component(self) -> str | None:
        """The GPU or port named, else the rank (``rank 3``) where the value names one."""
        if self.gpu:  # an index ("3"), or a suspect's own name ("GPU 1 (00000000:2a:00.0)")
            return self.gpu if str(self.gpu).startswith("GPU ") else f"GPU {self.gpu}"
        if self.port:
            return self.port
        rank = self.labels.get("rank")
        return None if rank is None else f"rank {rank}"

    def where(self) -> str:
        return ", ".join(p for p in (self.host, self.component) if p) or "cluster"

    def value_text(self) -> str:
        if self.measured is None:
            return "n/a"
        return format_value(self.measured, self.unit)

    def threshold_text(self) -> str:
        if self.threshold is None:
            return "-"
        return f"{self.comparison} {format_value(self.threshold, self.unit)}"

    def line(self) -> str:
        """One line for a terminal or a drain reason: where, what, measured vs threshold, action."""
        what = self.metric + (f" [{self.scope}]" if self.scope else "")
        values = (
            f": {self.value_text()} (expected {self.threshold_text()})" if self.threshold is not None else ""
        )
        fix = f": {self.fix}" if self.fix else ""
        cause = f" (likely cause: {self.cause})" if self.cause else ""
        return f"{self.where()}: {what}{values}{cause} -> {self.reason}; {self.action}{fix}"

    @property
    def rank(self) -> int:
        """The action's rung on the ladder (0: rerun ... 4: RMA)."""
        return LADDER.index(self.action)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.metric,
            "reason": self.reason,
            "action": self.action,
            "why": self.why,
            "where": self.where(),
        }
        for name in ("host", "gpu", "port", "scope", "test_id", "problem", "fix", "cause"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.measured is not None or self.threshold is not None:
            out.update(
                measured=self.measured,
                threshold=self.threshold,
                comparison=self.comparison,
                unit=self.unit,
                source=self.source,
            )
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.message:
            out["message"] = self.message
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        reason, action = data.get("reason"), data.get("action")
        if reason not in REASONS:
            raise ValueError(f"a finding's reason must be one of {', '.join(REASONS)}, got {reason!r}")
        if action not in LADDER:
            raise ValueError(f"a finding's action must be one of {', '.join(LADDER)}, got {action!r}")
        return cls(
            metric=str(data["metric"]),
            reason=reason,
            action=action,
            why=str(data.get("why", "")),
            host=data.get("host"),
            gpu=data.get("gpu"),
            port=data.get("port"),
            measured=data.get("measured"),
            threshold=data.get("threshold"),
            comparison=str(data.get("comparison", "")),
            unit=str(data.get("unit", "")),
            source=str(data.get("source", "")),
            scope=data.get("scope"),
            labels=dict(data.get("labels") or {}),
            test_id=str(data.get("test_id", "")),
            message=str(data.get("message", "")),
            problem=data.get("problem"),
            fix=data.get("fix"),
            cause=data.get("cause"),
        )


def problem_of(m: Measurement) -> str | None:
    """Why the check could not be judged (``Check.problem``: not measured, broken measurement)."""
    if m.problem:
        return str(m.problem)
    if m.failed and not m.measured:  # a NaN under a threshold read from an old file
        return "not measured"
    return None


def host_of(labels: Mapping[str, Any]) -> str | None:
    for name in HOST_LABELS:
        value = labels.get(name)
        if value not in (None, "", "all"):
            return str(value)
    return None


def gpu_of(labels: Mapping[str, Any]) -> str | None:
    for name in GPU_LABELS:
        value = labels.get(name)
        if value not in (None, "", "all"):
            return str(value)
    return None


def port_of(metric: str, labels: Mapping[str, Any]) -> str | None:
    if not metric.startswith(PORT_METRICS):
        return None
    if labels.get("pair"):
        return f"link {labels['pair']}"
    if labels.get("peer") and host_of(labels):
        return f"link {host_of(labels)} <-> {labels['peer']}"
    device = labels.get("device")
    if labels.get("port") not in (None, ""):
        return f"{device} port {labels['port']}" if device else f"port {labels['port']}"
    return str(device) if device else None


def _point(m: Measurement) -> tuple[str, str, str]:
    """The peer group of a value: metric, scope and every label that is not who it belongs to."""
    rest = ",".join(f"{k}={m.labels[k]}" for k in sorted(m.labels) if k not in WHO_LABELS)
    return (m.metric, m.scope or "", rest)


def _source(m: Measurement) -> str:
    return (
        str(m.ref)
        if m.ref is not None
        else "no profile key recorded (a rule of the check, or a results.json older than schema 2)"
    )


@dataclass(frozen=True, slots=True)
class _Peers:
    """How a value's peer group did: how many were judged with a value, and how many of those missed."""

    judged: int
    failing: int

    @classmethod
    def of(cls, members: Iterable[Measurement]) -> _Peers:
        judged = [m for m in members if m.verdict != "info" and m.judged and m.measured]
        return cls(len(judged), sum(m.failed for m in judged))


def _classify(m: Measurement, peers: _Peers) -> tuple[ReasonClass, Action, str]:
    if m.metric == SET_ASIDE_METRIC and m.labels.get("action") in LADDER:  # the set-aside stage said
        return (
            "hardware",
            m.labels["action"],
            f"set aside before the first job: {m.labels.get('reason', '?')}",
        )
    problem = problem_of(m)
    if problem in _NOT_MEASURED or not m.measured:
        what = (
            "a value above the physical ceiling of its path"
            if problem == "broken measurement"
            else ("no value for a threshold the profile sets")
        )
        return "not measured", "rerun", f"{what}: fix the measurement or the set-up it names, then rerun"
    remedy = REMEDIES.get(m.metric)
    if remedy is not None:
        return remedy.reason, remedy.action, f"a node readiness check ({remedy.cause}): {remedy.fix}"  # type: ignore[return-value]
    host, gpu, port = host_of(m.labels), gpu_of(m.labels), port_of(m.metric, m.labels)
    judged, failing = peers.judged, peers.failing
    health = m.metric.startswith(HARDWARE_METRICS)
    outlier = judged >= MIN_PEERS and failing * 2 < judged
    if not (host or gpu or port) or not (health or outlier):
        if judged >= MIN_PEERS:
            why = (
                f"{failing} of {judged} peers missed alike: review the threshold ({_source(m)}) or the fabric"
            )
        elif judged == 2:
            why = (
                f"{failing} of 2 peers missed: too few to single one out; review the threshold "
                f"({_source(m)}), then rerun"
            )
        else:
            why = f"a cluster-wide value with no peer to compare: review the threshold ({_source(m)}), then rerun"
        return "threshold", "rerun", why
    why = (
        f"a health counter only hardware fails ({m.metric})"
        if health
        else f"{judged - failing} of {judged} peers passed"
    )
    if port:
        return "hardware", "reseat/replace cable or NIC", why
    if gpu:
        if m.metric.startswith(RMA_METRICS):
            return "hardware", "RMA", why + "; GPU memory can no longer be repaired in place"
        return "hardware", "reset GPU", why
    return "hardware", "drain node", why


def _from_measurement(m: Measurement, peers: _Peers) -> Finding:
    reason, action, why = _classify(m, peers)
    return Finding(
        metric=m.metric,
        reason=reason,
        action=action,
        why=why,
        host=host_of(m.labels),
        gpu=gpu_of(m.labels),
        port=port_of(m.metric, m.labels),
        measured=m.value if math.isfinite(m.value) else None,
        threshold=m.threshold,
        comparison=m.comparison,
        unit=m.unit,
        source=_source(m),
        scope=m.scope,
        labels=dict(m.labels),
        test_id=m.test_id,
        message=failure_message(m),
        problem=problem_of(m),
        fix=REMEDIES[m.metric].fix if m.metric in REMEDIES and reason != "not measured" else None,
    )


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def hosts_named(text: str, hosts: Iterable[str]) -> list[str]:
    """The known hosts a message names (a crashed rank's host), in the order of ``hosts``."""
    words = {w.rstrip(".") for w in _WORD.findall(text)}
    return [h for h in hosts if h in words]


def _from_outcome(o: TestOutcome, hosts: Sequence[str]) -> Finding:
    named = hosts_named(o.message, hosts)
    if o.category == "performance":
        reason: ReasonClass = "threshold"
        why = "the test failed on a value judged outside the thresholds (a regression against the baseline)"
    elif o.category == "not measured":
        reason = "not measured"
        why = "the test could not judge a threshold it has (no value, or a broken measurement)"
    elif o.test_id == PREFLIGHT_TEST_ID:
        reason = "workload failed"
        why = (
            "the preflight stopped the run before any job: a setting or the hardware cannot work as the "
            "profile says (each named in the message); fix the profile or the settings, or choose this "
            "hardware's profile (--hw=auto), then rerun"
        )
    else:
        reason = "workload failed"
        why = (
            "the job could not run, or a rank crashed or hung"
            if o.category == "infrastructure"
            else "the test failed without a value below its threshold (a bug or a wrong result)"
        )
    first = (o.message.strip().splitlines() or [o.outcome])[0]
    return Finding(
        metric=o.test_id,
        reason=reason,
        action="rerun",
        why=why + (f"; the message names {', '.join(named)}" if named else ""),
        host=named[0] if len(named) == 1 else None,
        test_id=o.test_id,
        message=o.message or first,
    )


_HOW_NAMED = {
    "counters": "from its own readings before and after the run (a lost GPU, an XID, ECC errors)",
    "fabric": "from its port counters before and after the run",
    "numerics": "from its results (agreement with its peers, stability across repeats, the known answer)",
}
"""How a check that does not compare a node with its peers named it (the rest do)."""


def _from_suspect(s: Suspect, counted: Measurement | None) -> Finding:
    """A node, GPU or link a burn-in check named by comparing it with its peers (a straggler, a
    slow pair): hardware, its rung by what is named."""
    if s.kind == "link":
        action: Action = "reseat/replace cable or NIC"
    elif s.kind == "gpu" or s.gpu:
        action = "reset GPU"
    else:
        action = "drain node"
    return Finding(
        metric=counted.metric if counted is not None else f"burnin.{s.check}",
        reason="hardware",
        action=action,
        why=f"named by the burn-in's {s.check} check {_HOW_NAMED.get(s.check, 'against its peers')}",
        host=None if s.kind == "link" else s.node,
        gpu=s.gpu,
        port=f"link {s.node} <-> {s.peer}" if s.kind == "link" else None,
        scope=counted.scope if counted is not None else None,
        labels={k: v for k, v in (("rank", s.rank),) if v is not None},
        test_id=s.source,
        message=s.line() + (f"\n{failure_message(counted)}" if counted is not None else ""),
    )


def findings_of(
    measurements: Sequence[Measurement],
    outcomes: Sequence[TestOutcome] = (),
    hosts: Sequence[str] = (),
    suspects: Sequence[Suspect] = (),
) -> list[Finding]:
    """Every failure of a run as a finding, highest rung of the ladder first, then by host.

    A failed value (the last of its key: a confirmation supersedes its first measurement) gives
    one finding; a failed test that recorded no failed value gives one too (workload failed, or a
    regression). ``hosts`` are the run's hosts, to find the one a crash message names.
    ``suspects`` are the drain list's (suspects.json): a failed count of a test that named
    suspects (stragglers, slow pairs: a value that names no one) becomes one finding per suspect,
    and a suspect that no failed value of its test names becomes one too.
    """
    latest = {m.key: m for m in measurements}
    groups: dict[tuple[str, str, str], list[Measurement]] = defaultdict(list)
    for m in latest.values():
        groups[_point(m)].append(m)
    peers = {point: _Peers.of(members) for point, members in groups.items()}
    named: dict[str, list[Suspect]] = defaultdict(list)
    for s in suspects:
        named[s.source].append(s)
    found: list[Finding] = []
    counts: dict[str, Measurement] = {}
    for m in latest.values():
        if not m.failed:
            continue
        if (
            named.get(m.test_id)
            and m.measured  # a NOT MEASURED value of the test is a gap of its own, not the suspects' count
            and not (host_of(m.labels) or gpu_of(m.labels) or port_of(m.metric, m.labels))
        ):
            counts.setdefault(m.test_id, m)  # the suspects say who
            continue
        found.append(_from_measurement(m, peers[_point(m)]))
    # a suspect whose test already has a failed value naming its host (or a link) is that finding
    covered = {(f.test_id, f.host) for f in found if f.host} | {
        (f.test_id, "link") for f in found if f.port and f.port.startswith("link ")
    }
    for source, listed in named.items():
        for s in listed:
            if (source, "link" if s.kind == "link" else s.node) not in covered:
                found.append(_from_suspect(s, counts.get(source)))
    with_failed_values = {f.test_id for f in found}
    for o in outcomes:
        if o.outcome in ("failed", "error") and o.category != "pass" and o.test_id not in with_failed_values:
            found.append(_from_outcome(o, hosts))
    causes = readiness_causes(m for m in latest.values() if m.metric.startswith("readiness."))
    if causes:
        found = [_with_cause(f, causes, hosts) for f in found]
    found.sort(
        key=lambda f: (-f.rank, REASONS.index(f.reason), f.host or "~", f.gpu or "", f.port or "", f.metric)
    )
    return found


def _with_cause(f: Finding, causes: Mapping[str, Any], hosts: Sequence[str]) -> Finding:
    """A symptom on a node with a failed readiness check names that check as its likely cause."""
    if f.metric.startswith("readiness."):
        return f
    cause = cause_of(f.metric, f.host, causes, list(hosts) or list(causes))
    if cause is None:
        return f
    return replace(f, cause=cause, why=f"{f.why}; likely cause: {cause}")
