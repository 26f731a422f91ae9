"""Verdicts of the NVLink acceptance tests (``acceptance/test_nvlink.py``), against ``nvlink:``.

- :func:`topology_checks`: every GPU pair of ``nvidia-smi topo -m`` on every node shows
  ``nvlink.topology``; the pairs that do not are named;
- :func:`link_checks`: each GPU has ``links_per_gpu`` links up at ``min_link_speed`` or faster;
- :func:`counter_checks`: every GPU's NVLink byte counters grew during an all_reduce by at least
  ``min_counter_fraction`` of what a ring must send per GPU;
- :func:`speedup_checks`: the fast path's busbw over the slow path's, per size, against
  ``min_speedup`` (and ``min_busbw`` on the fast side);
- :func:`isolated_check`: busbw over one fabric alone against its own floor.

Pure: the values the workloads returned (``workloads/nvlink_probe.py``, the sweeps) in, checks
out; no pytest, no launching. A key the profile does not set is the test's skip, not a check.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gpucluster.checks.comparison import Comparison, spread_of
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_topo import parse_topo_text, topology_mismatches
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, ThresholdRef
from pytest_gpucluster.results.text import format_value

__all__ = [
    "DEFAULT_COUNTER_FRACTION",
    "counter_checks",
    "isolated_check",
    "link_checks",
    "speedup_checks",
    "speedup_info",
    "topology_checks",
]

DEFAULT_COUNTER_FRACTION = 0.5
"""Used where the profile sets no ``min_counter_fraction``: a ring moves the full 2(n-1)/n, and
NCCL's NVLS all_reduce on an NVSwitch node about (1 + 1/n) / (2(n-1)/n) of it, 64% at 8 GPUs."""

Values = Sequence[Mapping[str, Any]]


def _ref(profile: ProfileModel, key: str) -> ThresholdRef:
    return ThresholdRef(profile.name, ("nvlink", key))


def _gbs(value: float) -> str:
    return format_value(value, "B/s")


def topology_checks(profile: ProfileModel, inventory: Values) -> list[Check]:
    """The number of GPU pairs not linked as ``nvlink.topology`` says (at most 0), naming each."""
    assert profile.nvlink is not None and profile.nvlink.topology is not None
    expected = profile.nvlink.topology
    problems: list[str] = []
    pairs = 0
    for node in inventory:
        host = node["host"]
        if node.get("topo_text") is None:
            problems.append(f"{host}: the matrix could not be read ({node.get('topo_error')})")
            continue
        try:
            topo = parse_topo_text(node["topo_text"])
        except ParseError as exc:
            problems.append(f"{host}: {exc}")
            continue
        pairs += len(topo.gpus) * (len(topo.gpus) - 1) // 2
        problems += [
            f"{host} {a}-{b} is {cell or 'unreadable'}" for a, b, cell in topology_mismatches(topo, expected)
        ]
    return [
        Check(
            "nvlink.topology_mismatches", len(problems), "GPU pairs", 0.0, "<=", _ref(profile, "topology"),
            labels={"expected": expected, "nodes": len(inventory), "pairs": pairs},
            hint=f"Not linked by {expected}: {'; '.join(problems)}. A pair at SYS, NODE, PHB, PXB or PIX talks "
            "over PCIe or the CPU interconnect; on that host look at `nvidia-smi topo -m` and `nvidia-smi nvlink -s`.",
        )
    ]  # fmt: skip


def _gpu_links(
    where: str, gpu: Mapping[str, Any], min_speed: float | None, want: int | None
) -> tuple[int, list[float], list[str]]:
    """(links up at speed, known speeds in B/s, problems) of one GPU."""
    links = gpu["links"]
    down = sorted((n for n, link in links.items() if not link["active"]), key=int)
    speeds = {n: link["speed_gbs"] for n, link in links.items() if link["active"]}
    slow = sorted(
        (n for n, s in speeds.items() if min_speed is not None and (s is None or s * 1e9 < min_speed)),
        key=int,
    )
    problems = []
    if down:
        problems.append(f"{where}: link{'s' if len(down) > 1 else ''} {', '.join(down)} down")
    if slow:
        shown = ", ".join(
            f"{n} at {'unknown speed' if speeds[n] is None else f'{speeds[n]:g} GB/s'}" for n in slow
        )
        problems.append(f"{where}: link {shown}")
    if want is not None and len(links) < want and not down:
        problems.append(f"{where}: only {len(links)} link(s) reported")
    return len(speeds) - len(slow), [s * 1e9 for s in speeds.values() if s is not None], problems


