"""Bus-bandwidth floors against the links that carry them, and against the algorithm that must run.

Hard ceiling (:func:`busbw_ceiling`, an error when exceeded)
    nccl-tests defines ``busbw = algbw x bus_factor`` (``metrics.bus_factor``) so that, for the
    bandwidth-optimal algorithms NCCL runs, busbw *is* the number of bytes each rank moves over its
    link per second. The general bound is

        busbw <= B x bus_factor(collective, n ranks) / traffic(collective, U units)

    where ``B`` is one unit's bandwidth per direction and ``traffic`` the fewest bytes, per byte of
    message, each unit must send or receive (Patarasuk & Yuan 2009 for all_reduce): 2(U-1)/U for
    all_reduce, (U-1)/U for all_gather and reduce_scatter, r(U-1)/U for alltoall with r ranks per
    unit, 1 for broadcast, reduce and sendrecv. Inside a node the unit is the GPU and the ratio is
    exactly 1: the ceiling is the link. Across nodes the unit is the node, ``B`` the NICs NCCL uses
    x line rate, and a 2-node all_reduce of 16 ranks may reach ``B x 1.875`` (AWS measures 487 GB/s
    between two p5 whose EFA carries 400 GB/s). In-switch reduction (NVLS inside an NVSwitch node;
    CollNet/SHARP across nodes with ``NCCL_COLLNET_ENABLE=1``) lowers all_reduce traffic to 1.

What Ring reaches (:func:`ring_ceiling`), for all_reduce floors of ``collectives.checks``
    Ring moves ``2(n-1)/n`` of the message over every link, so its busbw is at most the link
    itself: inside an NVLink node NCCL gets ~82% of the line rate (370 of 450 GB/s on H100: "with
    the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s ... when
    running with NCCL_ALGO=RING", NVIDIA/nccl-tests#212; 368.76 GB/s measured with NVLS off,
    NVIDIA/nccl-tests#309); across nodes at most the NICs' line rate. A floor above that needs
    another algorithm: NVLS inside a node (~480 GB/s on 8 x H100), Tree/NVLSTree/CollNet across
    nodes ("on two nodes, NCCL uses the tree (or nvlstree) algorithm which can indeed go beyond
    the network bottleneck", NVIDIA/nccl-tests#196). Such a floor must name the algorithm it
    assumes (``algo:``); the environment of its job must allow it (an error otherwise: class 3 of
    thresholds/README.md); and across nodes the job must force it, because "NCCL may or may not
    select the Tree algorithm on 2 nodes depending on its performance" (same thread). An
    inter-node floor below half of what its algorithm can reach is warned about: a node with half
    its NICs down would pass it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpucluster.maths import metrics
from pytest_gpucluster.profiles.findings import Collector, KeyPath, gbs, pct
from pytest_gpucluster.profiles.nccl_env import allowed_algorithms, scope_env
from pytest_gpucluster.profiles.peaks import Peaks, node_network
from pytest_gpucluster.profiles.schema import CollectiveCheck, ProfileModel

__all__ = [
    "FLOOR_FAR_BELOW",
    "NVLINK_NCCL_EFFICIENCY",
    "Ceiling",
    "busbw_ceiling",
    "check_busbw",
    "check_collective_floor",
    "ring_ceiling",
]

NVLINK_NCCL_EFFICIENCY = 370 / 450
"""Share of the NVLink line rate NCCL's Ring reaches (NVIDIA/nccl-tests#212, H100: 370 of 450)."""

FLOOR_FAR_BELOW = 0.5
"""An inter-node floor below this share of its algorithm's ceiling cannot catch a node running on
half its NICs."""

_BEYOND_RING = {1: ("NVLS",), 2: ("Tree", "NVLSTree", "CollNetDirect", "CollNetChain")}


@dataclass(frozen=True, slots=True)
class Ceiling:
    value: float
    arithmetic: str


def _traffic(collective: str, units: int, ranks_per_unit: int, in_network: bool) -> tuple[float, str]:
    """Fewest bytes per message byte each unit must move one way; and how that is written."""
    u = units
    if collective == "all_reduce":
        if in_network:
            return 1.0, "1 (reduced in the switch: each unit sends its data once and receives the sum once)"
        return 2.0 * (u - 1) / u, f"2(U-1)/U = {2.0 * (u - 1) / u:.4g}"
    if collective in ("all_gather", "reduce_scatter"):
        return (u - 1) / u, f"(U-1)/U = {(u - 1) / u:.4g}"
    if collective == "alltoall":
        value = ranks_per_unit * (u - 1) / u
        return value, f"r(U-1)/U = {value:.4g}"
    return 1.0, "1"


def _scope_nodes(scope: str, model: ProfileModel) -> int:
    return {"intra-node": 1, "inter-node": 2, "full": model.cluster.nodes}[scope]


