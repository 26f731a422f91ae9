"""Verdicts of the inventory (``acceptance/test_inventory.py``): is every node the node the profile describes?

Pure functions from the per-node probe's facts (`cluster.node_facts.ClusterFacts`) and the profile
to `Check`s, one per node (and per GPU or port where that is the unit), each naming the node that
differs: ``node gpu-07: 7 GPUs, profile wants 8``; ``node gpu-05: driver 550.54.15 while the
others run 565.57.01``. The GPU model is matched as a part (`profiles.devices.same_part`): a
"GH200 480GB" is not the "H200" a profile names. Ports are judged by `checks.ports`, foreign GPU
processes by `cluster.gpu_occupancy`.

No pytest, no torch, no launching.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from pytest_gpucluster.checks.ports import PortExpectation, port_checks
from pytest_gpucluster.cluster.gpu_occupancy import foreign_gpu_use
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.profiles.devices import same_part
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, ThresholdRef

__all__ = [
    "VERSION_KEYS",
    "cuda_checks",
    "fabric_checks",
    "foreign_process_checks",
    "gpu_count_checks",
    "gpu_memory_checks",
    "gpu_model_checks",
    "nccl_backend_checks",
    "probe_checks",
    "version_checks",
]

VERSION_KEYS = {"driver": "driver", "cuda_driver": "CUDA driver", "nccl": "NCCL", "torch": "torch"}
"""What every node must agree on, and how messages name it."""


def _ref(profile: ProfileModel, key: str) -> ThresholdRef:
    return ThresholdRef(profile.name, ("cluster", key))


def _answered(facts: ClusterFacts) -> list[NodeFacts]:
    """The nodes whose probe came back (the others fail `probe_checks`, once)."""
    return [n for n in facts.nodes if not n.error]


def probe_checks(facts: ClusterFacts) -> list[Check]:
    """Every node's probe rank answered."""
    return [
        Check(
            "inventory.node_probed",
            float(not n.error),
            "bool",
            1.0,
            "==",
            None,
            labels={"host": n.host},
            hint=f"node {n.host}: {n.error or 'probed'}" + (f" ({facts.source})" if n.error else ""),
        )
        for n in facts.nodes
    ]


def cuda_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """A CUDA profile's nodes list GPUs and their torch can use them; a CPU profile's have none to use."""
    expects = profile.cluster.device == "cuda"
    checks = []
    for node in _answered(facts):
        why = node.capabilities()["cuda"]
        if expects:
            hint = f"node {node.host}: " + (why or f"{node.gpu_count} GPU(s) usable by torch {node.torch}")
        else:
            hint = f"node {node.host}: profile {profile.name} is CPU-only" + (
                "" if why else " but this node has usable GPUs; pick a GPU profile with --hw"
            )
        checks.append(Check("inventory.cuda_available", float(why is None), "bool", float(expects), "==",
                            _ref(profile, "device"), labels={"host": node.host}, hint=hint))  # fmt: skip
    return checks


def gpu_count_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """Each node has exactly ``cluster.gpus_per_node`` GPUs."""
    want = profile.cluster.gpus_per_node
    checks = []
    for node in _answered(facts):
        hint = f"node {node.host}: {node.gpu_count} GPU{'s' if node.gpu_count != 1 else ''}, profile wants {want}"
        if node.gpus and node.gpu_count != want:
            listed = ", ".join(f"{g.index}: {g.bus_id or g.name}" for g in node.gpus)
            hint += (
                f" ({node.gpu_source} lists {listed}; a GPU missing from the list has fallen off the bus "
                "or lost its driver: dmesg | grep -i xid on the node)"
            )
        elif not node.gpus:
            hint += f" ({node.gpu_problem or 'nothing listed a GPU'})"
        checks.append(Check("inventory.gpus_per_node", node.gpu_count, "GPUs", want, "==",
                            _ref(profile, "gpus_per_node"), labels={"host": node.host}, hint=hint))  # fmt: skip
    return checks


def gpu_model_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """Each node's GPUs are all the part ``cluster.gpu_model`` names, matched exactly."""
    model = profile.cluster.gpu_model or ""
    checks = []
    for node in _answered(facts):
        wrong = [g for g in node.gpus if not same_part(model, g.name)]
        matching = node.gpu_count - len(wrong)
        if wrong:
            names = sorted({g.name for g in wrong})
            hint = f"node {node.host}: {len(wrong)} GPU(s) are {', '.join(map(repr, names))}, not the {model!r} profile {profile.name} names"
            if any(g.name_cut for g in wrong):
                hint += " (nvidia-smi's table cut the name short; install nvidia-ml-py on the nodes for full names)"
        else:
            hint = f"node {node.host}: {matching} x {model}"
        checks.append(Check("inventory.gpus_matching_model", matching, "GPUs", profile.cluster.gpus_per_node, "==",
                            _ref(profile, "gpu_model"), labels={"host": node.host, "model": model}, hint=hint))  # fmt: skip
    return checks


GPU_MEMORY_FLOOR = 0.9
"""The share of ``cluster.gpu_memory`` a GPU must report. Healthy parts report a little less than
the marketed size: an H200 reports 143771 MiB, 99.6% of 141 GiB; an H100 SXM 81559 MiB, 99.6% of 80
GiB; an L40S with ECC on 46068 MiB, 93.7% of 48 GiB (ECC's reserve on GDDR). A MIG slice, a smaller
part of the same name or a GPU that lost memory reports far less (a 1g.18gb slice of an H200: 12.8%)."""


