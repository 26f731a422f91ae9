"""Are a node's fabric ports up, at their line rate, and as many as the profile says?

Pure verdicts over the ports one node reported (`parsers.fabric_ports.IbPort`, from sysfs through
`workloads.fabric_probe` or from ``ibstat``/``ibv_devinfo`` text) and what the profile expects of
them. Used by the inventory (the per-node probe at session start) and by the fabric checks that
compare the ports before and after a test. The API, whole:

- `PortExpectation.from_profile(profile)`: which fabric the profile's ``cluster.interconnects``
  name (``ib``: InfiniBand ports; ``roce``: RDMA ports on Ethernet; ``efa``: ``efa*``/``rdmap*``
  devices), how many per node (``cluster.nics_per_node``) and at which rate
  (``cluster.nic_line_rate``); a profile naming no RDMA fabric expects nothing.
- `fabric_ports(ports, expect)`: the ports that belong to that fabric (a RoCE bond or a management
  port of another link layer is not one of them).
- `port_checks(node, ports, expect)`: one check per fabric port (ACTIVE, and at the line rate when
  the profile gives one) and one for the node's count of ACTIVE fabric ports. Each hint names the
  node and the port: ``node gpu-03: mlx5_2 port 1 is DOWN (physical state Polling)``.
- `port_changes(node, before, after, expect)`: a fabric port that was ACTIVE before and is not
  after, or runs slower after, fails; ports that were already down are left to `port_checks`.

Rates are in Gb/s, as NICs are sold and sysfs prints them. No pytest, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_gpucluster.parsers.fabric_ports import IbPort
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = ["FABRICS", "PortExpectation", "fabric_ports", "port_changes", "port_checks"]

FABRICS = ("ib", "roce", "efa")
"""The RDMA fabrics a profile's ``cluster.interconnects`` can name, in order of preference."""
_LAYER_NAMES = {"ib": "InfiniBand", "roce": "RoCE", "efa": "EFA"}
_ACTIVE = "ACTIVE"


@dataclass(frozen=True, slots=True)
class PortExpectation:
    """What one node's fabric ports should look like, and which profile says so."""

    profile: str
    fabric: str | None
    """``ib``, ``roce``, ``efa``, or None when the profile names no RDMA fabric."""
    nics_per_node: int | None = None
    line_rate_gbps: float | None = None

    @classmethod
    def from_profile(cls, profile: ProfileModel) -> PortExpectation:
        cluster = profile.cluster
        fabric = next((f for f in FABRICS if f in cluster.interconnects), None)
        rate = cluster.nic_line_rate * 8 / 1e9 if cluster.nic_line_rate else None
        return cls(profile.name, fabric, cluster.nics_per_node, rate)

    @property
    def layer(self) -> str:
        """How messages name the fabric's ports: ``InfiniBand``, ``RoCE``, ``EFA``."""
        return _LAYER_NAMES.get(self.fabric or "", "RDMA")

    def ref(self, key: str) -> ThresholdRef:
        return ThresholdRef(self.profile, ("cluster", key))


def _on_fabric(port: IbPort, fabric: str | None) -> bool:
    efa = port.device.startswith(("efa", "rdmap"))
    layer = (port.link_layer or "").lower()
    if fabric == "efa":
        return efa
    if fabric == "ib":
        return not efa and layer == "infiniband"
    if fabric == "roce":
        return not efa and layer == "ethernet"
    return False


def fabric_ports(ports: Iterable[IbPort], expect: PortExpectation) -> list[IbPort]:
    """The ports of the fabric ``expect`` names, in (device, port) order."""
    return sorted((p for p in ports if _on_fabric(p, expect.fabric)), key=lambda p: (p.device, p.port))


def _state_text(port: IbPort) -> str:
    state = port.state or "in an unreadable state"
    physical = f"physical state {port.phys_state}" if port.phys_state else ""
    rate = f"rate {port.rate_text}" if port.rate_text else ""
    detail = ", ".join(part for part in (physical, rate) if part)
    return f"{state}{f' ({detail})' if detail else ''}"


def _labels(node: str, port: IbPort) -> dict[str, str]:
    return {"host": node, "device": port.device, "port": str(port.port)}


def _state_check(node: str, port: IbPort, expect: PortExpectation) -> Check:
    up = port.state == _ACTIVE
    hint = f"node {node}: {port.device} port {port.port} is {_state_text(port)}"
    if not up:
        hint += "; check its cable and switch port (ibstat on the node), or leave the node out"
    return Check("fabric.port_active", float(up), "bool", 1.0, "==", expect.ref("interconnects"),
                 labels=_labels(node, port), hint=hint)  # fmt: skip


