"""A real results.json fanned out to a fleet: N nodes x G GPUs, for the report's scale benchmark and tests.

There is no 512-node cluster here, so the report's scale is measured on a real run's results made
fleet-sized: every value that names a host is repeated on each node (one per GPU where it names a
rank), centred on the median of the real run's values of the same point with ±``noise`` uniform
noise; cluster-level values (no host) stay as they were. Only continuous readings get noise: a
value checked for equality (``==``), a boolean (unit ``bool``), a counter with a zero ceiling
(``<= 0``) and a point whose every real value is a whole number (GPU counts, PCIe generation and
lanes, clocks and temperatures NVML reads as integers, error counts) are repeated exactly, their
centre the real run's lower median, so a fanned healthy node reads what a real healthy node reads
(1 GPU, not 0.9956) and passes the checks the real one passed. Two faults can be planted, the way the
report must show them: one slow GPU (its matmul at ``slow_factor`` of the centre) and one failed
port (its error counter ``port_errors`` above a zero threshold). The tests whose values now fail
fail (category performance, the first failure's sentence as message); those that failed in the
real run for a value that now passes pass.

Deterministic for a seed; standard library only.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.results.model import Measurement
from pytest_gpucluster.results.text import failure_message

__all__ = ["Planted", "fan_out", "node_name"]

_WHO = ("host", "node", "rank", "gpu")


def node_name(index: int) -> str:
    return f"node{index + 1:03d}"


@dataclass(frozen=True, slots=True)
class Planted:
    """Where the faults were planted: node names, the GPU index, the port (interface) name."""

    slow_node: str | None
    slow_gpu: str | None
    slow_metric: str | None
    port_node: str | None
    port: str | None
    port_metric: str | None


def _point(data: Mapping[str, Any]) -> str:
    labels = data.get("labels") or {}
    rest = ",".join(f"{k}={labels[k]}" for k in sorted(labels) if k not in _WHO)
    return f"{data['metric']}|{data.get('scope') or ''}|{rest}"


def _discrete(data: Mapping[str, Any], real: list[float]) -> bool:
    """Whether a point's values are exact readings that noise must not move (module docstring)."""
    if data.get("comparison") == "==" or data.get("unit") == "bool":
        return True
    if data.get("comparison") == "<=" and data.get("threshold") == 0:
        return True
    return bool(real) and all(float(v).is_integer() for v in real)


def _scaled(data: dict[str, Any], factor: float) -> dict[str, Any]:
    out = dict(data)
    if isinstance(out.get("value"), (int, float)) and out.get("unit") != "bool":
        out["value"] = out["value"] * factor
    spread = out.get("spread")
    if spread:
        spread = dict(spread)
        for key in ("median", "min", "max", "mad"):
            spread[key] = spread[key] * factor
        spread["values"] = [v * factor for v in spread.get("values", ())]
        out["spread"] = spread
    return out


def _verdict(data: dict[str, Any]) -> dict[str, Any]:
    data["verdict"] = Measurement.from_json(data).verdict
    return data


