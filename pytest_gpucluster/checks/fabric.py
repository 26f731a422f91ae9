"""Verdicts on the fabric counters: which ports count, and which error counters grew over the run.

``acceptance/test_fabric.py`` reads every node's ports first and last (``workloads/fabric_probe.py``,
parsed by ``parsers/fabric_ports.py``); :func:`counter_checks` judges the two readings against the
profile's ``fabric:`` section:

- **which ports count**: IB/RoCE ports selected by ``fabric.ib_devices`` (NCCL_IB_HCA's syntax; by
  default the session's ``NCCL_IB_HCA``, else every device), network interfaces by
  ``fabric.interfaces`` (NCCL_SOCKET_IFNAME's syntax; by default the session's
  ``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME``, else as NCCL picks: ``ib*`` interfaces if there
  are any, else every one but ``docker*`` and ``lo`` — NCCL ``src/misc/socket.cc``,
  ``ncclFindInterfaces``). NCCL takes interfaces that have an IP address; sysfs does not show
  addresses, so an interface counts when it is **up** in the first reading (a down one carries no
  traffic; a port that is down when it should not be is the port-state check's to fail);
- **per counted port**, each counter by its class (``parsers/fabric_diff.COUNTER_CLASSES``; the
  docs/explanation/counters-and-xids.md gives each counter's class and source), one check per counter
  naming node, device, port and counter:

  - *link* (link downed, link recovery, receive errors, integrity, buffer overrun, NIC rx/tx
    errors): growth beyond ``fabric.max_error_increase`` (0) fails; a port whose link counters all
    held is one passing check (``counter=all``);
  - *ber* (``symbol_error``): after FEC on EDR/HDR/NDR links, errors the application sees; judged
    as a rate per bit the port received (``fabric.max_bit_error_rate``, 1e-12: NVIDIA ibdiagnet's
    BER threshold), not at zero, so that a multi-hour run on hundreds of links is held to the link's
    specification; a port without data counters falls back to ``max_error_increase``;
  - *transport* (``req_cqe_error``, ``resp_cqe_error``, remote-access errors, ``rnr_nak_retry_err``):
    a work request completed in error. A healthy NIC counts these when its peer is killed
    mid-transfer, so they are gated like *link* only when the suite killed no job between the two
    readings (``killed``); otherwise recorded and warned about, attributed to the kill;
  - *retransmit* (``local_ack_timeout_err``, ``packet_seq_err``, ``out_of_sequence``...): the
    transport recovered, and adaptive routing reorders by design, so the growth is judged as a
    rate per GB the port moved (``fabric.max_retransmits_per_gb``, per counter
    ``fabric.retransmits_per_gb``); a port with no data counters cannot give the rate (not
    measured where a ceiling is set);
  - *drop* (``rx_dropped``/``tx_dropped``, which grow on healthy hosts for frames of unknown
    protocols such as LLDP; ``port_xmit_discards``; ``out_of_buffer``; qdisc drops): recorded and
    shown, gated only where the profile sets an allowance (``fabric.max_drop_increase``, or the
    counter in ``fabric.allowed_increase``);

  the bytes each port moved are recorded;
- **a counter pinned at its maximum** (IB counters saturate) cannot show growth. By default that is
  a failure: the burn-in exists to prove that the port accumulated no errors under load, and a
  saturated counter makes that unprovable while itself recording at least 2^bits - 1 errors since
  it was last cleared. The remedy is an operator's (clear the counters — ``perfquery -x -R`` — or
  reload the driver, and run again). ``fabric.saturated: warn`` records and warns instead, for a
  site that clears counters on its own schedule; and a run whose reader was not root (the
  snapshot's ``root``) warns too: it cannot clear them, so failing would fail every such run;
- **a counted port missing from the last reading** fails (a NIC that fell off the bus, a link
  renamed by a driver reset); a node with no last reading fails too.

Pure: no pytest, no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_gpucluster.burnin.drain import Suspect
from pytest_gpucluster.checks.fabric_selection import (
    NameSelection,
    Port,
    counted_ports,
)
from pytest_gpucluster.parsers.fabric_diff import SATURATING_BITS, CounterChange, counter_class, diff_ports
from pytest_gpucluster.parsers.fabric_ports import FabricSnapshot, IbPort
from pytest_gpucluster.profiles.schema import FabricSection
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = ["FabricVerdict", "NameSelection", "counted_ports", "counter_checks", "moved_bytes"]


@dataclass(frozen=True, slots=True)
class FabricVerdict:
    """The checks of one before/after pair of readings, the suspects they name, and the warnings
    (saturated counters under ``fabric.saturated: warn``) the test should raise."""

    checks: tuple[Check, ...]
    suspects: tuple[Suspect, ...]
    warnings: tuple[str, ...]
    counted: Mapping[str, tuple[str, ...]]
    """Per node, the ports and interfaces that counted (``mlx5_0/1``, ``eth0``)."""


def _name(port: Port) -> str:
    return f"{port.device}/{port.port}" if isinstance(port, IbPort) else port.name


def _labels(port: Port) -> dict[str, object]:
    if isinstance(port, IbPort):
        return {"node": port.node or "", "device": port.device, "port": port.port}
    return {"node": port.node or "", "device": port.name}


def _where(port: Port) -> str:
    if isinstance(port, IbPort):
        return f"node {port.node}, device {port.device} port {port.port}"
    return f"node {port.node}, interface {port.name}"


def moved_bytes(before: Port, after: Port) -> float | None:
    """Bytes the port moved between the readings (IB data counters count 4-byte words), or None."""
    names = ("port_xmit_data", "port_rcv_data") if isinstance(before, IbPort) else ("tx_bytes", "rx_bytes")
    scale = 4 if isinstance(before, IbPort) else 1
    if not all(n in before.counters and n in after.counters for n in names):
        return None
    grown = [after.counters[n] - before.counters[n] for n in names]
    return float(sum(grown) * scale) if all(g >= 0 for g in grown) else None


class _Judge:
    """Builds the checks of one run; the profile's keys go into every threshold's ref."""

    def __init__(self, section: FabricSection, profile: str, killed: Sequence[str] = ()) -> None:
        self.section, self.profile, self.killed = section, profile, tuple(killed)
        self.root: bool | None = None
        """Whether this node's reader was root (``FabricSnapshot.root``): set per node."""
        self.checks: list[Check] = []
        self.suspects: list[Suspect] = []
        self.warnings: list[str] = []

    def allowance(self, counter: str) -> tuple[int, ThresholdRef]:
        """A link-class counter's allowance: its own, else ``max_error_increase``."""
        if counter in self.section.allowed_increase:
            key: tuple[str | int, ...] = ("fabric", "allowed_increase", counter)
            return self.section.allowed_increase[counter], ThresholdRef(self.profile, key)
        return self.section.max_error_increase, ThresholdRef(self.profile, ("fabric", "max_error_increase"))

    def drop_allowance(self, counter: str) -> tuple[int | None, ThresholdRef | None]:
        """A drop-class counter's allowance: its own, else ``max_drop_increase``; None: not gated."""
        if counter in self.section.allowed_increase:
            key: tuple[str | int, ...] = ("fabric", "allowed_increase", counter)
            return self.section.allowed_increase[counter], ThresholdRef(self.profile, key)
        if self.section.max_drop_increase is not None:
            return self.section.max_drop_increase, ThresholdRef(self.profile, ("fabric", "max_drop_increase"))
        return None, None

    def retransmit_ceiling(self, counter: str) -> tuple[float | None, ThresholdRef | None]:
        """A retransmit-class counter's ceiling per GB moved; None: recorded, not gated."""
        if counter in self.section.retransmits_per_gb:
            key: tuple[str | int, ...] = ("fabric", "retransmits_per_gb", counter)
            ceiling = self.section.retransmits_per_gb[counter]
            return ceiling, (ThresholdRef(self.profile, key) if ceiling is not None else None)
        if self.section.max_retransmits_per_gb is None:
            return None, None
        return self.section.max_retransmits_per_gb, ThresholdRef(
            self.profile, ("fabric", "max_retransmits_per_gb")
        )

    def fail(self, port: Port, sentence: str, evidence: Mapping[str, object]) -> None:
        self.suspects.append(
            Suspect(
                node=port.node or "?",
                reason=f"{_name(port)}: {sentence}",
                check="fabric",
                evidence=dict(evidence),
            )
        )

    def grown(self, port: Port, change: CounterChange) -> None:
        allowed, ref = self.allowance(change.counter)
        hint = (
            f"{_where(port)}: error counter {change.counter} {_growth(change)}"
            + f"; allowed {allowed} ({ref.key}). "
            + _advice(port, change.counter)
        )
        check = Check(
            "fabric.error_increase",
            change.at_least,
            "count",
            allowed,
            "<=",
            ref,
            labels={**_labels(port), "counter": change.counter},
            hint=hint,
        )
        self._judge_growth(port, change, check, allowed)

    def dropped(self, port: Port, change: CounterChange) -> None:
        allowed, ref = self.drop_allowance(change.counter)
        rule = (
            f"allowed {allowed} ({ref.key})"
            if ref is not None
            else "recorded, not gated: drop counters grow on healthy hosts too (fabric.max_drop_increase gates them)"
        )
        check = Check(
            "fabric.drops", change.at_least, "count", allowed, "<=", ref,
            labels={**_labels(port), "counter": change.counter},
            hint=f"{_where(port)}: drop counter {change.counter} {_growth(change)}; {rule}. {_advice(port, change.counter)}",
        )  # fmt: skip
        self._judge_growth(port, change, check, allowed)

    def _judge_growth(self, port: Port, change: CounterChange, check: Check, allowed: float) -> None:
        """Record a counter's growth check; past its allowance the port fails with the growth."""
        self.checks.append(check)
        if check.failed:
            self.fail(
                port,
                f"{change.counter} +{change.at_least} during the burn-in (allowed {allowed})",
                change.to_json(),
            )

    def retransmitted(self, port: Port, change: CounterChange, moved: float | None) -> None:
        ceiling, ref = self.retransmit_ceiling(change.counter)
        labels = {**_labels(port), "counter": change.counter}
        rule = f"ceiling {ceiling:g} per GB ({ref.key})" if ref is not None else "recorded, not gated"
        if moved is None:
            self.checks.append(
                Check(
                    "fabric.retransmit_rate", float("nan"), "1/GB", ceiling, "<=", ref, labels=labels,
                    baseline_gate=False,
                    hint=f"{_where(port)}: {change.counter} {_growth(change)}, but the port has no data "
                    f"counters to divide by, so its rate per GB is unknown; {rule}.",
                )
            )  # fmt: skip
            return
        gb = moved / 1e9
        # A port that moved nothing yet counted retransmits: rate as if it had moved one byte.
        rate = change.at_least / max(gb, 1e-9)
        check = Check(
            "fabric.retransmit_rate", rate, "1/GB", ceiling, "<=", ref, labels=labels, baseline_gate=False,
            hint=f"{_where(port)}: retransmit counter {change.counter} {_growth(change)} while the port moved "
            f"{gb:.4g} GB: {rate:.4g} per GB; {rule}. The transport resent (or reordered) packets: a rate far "
            f"above the fleet's points at loss on the link. {_advice(port, change.counter)}",
        )  # fmt: skip
        self.checks.append(check)
        if check.failed:
            self.fail(
                port, f"{change.counter} {rate:.4g} per GB moved (ceiling {ceiling:g})", change.to_json()
            )

    def bit_errors(self, port: Port, after: Port, change: CounterChange) -> None:
        """Symbol errors as a bit error rate: per bit the port received over the run."""
        received = _received_bits(port, after)
        if received is None or change.counter in self.section.allowed_increase:
            self.grown(port, change)  # no data counters (or an explicit allowance): judged as a count
            return
        ceiling = self.section.max_bit_error_rate
        ref = ThresholdRef(self.profile, ("fabric", "max_bit_error_rate"))
        rate = change.at_least / max(received, 1.0)
        check = Check(
            "fabric.bit_error_rate", rate, "1/bit", ceiling, "<=", ref,
            labels={**_labels(port), "counter": change.counter}, baseline_gate=False,
            hint=f"{_where(port)}: {change.counter} {_growth(change)} while the port received {received:.4g} "
            f"bits: a bit error rate of {rate:.3g}, ceiling {ceiling:g} ({ref.key}; NVIDIA ibdiagnet's BER "
            f"threshold). {_advice(port, change.counter)}",
        )  # fmt: skip
        self._judge_growth(port, change, check, ceiling)

    def after_kill(self, port: Port, change: CounterChange) -> None:
        """A transport error in a window where the suite killed a job: recorded, the kill's."""
        jobs = ", ".join(self.killed[:3]) + (
            f" and {len(self.killed) - 3} more" if len(self.killed) > 3 else ""
        )
        sentence = (
            f"{_where(port)}: transport counter {change.counter} {_growth(change)}; the suite killed "
            f"job(s) {jobs} between the two readings, and a peer killed mid-transfer completes a healthy "
            "NIC's work requests in error: attributed to that kill, recorded, not judged"
        )
        self.checks.append(
            Check("fabric.transport_errors", change.at_least, "count",
                  labels={**_labels(port), "counter": change.counter}, hint=sentence)
        )  # fmt: skip
        self.warnings.append(sentence)

    def saturated(self, port: Port, change: CounterChange) -> None:
        top = (1 << SATURATING_BITS[change.counter]) - 1
        sentence = (
            f"{_where(port)}: error counter {change.counter} is pinned at its maximum {top}: growth "
            "during the run cannot be seen, and it has counted at least that many errors since it was "
            "last cleared. Clear the port's counters (perfquery -x -R, or a driver reload) and run again."
        )
        ref = ThresholdRef(self.profile, ("fabric", "saturated"))
        labels = {**_labels(port), "counter": change.counter}
        why = (
            "fabric.saturated: warn"
            if self.section.saturated == "warn"
            else "this run read the ports without root, so it cannot clear them: a warning, not a failure; "
            "clear them as root (perfquery -x -R) to have the burn-in judge this port"
            if self.root is False
            else ""
        )
        if why:
            self.checks.append(
                Check(
                    "fabric.saturated_counter",
                    change.after,
                    "count",
                    labels=labels,
                    hint=f"{sentence} ({why})",
                )
            )
            self.warnings.append(f"{sentence} ({why})")
            return
        self.checks.append(
            Check(
                "fabric.saturated_counter",
                change.after,
                "count",
                top - 1,
                "<=",
                ref,
                labels=labels,
                hint=sentence,
            )
        )
        self.fail(port, f"{change.counter} saturated at {top}", change.to_json())

    def port(self, before: Port, after: Port | None, changes: Sequence[CounterChange]) -> None:
        if after is None:
            hint = f"{_where(before)} was in the first reading and is gone from the last: look at dmesg and the link."
            self.checks.append(
                Check("fabric.port_present", 0.0, "ports", 1.0, ">=", labels=_labels(before), hint=hint)
            )
            self.fail(before, "present before the burn-in, gone after it", {})
            return
        moved = moved_bytes(before, after)
        link = [c for c in changes if c.counter_class in ("link", "ber", "transport")]
        for change in changes:
            grew = change.at_least > 0 or change.went_down
            if change.counter_class in ("link", "ber", "transport"):
                if change.saturated:
                    self.saturated(before, change)
                if not grew:
                    continue
                if change.counter_class == "ber":
                    self.bit_errors(before, after, change)
                elif change.counter_class == "transport" and self.killed:
                    self.after_kill(before, change)
                else:
                    self.grown(before, change)
            elif change.counter_class == "drop":
                if change.saturated and self.drop_allowance(change.counter)[0] is not None:
                    self.saturated(before, change)
                if grew:
                    self.dropped(before, change)
            elif change.counter_class == "retransmit" and grew:
                self.retransmitted(before, change, moved)
        grown = {c.counter_class for c in changes if c.at_least > 0 or c.went_down}
        classes = {counter_class(name) for name in before.counters}
        ceiling, ceiling_ref = self.retransmit_ceiling("")
        if "retransmit" in classes and "retransmit" not in grown and ceiling_ref is not None:
            self.checks.append(
                Check(
                    "fabric.retransmit_rate", 0.0, "1/GB", ceiling, "<=", ceiling_ref,
                    labels={**_labels(before), "counter": "all"}, baseline_gate=False,
                    hint=f"{_where(before)}: no retransmit counter grew",
                )
            )  # fmt: skip
        allowed, drop_ref = self.drop_allowance("")
        if "drop" in classes and "drop" not in grown and drop_ref is not None:
            self.checks.append(
                Check(
                    "fabric.drops", 0.0, "count", allowed, "<=", drop_ref,
                    labels={**_labels(before), "counter": "all"}, hint=f"{_where(before)}: no drop counter grew",
                )
            )  # fmt: skip
        if not [c for c in link if c.at_least > 0 or c.went_down]:
            allowed, ref = self.allowance("")
            self.checks.append(
                Check(
                    "fabric.error_increase",
                    0.0,
                    "count",
                    allowed,
                    "<=",
                    ref,
                    labels={**_labels(before), "counter": "all"},
                    hint=f"{_where(before)}: no link error counter grew",
                )
            )
        if moved is not None:
            self.checks.append(
                Check(
                    "fabric.traffic",
                    moved,
                    "B",
                    labels=_labels(before),
                    hint=f"{_where(before)}: bytes sent and received during the run",
                )
            )