def link_checks(profile: ProfileModel, inventory: Values) -> list[Check]:
    """The fewest links up at speed on any GPU (against ``links_per_gpu``) and the slowest active
    link (against ``min_link_speed``), for whichever of the two the profile sets."""
    assert profile.nvlink is not None
    want, min_speed = profile.nvlink.links_per_gpu, profile.nvlink.min_link_speed
    fewest: int | None = None
    speeds: list[float] = []
    problems: list[str] = []
    gpus = 0
    for node in inventory:
        if not node["gpus"]:
            problems.append(f"{node['host']}: no GPU found ({node['links_source']})")
            fewest = 0
        for index, gpu in sorted(node["gpus"].items(), key=lambda kv: int(kv[0])):
            gpus += 1
            up, known, said = _gpu_links(f"{node['host']} GPU {index}", gpu, min_speed, want)
            fewest = up if fewest is None else min(fewest, up)
            speeds += known
            problems += said
    source = inventory[0]["links_source"] if inventory else "?"
    context = (
        f"{'; '.join(problems) or 'every link is up'} (from {source}). A link down or slow usually means a reseat, "
        "a bad cable/board or a fabric manager problem: `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` on that host."
    )
    out = []
    if want is not None:
        out.append(
            Check(
                "nvlink.links_up", float(fewest or 0), "links", want, ">=", _ref(profile, "links_per_gpu"),
                labels={"gpus": gpus, "min_link_speed": _gbs(min_speed) if min_speed else "any"},
                hint=f"The GPU with the fewest links up at speed has {fewest or 0}. {context}",
            )
        )  # fmt: skip
    if min_speed is not None:
        out.append(
            Check(
                "nvlink.link_speed", min(speeds, default=0.0), "B/s", min_speed, ">=", _ref(profile, "min_link_speed"),
                labels={"gpus": gpus},
                hint=f"The slowest active link. {context}" if want is None else "The slowest active link.",
            )
        )  # fmt: skip
    return out


def counter_checks(profile: ProfileModel, traffic: Values, job_dir: str) -> list[Check]:
    """Each GPU's share of the bytes a ring all_reduce must send (info), then the smallest share
    against ``min_counter_fraction`` (or :data:`DEFAULT_COUNTER_FRACTION`), naming the GPUs short of it."""
    assert profile.nvlink is not None
    set_fraction = profile.nvlink.min_counter_fraction
    threshold = DEFAULT_COUNTER_FRACTION if set_fraction is None else set_fraction
    values = sorted(traffic, key=lambda v: int(v["rank"]))
    out: list[Check] = []
    short: list[str] = []
    for v in values:
        expected, moved = float(v["expected_bytes"]), min(v["tx_bytes"], v["rx_bytes"])
        fraction = moved / expected if expected > 0 else 0.0
        labels = {"host": v["host"], "gpu": v["gpu"]["pci_bus_id"]}
        out.append(
            Check("nvlink.gpu_counter_fraction", fraction, "fraction", scope="intra-node", labels=labels)
        )
        if fraction < threshold:
            idle = [n for n, link in v["links"].items() if not link["tx_bytes"] and not link["rx_bytes"]]
            short.append(
                f"{v['host']} GPU {v['gpu']['pci_bus_id']} (rank {v['rank']}): "
                f"{'counters did not move' if moved == 0 else f'{fraction:.0%}'} (sent {v['tx_bytes']:,} B, "
                f"received {v['rx_bytes']:,} B of {expected:,.0f} B; {len(idle)} of {len(v['links'])} links idle; "
                f"counters from {v['counter_source']})"
            )
    first = values[0] if values else {}
    default = (
        ""
        if set_fraction is not None
        else f" The threshold is the default {threshold:.0%}: the profile sets no nvlink.min_counter_fraction."
    )
    out.append(
        Check(
            "nvlink.counter_fraction", min((c.value for c in out), default=0.0), "fraction", threshold, ">=",
            _ref(profile, "min_counter_fraction") if set_fraction is not None else None, "intra-node",
            {"size_bytes": first.get("size_bytes"), "iters": first.get("iters"), "gpus": len(values)},
            hint=f"{'; '.join(short)}. A GPU whose NVLink counters barely move sends its share another way (PCIe "
            "or host memory): check `nvidia-smi topo -m`, NCCL_P2P_LEVEL/NCCL_P2P_DISABLE in the environment and "
            f"NCCL_DEBUG=INFO 'via P2P' lines (job dir {job_dir}).{default}",
        )
    )  # fmt: skip
    return out