def busbw_ceiling(
    collective: str, scope: str, model: ProfileModel, peaks: Peaks, env: dict[str, str] | None = None
) -> Ceiling | str:
    """The largest busbw the links can carry at this scope, or a string saying why it is unknown.
    ``env`` is the job's NCCL environment (default: the scope's, :func:`nccl_env.scope_env`)."""
    cluster = model.cluster
    if cluster.device == "cpu":
        return "a CPU profile: its ranks talk through host memory, for which no peak is recorded"
    env = scope_env(model, scope) if env is None else env
    per_node = cluster.effective_ranks_per_node
    nodes = _scope_nodes(scope, model)
    ranks = nodes * per_node
    if ranks < 2:
        return "one rank moves nothing over a link"
    factor = metrics.bus_factor(collective, ranks)
    factor_text = {
        "all_reduce": "2(n-1)/n",
        "all_gather": "(n-1)/n",
        "reduce_scatter": "(n-1)/n",
        "alltoall": "(n-1)/n",
    }.get(collective, "1")
    if nodes == 1:
        bw = peaks.intra_link
        if bw is None:
            return "no per-GPU link bandwidth (cluster.nvlink_bandwidth, or a gpu_model in devices.yaml)"
        in_network = collective == "all_reduce" and peaks.nvls and env.get("NCCL_NVLS_ENABLE") != "0"
        units, r, unit_name = ranks, 1, "GPU"
    else:
        bw = node_network(model, env)
        if bw is None:
            return "no network figures (cluster.nic_line_rate and cluster.nics_per_node)"
        in_network = collective == "all_reduce" and env.get("NCCL_COLLNET_ENABLE") == "1"
        units, r, unit_name = nodes, per_node, "node"
    traffic, traffic_text = _traffic(collective, units, r, in_network)
    value = bw.value * factor / traffic
    arithmetic = (
        f"B x bus factor / traffic per {unit_name} = {gbs(bw.value)} ({bw.source}) "
        f"x {factor_text} = {factor:.4g} (n = {ranks} ranks) / {traffic_text} "
        f"(U = {units} {unit_name}s{f', r = {r} ranks each' if collective == 'alltoall' else ''}) "
        f"= {gbs(value)}"
    )
    if nodes == 1 and not in_network:
        arithmetic += (
            "; inside one node busbw is normalised to the bytes each GPU moves, so this is the link itself"
        )
    if in_network and nodes == 1:
        plain = bw.value * factor / _traffic(collective, units, r, False)[0]
        arithmetic += f"; this allows NVLink SHARP (NVLS) in-switch reduction, without which the ceiling is {gbs(plain)}"
    return Ceiling(value, arithmetic)


def ring_ceiling(scope: str, model: ProfileModel, peaks: Peaks, env: dict[str, str]) -> Ceiling | None:
    """The busbw Ring (and Tree inside a node) can reach for all_reduce at ``scope``; None unknown."""
    if model.cluster.device == "cpu":
        return None
    nodes = _scope_nodes(scope, model)
    if nodes == 1:
        link = peaks.intra_link
        if link is None:
            return None
        if not peaks.intra_is_nvlink:
            return Ceiling(link.value, f"{gbs(link.value)} ({link.source}), the link itself")
        value = link.value * NVLINK_NCCL_EFFICIENCY
        return Ceiling(
            value,
            f"{gbs(link.value)} ({link.source}) x {NVLINK_NCCL_EFFICIENCY:.3f} = {gbs(value)}: NCCL's protocol "
            "overhead is ~20% of the NVLink line rate (370 of 450 GB/s on H100, NVIDIA/nccl-tests#212)",
        )
    network = node_network(model, env)
    if network is None:
        return None
    return Ceiling(
        network.value,
        f"{gbs(network.value)} ({network.source}): Ring moves 2(n-1)/n of the message through the NICs, "
        "so its busbw is at most their line rate",
    )


def check_busbw(
    out: Collector,
    key: KeyPath,
    value: float,
    collective: str,
    scope: str,
    model: ProfileModel,
    peaks: Peaks,
) -> Ceiling | None:
    """Error when ``value`` is above the hard ceiling; returns the ceiling when it was checked."""
    ceiling = busbw_ceiling(collective, scope, model, peaks)
    if isinstance(ceiling, str):
        out.skip(key, f"not checked against the links: {ceiling}")
        return None
    out.checked += 1
    if value > ceiling.value:
        out.error(
            key,
            f"min_busbw {gbs(value)} ({collective}, {scope}) is more than the links can carry: "
            f"busbw ceiling = {ceiling.arithmetic}; {gbs(value)} > {gbs(ceiling.value)}",
        )
        return None
    return ceiling