def gpu_memory_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """Each GPU's total memory (as NVML or nvidia-smi report it) against ``cluster.gpu_memory``,
    one check per GPU; a GPU whose total was not reported fails NOT MEASURED, naming it."""
    want = profile.cluster.gpu_memory
    if want is None:
        return []
    floor = want * GPU_MEMORY_FLOOR
    checks = []
    for node in _answered(facts):
        for g in node.gpus:
            have = math.nan if g.memory_bytes is None else float(g.memory_bytes)
            hint = (
                f"GPU {g.index} of {node.host} ({g.name}) reports {'no memory size' if math.isnan(have) else f'{have / 2**30:.1f} GiB'}; "
                f"profile {profile.name} sets cluster.gpu_memory {want / 2**30:.0f} GiB, and a GPU must report at least "
                f"{GPU_MEMORY_FLOOR:.0%} of it. Much less is a MIG slice, another part, or a GPU that lost memory: "
                "look at nvidia-smi -q -d MEMORY on that node."
            )
            checks.append(Check("inventory.gpu_memory", have, "B", floor, ">=", _ref(profile, "gpu_memory"),
                                labels={"host": node.host, "gpu": str(g.index)}, hint=hint))  # fmt: skip
    return checks


def _version_of(key: str) -> Callable[[NodeFacts], str | None]:
    return lambda node: getattr(node, key)


def version_checks(facts: ClusterFacts) -> list[Check]:
    """Every node runs the same driver, CUDA driver, NCCL and torch as the majority of nodes; a
    version no node reports (no GPUs, no NCCL) is not judged."""
    nodes = _answered(facts)
    checks = []
    for key, name in VERSION_KEYS.items():
        read = _version_of(key)
        seen = Counter(v for n in nodes if (v := read(n)))
        if not seen:
            continue
        common, _ = seen.most_common(1)[0]
        others = ", ".join(sorted(seen))
        for node in nodes:
            value = read(node)
            if value is None:
                continue
            same = value == common
            hint = f"node {node.host}: {name} {value}" + (
                "" if same else f" while the others run {common} (versions seen: {others})"
            )
            checks.append(Check(f"inventory.same_{key}", float(same), "bool", 1.0, "==", None,
                                labels={"host": node.host, key: value}, hint=hint))  # fmt: skip
    return checks


def nccl_backend_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """With ``backend: nccl``, each node's torch has the NCCL backend (asked where GPUs were listed)."""
    if profile.cluster.backend != "nccl":
        return []
    checks = []
    for node in _answered(facts):
        have = node.nccl_available
        hint = f"node {node.host}: torch {node.torch} " + (
            "has the NCCL backend"
            if have
            else "has no NCCL backend"
            if have is False
            else "was not asked (no GPU listed)"
        )
        checks.append(Check("inventory.backend_nccl", float(bool(have)), "bool", 1.0, "==",
                            _ref(profile, "backend"), labels={"host": node.host}, hint=hint))  # fmt: skip
    return checks


def fabric_checks(facts: ClusterFacts, profile: ProfileModel) -> list[Check]:
    """Each node's fabric ports against ``cluster.interconnects``/``nics_per_node``/``nic_line_rate``."""
    expect = PortExpectation.from_profile(profile)
    return [check for node in _answered(facts) for check in port_checks(node.host, node.ib_ports, expect)]


def foreign_process_checks(facts: ClusterFacts) -> list[Check]:
    """No GPU of any node is held by a process that is not this run's: measured numbers would be
    shared with it. One check per node (and per occupied GPU); nodes whose processes cannot be
    listed are recorded, not judged."""
    nodes = [n for n in _answered(facts) if n.gpus]
    try:
        foreign, scrambled = foreign_gpu_use(
            {n.host: list(n.processes) for n in nodes},
            {n.host: [n.probe_pid] if n.probe_pid else [] for n in nodes},
        )
    except ParseError as exc:
        return [Check("inventory.gpu_processes_readable", 0.0, "bool", 1.0, "==", None, hint=str(exc))]
    checks = [
        Check(
            "inventory.foreign_gpu_processes",
            len(use.processes),
            "processes",
            0,
            "==",
            None,
            labels={"host": use.host, "gpu": use.gpu},
            hint=use.sentence(),
        )
        for use in foreign
    ]
    checks += [
        Check(
            "inventory.gpu_processes_readable",
            0.0,
            "bool",
            1.0,
            "==",
            None,
            labels={"host": s.host, "gpu": s.gpu},
            hint=s.sentence(),
        )
        for s in scrambled
    ]
    busy = {use.host for use in foreign}
    for node in nodes:
        if node.host in busy:
            continue
        unlisted = node.gpu_source == "nvml" and node.processes_problem
        hint = f"node {node.host}: " + (
            f"its GPU processes could not be listed ({node.processes_problem})"
            if unlisted
            else f"no process outside this run holds a GPU ({node.gpu_source})"
        )
        checks.append(Check("inventory.foreign_gpu_processes", 0, "processes", None if unlisted else 0, "==", None,
                            labels={"host": node.host}, hint=hint))  # fmt: skip
    return checks