def speedup_info(comparison: Comparison) -> list[Check]:
    """Both sides' busbw per size, recorded (``nvlink.speedup.busbw``)."""
    return [
        Check(
            "nvlink.speedup.busbw",
            busbw,
            "B/s",
            scope="intra-node",
            labels={"size_bytes": point.size_bytes, "transport": side},
            spread=spread,
        )
        for point in comparison.points
        for side, busbw, spread in (
            (comparison.fast, point.fast_busbw, point.fast_spread()),
            (comparison.slow, point.slow_busbw, point.slow_spread()),
        )
    ]


def speedup_checks(
    profile: ProfileModel, comparison: Comparison, advice: str, untrusted: str | None = None
) -> list[Check]:
    """Per size: the fast side's busbw against ``min_busbw`` (where set), and fast over slow
    against ``min_speedup``; ``advice`` says what a ratio near 1 means on this kind of node.

    ``untrusted`` says why the ratio means nothing (the slow side was shown on NVLink, see
    ``checks/nvlink_transport.py``): the ratio is then recorded without a threshold, and the check
    that found the contradiction fails instead of a bogus speedup."""
    assert profile.nvlink is not None and profile.nvlink.min_speedup is not None
    section = profile.nvlink
    min_speedup = None if untrusted else section.min_speedup
    ref = None if untrusted else _ref(profile, "min_speedup")
    void = f"Not judged: {untrusted}. " if untrusted else ""
    out = speedup_info(comparison)
    for point in comparison.points:
        if section.min_busbw is not None:
            out.append(
                Check(
                    "nvlink.busbw", point.fast_busbw, "B/s", section.min_busbw, ">=", _ref(profile, "min_busbw"),
                    "intra-node", {"size_bytes": point.size_bytes, "transport": comparison.fast},
                    point.fast_spread(), f"all_reduce busbw on the fast path ({comparison.origin}).",
                )
            )  # fmt: skip
        out.append(
            Check(
                "nvlink.speedup", point.ratio, "x", min_speedup, ">=", ref,
                "intra-node", {"size_bytes": point.size_bytes, "pair": comparison.pair}, point.ratio_spread(),
                f"{void}{comparison.fast} all_reduce busbw {_gbs(point.fast_busbw)} over {comparison.slow} "
                f"{_gbs(point.slow_busbw)} ({comparison.origin}). {advice}",
            )
        )  # fmt: skip
    return out


def isolated_check(
    profile: ProfileModel, key: str, scope: str, size: int, repeats: Sequence[float], how: str
) -> Check:
    """All_reduce busbw over one fabric alone (``isolated_intra_min_busbw`` or
    ``isolated_inter_min_busbw``): the median of the repeats against the key's floor."""
    assert profile.nvlink is not None
    metric = f"nvlink.{key.removesuffix('_min_busbw')}.busbw"
    return Check(
        metric, statistics.median(repeats), "B/s", getattr(profile.nvlink, key), ">=", _ref(profile, key), scope,
        {"size_bytes": size, "collective": "all_reduce"}, spread_of(repeats), f"all_reduce {how}.",
    )  # fmt: skip