def _received_bits(before: Port, after: Port) -> float | None:
    """Bits the port received between the readings (``port_rcv_data`` counts 4-byte words), or
    None where the port has no readable receive counter."""
    name, scale = ("port_rcv_data", 32) if isinstance(before, IbPort) else ("rx_bytes", 8)
    if name not in before.counters or name not in after.counters:
        return None
    grown = after.counters[name] - before.counters[name]
    return float(grown * scale) if grown >= 0 else None


def _growth(change: CounterChange) -> str:
    if change.went_down:
        return (
            f"went down from {change.before} to {change.after} (cleared or wrapped during the run): "
            f"at least {change.after} since"
        )
    return f"grew by {change.increase} ({change.before} -> {change.after}) during the run"


def _advice(port: Port, counter: str) -> str:
    if counter == "qdisc_drops":
        return (
            "The interface's queueing discipline dropped packets (tc -s qdisc show dev "
            f"{_name(port)}): a shaper or a queue too small for the traffic."
        )
    if isinstance(port, IbPort):
        return (
            f"Look at the cable and the switch port of {port.device} port {port.port} "
            "(ibdiagnet, perfquery -x); symbol errors and link-error recovery point at the cable."
        )
    return f"Look at ip -s link show dev {port.name} and the NIC's ethtool -S counters."


