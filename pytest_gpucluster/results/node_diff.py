"""What changed on the nodes between two runs: fabric ports and network links, host by host.

A regression after an upgrade is often not the upgrade: an InfiniBand port that came back at half
rate, an Ethernet link that negotiated down, a traffic shaper left on an interface. The per-node
probe records each node's ports (``ib_ports``) and links (``links``: operstate, speed, the rate a
root qdisc holds it to) in results.json's ``nodes``; this compares two such records for the hosts
both runs had, so the regression report can say which link changed.

Reads the JSON form only (no import from ``cluster/``): a baseline written by an older plugin
simply has fewer facts, and nothing is said about what it lacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["node_changes"]


def _by_host(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {
        str(n["host"]): n for n in nodes if isinstance(n, Mapping) and n.get("host") and not n.get("error")
    }


def _rate(bytes_per_s: Any) -> str:
    if not isinstance(bytes_per_s, (int, float)):
        return "(none)"
    return f"{bytes_per_s * 8 / 1e6:g} Mbit/s"


def _speed(mbps: Any) -> str:
    return "(none)" if not isinstance(mbps, (int, float)) else f"{mbps:g} Mb/s"


def _link_facts(node: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for link in node.get("links") or ():
        out[f"{link.get('name')}"] = {
            "state": str(link.get("operstate") or "(none)"),
            "speed": _speed(link.get("speed_mbps")),
            "shaped to": _rate(link.get("shaped_bytes_per_s")),
        }
    for port in node.get("ib_ports") or ():
        rate = port.get("rate_gbps")
        out[f"{port.get('device')} port {port.get('port')}"] = {
            "state": str(port.get("state") or "(none)"),
            "rate": "(none)" if rate is None else f"{rate:g} Gb/s",
        }
    return out


def node_changes(
    baseline_nodes: Sequence[Mapping[str, Any]], current_nodes: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """``(what, old, new)`` per changed fact of a link or port of a host in both runs, e.g.
    ``("n0 eth0 shaped to", "100 Mbit/s", "70 Mbit/s")``. A fabric port present in one run only is
    said too; a network link only when both runs have it (containers come and go with their veths)."""
    old_hosts, new_hosts = _by_host(baseline_nodes), _by_host(current_nodes)
    changes: list[tuple[str, str, str]] = []
    for host in sorted(set(old_hosts) & set(new_hosts)):
        old, new = _link_facts(old_hosts[host]), _link_facts(new_hosts[host])
        if not old or not new:
            continue  # a record without links (an older plugin, a probe that read none): nothing to compare
        for name in sorted(set(old) | set(new)):
            if (name not in old or name not in new) and " port " not in name:
                continue
            if name not in new:
                changes.append((f"{host} {name}", "present", "(gone)"))
            elif name not in old:
                changes.append((f"{host} {name}", "(absent)", "present"))
            else:
                for fact in old[name]:
                    if old[name][fact] != new[name].get(fact):
                        changes.append(
                            (f"{host} {name} {fact}", old[name][fact], new[name].get(fact, "(none)"))
                        )
    return changes