def fan_out(
    results: Mapping[str, Any],
    nodes: int,
    gpus_per_node: int = 8,
    *,
    noise: float = 0.02,
    seed: int = 0,
    slow_factor: float = 0.6,
    plant: bool = True,
    port_errors: float = 37.0,
) -> tuple[dict[str, Any], Planted]:
    """``results`` (a parsed results.json) as a run on ``nodes`` x ``gpus_per_node`` (module docstring).

    The slow GPU is GPU ``gpus_per_node // 2 + 1`` of the node a third into the list, on the first
    per-rank metric with "matmul" in its name and a floor; the failed port is the first per-node
    error counter with a zero ceiling, on the node two thirds into the list."""
    rng = random.Random(seed)
    source = list(results.get("measurements") or ())
    centres: dict[str, list[float]] = defaultdict(list)
    for m in source:
        if isinstance(m.get("value"), (int, float)):
            centres[_point(m)].append(float(m["value"]))
    discrete = {
        _point(m)
        for m in source
        if isinstance(m.get("value"), (int, float)) and _discrete(m, centres[_point(m)])
    }
    centre = {
        k: (statistics.median_low if k in discrete else statistics.median)(v) for k, v in centres.items()
    }
    names = [node_name(i) for i in range(nodes)]
    slow_gpu = str(min(gpus_per_node - 1, gpus_per_node // 2 + 1))
    slow_metric = next(
        (
            m["metric"]
            for m in source
            if "rank" in (m.get("labels") or {})
            and "matmul" in m["metric"]
            and m.get("comparison") == ">="
            and m.get("threshold") is not None
        ),
        None,
    )
    port_metric = next(
        (
            m["metric"]
            for m in source
            if "device" in (m.get("labels") or {}) and m.get("threshold") == 0 and m.get("comparison") == "<="
        ),
        None,
    )
    slow_node = names[nodes // 3] if plant and slow_metric else None
    port_node = names[(2 * nodes) // 3] if plant and port_metric else None
    out: list[dict[str, Any]] = []
    seen_per_rank: set[str] = set()
    port_name: str | None = None
    for m in source:
        labels = m.get("labels") or {}
        host_key = "host" if "host" in labels else ("node" if "node" in labels else None)
        if host_key is None:
            out.append(dict(m))
            continue
        point = _point(m)
        real = centre.get(point)
        base = dict(m) if real is None else {**m, "value": real}
        if (
            real is not None
            and point not in discrete
            and isinstance(m.get("value"), (int, float))
            and m["value"]
        ):
            base = _scaled(dict(m), real / m["value"])
        if "rank" in labels:
            if point in seen_per_rank:
                continue  # the first rank of a point is the template of every GPU
            seen_per_rank.add(point)
            for n, node in enumerate(names):
                for g in range(gpus_per_node):
                    factor = 1 + noise * rng.uniform(-1, 1)
                    if point in discrete:
                        factor = 1.0
                    if (node, str(g), m["metric"]) == (slow_node, slow_gpu, slow_metric):
                        factor = slow_factor
                    copy_ = _scaled(base, factor)
                    copy_["labels"] = {**labels, host_key: node, "rank": n * gpus_per_node + g, "gpu": str(g)}
                    out.append(_verdict(copy_))
            continue
        for node in names:
            factor = 1 + noise * rng.uniform(-1, 1)
            copy_ = _scaled(base, 1.0 if point in discrete else factor)
            copy_["labels"] = {**labels, host_key: node}
            if node == port_node and m["metric"] == port_metric and port_name is None:
                copy_["value"] = port_errors
                port_name = str(labels.get("device"))
            out.append(_verdict(copy_))
    fanned = copy.deepcopy(
        {k: v for k, v in results.items() if k not in ("measurements", "outcomes", "findings")}
    )
    fingerprint = dict(fanned.get("fingerprint") or {})
    fingerprint.update(hosts=names, gpu_count=nodes * gpus_per_node)
    fanned["fingerprint"] = fingerprint
    probe = fanned.get("nodes")
    if isinstance(probe, dict) and probe.get("nodes"):
        template = probe["nodes"][0]
        real = list(template.get("gpus") or [])
        part = real[0] if real else {"name": "stand-in GPU", "memory_bytes": None}
        gpus = real if len(real) == gpus_per_node else [
            {**part, "index": g, "uuid": None, "bus_id": None} for g in range(gpus_per_node)
        ]  # fmt: skip  # the inventory lists the GPUs the fanned values name, as a GPU node's probe would
        probe["nodes"] = [{**template, "host": node, "gpus": gpus} for node in names]
    fanned["measurements"] = out
    fanned["outcomes"] = _outcomes(results.get("outcomes") or (), out)
    planted = Planted(
        slow_node, slow_gpu if slow_metric else None, slow_metric, port_node, port_name, port_metric
    )
    fanned["planted"] = {k: getattr(planted, k) for k in Planted.__slots__}
    return fanned, planted


def _outcomes(outcomes: Any, measurements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first_failure: dict[str, str] = {}
    for m in measurements:
        if m.get("verdict") == "fail" and m.get("test_id") not in first_failure:
            first_failure[m["test_id"]] = failure_message(Measurement.from_json(m))
    fixed = []
    for o in outcomes:
        o = dict(o)
        if o["test_id"] in first_failure:
            o.update(
                outcome="failed",
                category="performance",
                message="pytest_gpucluster.results.recorder.ThresholdFailure: " + first_failure[o["test_id"]],
            )
        elif o.get("category") == "performance":
            o.update(outcome="passed", category="pass", message="")
        fixed.append(o)
    return fixed


def dumps(results: Mapping[str, Any]) -> str:
    """As the recorder writes results.json (``indent=1``)."""
    return json.dumps(results, indent=1, default=str)