def _by_node(snapshots: Iterable[FabricSnapshot]) -> dict[str, FabricSnapshot]:
    return {s.node or "?": s for s in snapshots}


def counter_checks(
    before: Sequence[FabricSnapshot],
    after: Sequence[FabricSnapshot],
    section: FabricSection,
    profile: str,
    env: Mapping[str, str],
    killed: Sequence[str] = (),
) -> FabricVerdict:
    """Every counted port's error counters from the first reading to the last (see the module doc).
    ``killed``: the jobs the suite killed between the two readings (transport errors are theirs)."""
    judge = _Judge(section, profile, killed)
    last = _by_node(after)
    counted: dict[str, tuple[str, ...]] = {}
    for node, first in _by_node(before).items():
        ports, _how = counted_ports(first, section, env)
        counted[node] = tuple(_name(p) for p in ports)
        later = last.get(node)
        if later is None:
            judge.checks.append(
                Check(
                    "fabric.node_read",
                    0.0,
                    "readings",
                    1.0,
                    ">=",
                    labels={"node": node},
                    hint=f"node {node} gave no last reading of its ports",
                )
            )
            continue
        judge.root = later.root if later.root is not None else first.root
        matched = {(type(p).__name__, *p.key): p for p in (*later.ib_ports, *later.interfaces)}
        diff = diff_ports(ports, [p for p in matched.values() if p.node == node])
        for port in ports:
            twin = matched.get((type(port).__name__, *port.key))
            own = [c for c in diff.changes if (c.device, c.port) == _device_port(port)]
            judge.port(port, twin, own)
    return FabricVerdict(tuple(judge.checks), tuple(judge.suspects), tuple(judge.warnings), counted)


def _device_port(port: Port) -> tuple[str, int | None]:
    return (port.device, port.port) if isinstance(port, IbPort) else (port.name, None)
