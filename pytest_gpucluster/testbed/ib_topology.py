"""Generated InfiniBand fabrics in ``ibnetdiscover`` format, the topology file ibsim reads.

``generate(TopologySpec(nodes=8, rails=2))`` lays out a two-level fabric the way GPU clusters are
cabled: N nodes with R HCAs each (``"gpu-node-017 mlx5_3"``, the node description a real HCA
reports: host name, space, device), leaves of ``nodes_per_leaf`` ports down, and spines, every
leaf cabled to every spine. ``rail_optimized=True`` (the default) puts each node's rail-*r* HCA
(``mlx5_<r>``) on a rail-*r* leaf (``leaf-r3-01``); ``False`` is a plain fat tree, all of a
node's HCAs on the node's own leaf (``leaf-01``).

Faults are options of the layout, so the generated text is the broken fabric and the golden
text is the same spec without them: ``narrow`` (cables trained at 1X on both ends, ``w=1``),
``slow`` (cables at SDR, ``s=1``, where ``speed`` sets the others faster: ``speed=4`` is QDR),
``missing`` (cables left out: both ports Down/Polling), ``swap_rails`` (a node's two HCAs
plugged into each other's leaf ports: both on the wrong rail's leaf).

Pure: text out, no I/O. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Cable", "Topology", "TopologySpec", "generate", "hca_name", "node_name"]


def node_name(i: int) -> str:
    """The host name of node ``i`` (0-based): ``gpu-node-001``."""
    return f"gpu-node-{i + 1:03d}"


def hca_name(i: int, rail: int) -> str:
    """The node description of node ``i``'s rail-``rail`` HCA, as a real one reports it."""
    return f"{node_name(i)} mlx5_{rail}"


@dataclass(frozen=True, slots=True)
class Cable:
    """One cable: (node description, port) at both ends, the width it trains at and its lane speed as
    ibsim codes it (``s=``: 1 SDR, 2 DDR, 4 QDR); None: ibsim's default (4X, SDR)."""

    a: str
    a_port: int
    b: str
    b_port: int
    width: int | None = None
    speed: int | None = None

    def ends(self) -> frozenset[tuple[str, int]]:
        return frozenset({(self.a, self.a_port), (self.b, self.b_port)})


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """A two-level fabric: ``nodes`` x ``rails`` HCAs, leaves of ``nodes_per_leaf`` down-ports, spines.

    ``uplinks`` is the number of cables from each leaf to each spine. Fault options name cables by
    one end: ``narrow`` (1X), ``slow`` (SDR where ``speed`` sets a faster one, e.g. 4: QDR) and
    ``missing`` hold (description, port) pairs; ``swap_rails`` holds (node index, rail a, rail b) triples.
    """

    nodes: int
    rails: int = 1
    nodes_per_leaf: int = 4
    spines: int = 2
    uplinks: int = 1
    rail_optimized: bool = True
    speed: int | None = None
    narrow: tuple[tuple[str, int], ...] = ()
    slow: tuple[tuple[str, int], ...] = ()
    missing: tuple[tuple[str, int], ...] = ()
    swap_rails: tuple[tuple[int, int, int], ...] = ()
    hosts: tuple[str, ...] = ()
    """The nodes' host names in order (default ``gpu-node-001``...): a fabric whose HCAs belong to
    real hosts, e.g. the namespace nodes of a netns test bed."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.rails < 1 or self.nodes_per_leaf < 1 or self.spines < 0 or self.uplinks < 1:
            raise ValueError(f"a fabric needs at least one node, rail, leaf port and uplink: {self}")
        if self.hosts and (len(self.hosts) != self.nodes or any(not h or " " in h for h in self.hosts)):
            raise ValueError(
                f"hosts must name each of the {self.nodes} nodes once, without spaces: {self.hosts}"
            )

    def hca(self, i: int, rail: int) -> str:
        """Node ``i``'s rail-``rail`` HCA's node description (``hosts[i]`` where given)."""
        return f"{self.hosts[i]} mlx5_{rail}" if self.hosts else hca_name(i, rail)


@dataclass(frozen=True, slots=True)
class Topology:
    """A generated fabric: its switches (name -> port count), HCAs, cables, and the ibnetdiscover text."""

    spec: TopologySpec
    switches: dict[str, int]
    hcas: tuple[str, ...]
    cables: tuple[Cable, ...]
    leaf_rail: dict[str, int | None] = field(default_factory=dict)

    def cable_at(self, node: str, port: int) -> Cable:
        """The cable plugged into ``node``'s ``port`` (KeyError when that port is empty)."""
        for cable in self.cables:
            if (node, port) in cable.ends():
                return cable
        raise KeyError(f"no cable at {node!r} port {port}")

    def hca_port(self, node_index: int, rail: int) -> tuple[str, int]:
        """(leaf, port) that node ``node_index``'s rail-``rail`` HCA is cabled to."""
        hca = self.spec.hca(node_index, rail)
        cable = self.cable_at(hca, 1)
        return (cable.b, cable.b_port) if cable.a == hca else (cable.a, cable.a_port)

    def text(self) -> str:
        """The fabric in ``ibnetdiscover`` format: one record per node, each connected port on a line."""
        by_node: dict[str, list[tuple[int, str, int, str]]] = {}
        for c in self.cables:
            options = (f" w={c.width}" if c.width else "") + (f" s={c.speed}" if c.speed else "")
            by_node.setdefault(c.a, []).append((c.a_port, c.b, c.b_port, options))
            by_node.setdefault(c.b, []).append((c.b_port, c.a, c.a_port, options))
        out = [f"# generated: {self.spec}", ""]
        # The first record is where ibsim attaches its clients (and the SM): a spine when there is one.
        for name in sorted(self.switches, key=lambda n: (not n.startswith("spine"), n)):
            out.append(f'Switch\t{self.switches[name]} "{name}"')
            out += _port_lines(by_node.get(name, ()))
            out.append("")
        for name in self.hcas:
            out.append(f'Hca\t1 "{name}"')
            out += _port_lines(by_node.get(name, ()))
            out.append("")
        return "\n".join(out)