def _env_text(model: ProfileModel, scope: str) -> str:
    scoped = model.collectives.scope_env.get(scope, {})  # type: ignore[call-overload]
    parts = [
        f"{name}={value!r} ({'collectives.scope_env.' + scope if name in scoped else 'nccl_env'})"
        for name, value in scope_env(model, scope).items()
        if name in ("NCCL_ALGO", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE")
    ]
    return ", ".join(parts) or "no NCCL_ALGO (NCCL chooses)"


def check_collective_floor(
    out: Collector, index: int, check: CollectiveCheck, model: ProfileModel, peaks: Peaks
) -> None:
    """A ``collectives.checks[index]`` busbw floor: hard ceiling, then (all_reduce) the algorithm."""
    if check.min_busbw is None:
        return
    base: KeyPath = ("collectives", "checks", index)
    key = (*base, "min_busbw")
    ceiling = check_busbw(out, key, check.min_busbw, check.collective, check.scope, model, peaks)
    if ceiling is None or check.collective != "all_reduce":
        return
    env = scope_env(model, check.scope)
    ring = ring_ceiling(check.scope, model, peaks, env)
    if ring is None:
        return
    value, scope, nodes = check.min_busbw, check.scope, min(_scope_nodes(check.scope, model), 2)
    on_hardware = {"NVLS", "NVLSTree"} if not peaks.nvls else set()
    allowed = allowed_algorithms(env, "all_reduce", nodes) - on_hardware
    job = f"the {scope} job's NCCL environment ({_env_text(model, scope)})"
    if check.algo in on_hardware:
        device = f"devices.yaml {peaks.device.key}" if peaks.device else "no gpu_model with NVLink SHARP"
        out.error(
            (*base, "algo"),
            f"algo {check.algo} needs NVLink SHARP (a third-generation NVSwitch), which this hardware lacks "
            f"({device}, or nccl.nvls: false / NCCL_NVLS_ENABLE=0)",
        )
        return
    if check.algo is not None and check.algo not in allowed:
        out.error(
            (*base, "algo"),
            f"algo {check.algo}: {job} leaves all_reduce only {', '.join(sorted(allowed)) or 'nothing'}, "
            f"so the floor {gbs(value)} is measured with an algorithm it was not set for",
        )
        return
    if value > ring.value:
        _beyond_ring(out, base, check, nodes, peaks, allowed, ring, job)
        return
    reference = ring if check.algo in (None, "Ring") else ceiling
    if nodes >= 2 and value < FLOOR_FAR_BELOW * reference.value:
        out.warning(
            key,
            f"min_busbw {gbs(value)} ({scope}) is {pct(value / reference.value)} of what "
            f"{check.algo or 'Ring'} can reach ({reference.arithmetic}): below {pct(FLOOR_FAR_BELOW)}, a node "
            "with half its NICs down still passes. Raise the floor to a measured healthy figure.",
        )


def _beyond_ring(
    out: Collector,
    base: KeyPath,
    check: CollectiveCheck,
    nodes: int,
    peaks: Peaks,
    allowed: frozenset[str],
    ring: Ceiling,
    job: str,
) -> None:
    value = check.min_busbw or 0.0
    possible = [a for a in _BEYOND_RING[nodes] if peaks.nvls or not a.startswith("NVLS")]
    beyond = [a for a in possible if a in allowed]
    head = f"min_busbw {gbs(value)} (all_reduce, {check.scope}) is above what Ring reaches, {ring.arithmetic}"
    key = (*base, "min_busbw")
    if not beyond:
        out.error(
            key,
            f"{head}; only {' or '.join(possible) or 'an in-switch reduction this hardware lacks'} can, and {job} "
            f"leaves all_reduce {', '.join(sorted(allowed)) or 'nothing'}. The floor cannot pass: drop NCCL_ALGO "
            "from nccl_env or scope it to other jobs (collectives.scope_env), or set a floor measured with Ring.",
        )
    elif check.algo is None:
        out.error(
            (*base, "algo"),
            f"{head}, so it assumes {' or '.join(beyond)}: record which with algo: "
            f"{beyond[0]} (the algorithm the floor was measured with)",
        )
    elif check.algo not in beyond:
        out.error(
            (*base, "algo"),
            f"{head}; algo {check.algo} cannot reach it (only {', '.join(beyond)} can here)",
        )
    elif nodes >= 2 and allowed - set(beyond):
        out.error(
            key,
            f"{head}; the floor assumes {check.algo}, but {job} also lets NCCL choose "
            f"{', '.join(sorted(allowed - set(beyond)))} on 2 nodes (NVIDIA/nccl-tests#196: NCCL picks Tree "
            "or not by its own model). Force it: collectives.scope_env."
            f"{check.scope}.NCCL_ALGO: 'allreduce:{check.algo}' (NCCL 2.24+).",
        )