def _rate_check(node: str, port: IbPort, expect: PortExpectation) -> Check | None:
    if port.state != _ACTIVE:
        return None  # a port that is down has no rate worth judging; its state check fails
    rate = port.rate_gbps
    if rate is None:
        why = port.unreadable.get("rate", "the rate file could not be read")
        return Check("fabric.port_rate", float("nan"), "Gb/s", expect.line_rate_gbps, ">=",
                     expect.ref("nic_line_rate"), labels=_labels(node, port),
                     hint=f"node {node}: {port.device} port {port.port} has no readable rate ({why})")  # fmt: skip
    hint = f"node {node}: {port.device} port {port.port} runs at {port.rate_text or f'{rate:g} Gb/s'}"
    if expect.line_rate_gbps is not None and rate < expect.line_rate_gbps:
        hint += (
            f", below the {expect.line_rate_gbps:g} Gb/s of the profile's NICs: a cable, transceiver or "
            "switch port negotiated a lower speed or width (ibstat shows it)"
        )
    ref = expect.ref("nic_line_rate") if expect.line_rate_gbps is not None else None
    return Check("fabric.port_rate", rate, "Gb/s", expect.line_rate_gbps, ">=", ref,
                 labels=_labels(node, port), hint=hint)  # fmt: skip


def _count_check(node: str, ports: Sequence[IbPort], expect: PortExpectation) -> Check:
    active = [p for p in ports if p.state == _ACTIVE]
    want = expect.nics_per_node
    if not ports:
        hint = (
            f"node {node} has no {expect.layer} port under /sys/class/infiniband, while profile "
            f"{expect.profile} names {expect.fabric} in cluster.interconnects (is the driver loaded?)"
        )
    else:
        down = [f"{p.device} port {p.port} is {p.state or 'unreadable'}" for p in ports if p.state != _ACTIVE]
        hint = f"node {node}: {len(active)} of {len(ports)} {expect.layer} ports are ACTIVE"
        hint += f" ({'; '.join(down)})" if down else ""
        if want is not None:
            hint += f"; the profile wants {want}"
    key = "nics_per_node" if want is not None else "interconnects"
    return Check("fabric.active_ports", len(active), "ports", want if want is not None else 1, ">=",
                 expect.ref(key), labels={"host": node, "fabric": expect.layer}, hint=hint)  # fmt: skip


def port_checks(node: str, ports: Iterable[IbPort], expect: PortExpectation) -> list[Check]:
    """Every fabric port of ``node`` ACTIVE and (with ``nic_line_rate``) at the line rate, and at
    least ``nics_per_node`` of them ACTIVE (at least one without it). Nothing when the profile
    names no RDMA fabric."""
    if expect.fabric is None:
        return []
    mine = fabric_ports(ports, expect)
    checks: list[Check] = [_count_check(node, mine, expect)]
    for port in mine:
        checks.append(_state_check(node, port, expect))
        rate = _rate_check(node, port, expect)
        if rate is not None:
            checks.append(rate)
    return checks


def port_changes(
    node: str, before: Iterable[IbPort], after: Iterable[IbPort], expect: PortExpectation
) -> list[Check]:
    """A fabric port of ``node`` ACTIVE in ``before`` must still be ACTIVE, at no lower rate, in
    ``after`` (a port missing from ``after`` went away). Ports down in ``before`` are not judged
    here: `port_checks` on the first reading already names them."""
    later = {(p.device, p.port): p for p in fabric_ports(after, expect)}
    checks: list[Check] = []
    for port in fabric_ports(before, expect):
        if port.state != _ACTIVE:
            continue
        now = later.get((port.device, port.port))
        labels = _labels(node, port)
        if now is None or now.state != _ACTIVE:
            was = f"ACTIVE at {port.rate_text or 'an unknown rate'} before"
            said = "is gone" if now is None else f"is {_state_text(now)}"
            checks.append(Check("fabric.port_stayed_active", 0.0, "bool", 1.0, "==", None, labels=labels,
                                hint=f"node {node}: {port.device} port {port.port} {said} after the test "
                                f"(it was {was}): the link flapped or went down under load"))  # fmt: skip
            continue
        checks.append(Check("fabric.port_stayed_active", 1.0, "bool", 1.0, "==", None, labels=labels,
                            hint=f"node {node}: {port.device} port {port.port} stayed ACTIVE"))  # fmt: skip
        if port.rate_gbps is not None and now.rate_gbps is not None:
            slower = now.rate_gbps < port.rate_gbps
            hint = f"node {node}: {port.device} port {port.port} ran at {port.rate_text} before, {now.rate_text} after"
            if slower:
                hint += ": the link renegotiated down during the test"
            checks.append(Check("fabric.port_rate_kept", now.rate_gbps, "Gb/s", port.rate_gbps, ">=", None,
                                labels=labels, hint=hint))  # fmt: skip
    return checks