def _port_lines(ports: Iterable[tuple[int, str, int, str]]) -> list[str]:
    return [f'[{port}]\t"{peer}"[{peer_port}]{options}' for port, peer, peer_port, options in sorted(ports)]


def generate(spec: TopologySpec) -> Topology:
    """The fabric ``spec`` describes, faults included."""
    groups = -(-spec.nodes // spec.nodes_per_leaf)
    leaves: list[tuple[str, int | None, int]] = []  # (name, rail, group)
    if spec.rail_optimized:
        leaves = [(f"leaf-r{r}-{g + 1:02d}", r, g) for r in range(spec.rails) for g in range(groups)]
    else:
        leaves = [(f"leaf-{g + 1:02d}", None, g) for g in range(groups)]
    down = spec.nodes_per_leaf * (1 if spec.rail_optimized else spec.rails)
    leaf_ports = down + spec.spines * spec.uplinks
    spine_ports = max(1, len(leaves) * spec.uplinks)
    switches = {name: leaf_ports for name, _, _ in leaves}
    switches |= {f"spine-{s + 1:02d}": spine_ports for s in range(spec.spines)}

    plug: dict[tuple[int, int], tuple[str, int]] = {}  # (node, rail) -> (leaf, port)
    for i in range(spec.nodes):
        g, slot = divmod(i, spec.nodes_per_leaf)
        for r in range(spec.rails):
            if spec.rail_optimized:
                plug[i, r] = (f"leaf-r{r}-{g + 1:02d}", slot + 1)
            else:
                plug[i, r] = (f"leaf-{g + 1:02d}", slot * spec.rails + r + 1)
    for i, ra, rb in spec.swap_rails:
        plug[i, ra], plug[i, rb] = plug[i, rb], plug[i, ra]

    cables = [Cable(leaf, port, spec.hca(i, r), 1) for (i, r), (leaf, port) in sorted(plug.items())]
    for li, (leaf, _, _) in enumerate(leaves):
        for s in range(spec.spines):
            for u in range(spec.uplinks):
                leaf_port = down + s * spec.uplinks + u + 1
                spine_port = li * spec.uplinks + u + 1
                cables.append(Cable(leaf, leaf_port, f"spine-{s + 1:02d}", spine_port))
    narrow, slow, missing = set(spec.narrow), set(spec.slow), set(spec.missing)
    kept = []
    for c in cables:
        if c.ends() & missing:
            continue
        width = 1 if c.ends() & narrow else None
        speed = 1 if c.ends() & slow else spec.speed
        kept.append(Cable(c.a, c.a_port, c.b, c.b_port, width, speed))
    return Topology(
        spec=spec,
        switches=switches,
        hcas=tuple(spec.hca(i, r) for i in range(spec.nodes) for r in range(spec.rails)),
        cables=tuple(kept),
        leaf_rail={name: rail for name, rail, _ in leaves},
    )
