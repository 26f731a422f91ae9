"""The fail-closed table: each threshold key of the profile schema, the tests that judge it, where it
must be measured (its grain) and which capabilities of the cluster its tests need.

Every leaf key of the schema is either a threshold here (:data:`OWNERS`) or named a setting
(:data:`NOT_THRESHOLDS`); a unit test walks the schema and keeps the two whole, and another checks
that each owner names a test function that exists in ``acceptance/``. So a new profile key cannot
slip past the fail-closed rule, and a renamed test cannot quietly orphan its thresholds.

Grain (where the threshold must have a value, `checks/fail_closed.py`):

- ``cluster``: one value anywhere covers it (a collective's busbw over all nodes, a version pin);
- ``node``: every node of the inventory needs its own value (labels ``host`` or ``node``);
- ``gpu``: every GPU of the inventory needs its own value where the key's values name GPUs (label
  ``gpu``); a key whose values name only ranks and hosts (a CPU matmul per rank) is judged per node.

Needs: the capabilities without which the owners cannot measure anything, so that their skip is
excused (`checks/fail_closed_inventory.py` says which ones a cluster lacks and why).

Pure data and two small functions; imports only the profile model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["NOT_THRESHOLDS", "ONLY_WHERE_WRITTEN", "OWNERS", "WHOLE", "Grain", "KeyPath", "Owner", "Rule"]

KeyPath = tuple[str | int, ...]
Grain = Literal["cluster", "node", "gpu"]


@dataclass(frozen=True, slots=True)
class Owner:
    """A test that judges a threshold: ``test_sft.py::test_sft[tiny-zero2]`` is
    ``Owner("test_sft.py", "test_sft", "tiny-zero2")``; ``param`` None: every parameter."""

    module: str
    function: str
    param: str | None = None

    def matches(self, test_id: str) -> bool:
        path, _, name = test_id.partition("::")
        if "@" in name and not name.endswith("]"):
            name = name.rsplit("@", 1)[0]  # pytest-xdist's loadgroup appends "@<group>"
        if path.rsplit("/", 1)[-1] != self.module:
            return False
        function, _, bracket = name.partition("[")
        if function != self.function:
            return False
        if self.param is None:
            return True
        ids = bracket.removesuffix("]")
        p = self.param
        # pytest joins the ids of several parametrizations with "-"
        return ids == p or ids.startswith(f"{p}-") or ids.endswith(f"-{p}") or f"-{p}-" in ids

    def __str__(self) -> str:
        return f"{self.module}::{self.function}" + (f"[{self.param}]" if self.param else "")


_Owners = Callable[[ProfileModel, KeyPath], tuple[Owner, ...]]
_Needs = Callable[[ProfileModel, KeyPath], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Rule:
    """Who judges a threshold key, where it must be measured, and what its tests need."""

    owners: _Owners
    grain: Grain = "cluster"
    needs: tuple[str, ...] | _Needs = ()

    def needs_of(self, model: ProfileModel, path: KeyPath) -> tuple[str, ...]:
        return self.needs if isinstance(self.needs, tuple) else self.needs(model, path)


def _fixed(*owners: Owner) -> _Owners:
    return lambda _model, _path: owners


def _collective(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    check = model.collectives.checks[int(path[2])]
    case = f"{check.collective}-{check.scope}"  # checks.collectives.Case.id
    return (
        Owner("test_collectives.py", "test_collective", case),
        Owner("test_collectives.py", "test_nccl_tests", case),
    )


def _collective_needs(model: ProfileModel, path: KeyPath) -> tuple[str, ...]:
    scope = model.collectives.checks[int(path[2])].scope
    return {"inter-node": ("multi-node",), "intra-node": ("multi-gpu",)}.get(scope, ("multi-rank",))


def _sft(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    return (Owner("test_sft.py", "test_sft", model.sft.cases[int(path[2])].name),)


def _sft_needs(model: ProfileModel, path: KeyPath) -> tuple[str, ...]:
    return ("multi-node",) if model.sft.cases[int(path[2])].nodes > 1 else ()


def _scaling(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    assert model.scaling is not None
    s = model.scaling
    step = s.steps[int(path[2])]
    return (
        Owner("test_scaling.py", "test_scaling", f"{s.case}-{step.from_nodes}-to-{step.to_nodes}-{s.unit}"),
    )


def nccl_owners(_model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    """The test that judges one ``nccl:`` expectation (``checks/nccl.expectations_of``)."""
    return (Owner("test_nccl.py", "test_nccl_expectation", ".".join(str(p) for p in path[1:])),)


_GPU_HEALTH = Rule(_fixed(Owner("test_burnin.py", "test_gpu_health")), "gpu", ("cuda",))
_CPU_HEALTH = Rule(_fixed(Owner("test_burnin.py", "test_rank_health_cpu")), "gpu")
_SPEEDUP = Rule(_fixed(Owner("test_nvlink.py", "test_speedup")), "cluster", ("multi-gpu",))
_COLLECTIVE = Rule(_collective, "cluster", _collective_needs)
_SFT = Rule(_sft, "cluster", _sft_needs)
_COUNTERS = Rule(_fixed(Owner("test_burnin.py", "test_counters_after")), "gpu", ("cuda",))
_FABRIC = Rule(_fixed(Owner("test_fabric.py", "test_fabric_after")), "node")
_SOAK = Rule(_fixed(Owner("test_fabric.py", "test_soak")), "cluster", ("soak",))
_PORTS = Owner("test_inventory.py", "test_fabric_ports")
_READINESS = Rule(_fixed(Owner("test_inventory.py", "test_node_readiness")), "node")

OWNERS: dict[str, Rule] = {
    "cluster.nodes": Rule(_fixed(Owner("test_inventory.py", "test_node_count"))),
    "cluster.device": Rule(_fixed(Owner("test_inventory.py", "test_device_kind")), "node"),
    "cluster.backend": Rule(_fixed(Owner("test_inventory.py", "test_backend_available"))),  # gloo: one check
    "cluster.gpus_per_node": Rule(_fixed(Owner("test_inventory.py", "test_gpu_count")), "node", ("cuda",)),
    "cluster.gpu_model": Rule(_fixed(Owner("test_inventory.py", "test_gpu_model")), "node", ("cuda",)),
    "cluster.gpu_memory": Rule(_fixed(Owner("test_inventory.py", "test_gpu_memory")), "gpu", ("cuda",)),
    "cluster.interconnects": Rule(_fixed(_PORTS), "node", ("rdma",)),
    # set without an RDMA fabric in cluster.interconnects, nothing excuses them: the profile is wrong
    "cluster.nics_per_node": Rule(_fixed(_PORTS), "node"),
    "cluster.nic_line_rate": Rule(_fixed(_PORTS), "node"),
    "collectives.checks[].min_busbw": _COLLECTIVE,
    "collectives.checks[].max_latency": _COLLECTIVE,
    "sft.cases[].max_step_time": _SFT,
    "sft.cases[].min_samples_per_s": _SFT,
    "sft.cases[].min_tokens_per_s_per_gpu": _SFT,
    "sft.cases[].min_mfu": _SFT,
    "sft.cases[].max_peak_memory": _SFT,
    "sft.cases[].min_gpu_util": _SFT,
    "scaling.steps[].min_efficiency": Rule(_scaling, "cluster", ("multi-node",)),
    "nvlink.topology": Rule(_fixed(Owner("test_nvlink.py", "test_topology")), "cluster", ("cuda", "nvlink", "multi-gpu")),
    "nvlink.links_per_gpu": Rule(_fixed(Owner("test_nvlink.py", "test_links_up")), "cluster", ("cuda", "nvlink", "multi-gpu")),
    "nvlink.min_link_speed": Rule(_fixed(Owner("test_nvlink.py", "test_links_up")), "cluster", ("cuda", "nvlink", "multi-gpu")),
    "nvlink.min_counter_fraction": Rule(
        _fixed(Owner("test_nvlink.py", "test_counters_move_during_all_reduce")), "cluster", ("cuda", "nvlink", "multi-gpu")
    ),
    "nvlink.min_speedup": _SPEEDUP,
    "nvlink.min_busbw": _SPEEDUP,
    "nvlink.isolated_intra_min_busbw": Rule(
        _fixed(Owner("test_nvlink.py", "test_isolated_intra_node_busbw")), "cluster", ("cuda", "multi-gpu")
    ),
    "nvlink.isolated_inter_min_busbw": Rule(
        _fixed(Owner("test_nvlink.py", "test_isolated_inter_node_busbw")), "cluster", ("cuda", "multi-node")
    ),
    "burnin.min_cpu_matmul": _CPU_HEALTH,
    "burnin.min_cpu_memory_bandwidth": _CPU_HEALTH,
    "burnin.min_matmul": _GPU_HEALTH,
    "burnin.min_memory_bandwidth": _GPU_HEALTH,
    "burnin.min_h2d_bandwidth": _GPU_HEALTH,
    "burnin.max_temperature": _GPU_HEALTH,
    "burnin.max_power": _GPU_HEALTH,
    "burnin.min_pcie_gen": _GPU_HEALTH,
    "burnin.min_pcie_width": _GPU_HEALTH,
    "burnin.max_retired_pages": _GPU_HEALTH,
    "burnin.forbidden_throttle_reasons": _GPU_HEALTH,
    "burnin.max_corrected_ecc_per_hour": _COUNTERS,
    "burnin.require_xid_source": Rule(_COUNTERS.owners, "node", ("cuda",)),
    "burnin.pair_min_busbw": Rule(
        _fixed(Owner("test_burnin.py", "test_pairwise_localization")), "cluster", ("multi-node",)
    ),
    "burnin.soak.min_busbw_fraction": _SOAK,
    "burnin.soak.max_cv": _SOAK,
    "fabric.max_error_increase": _FABRIC,
    "fabric.max_retransmits_per_gb": _FABRIC,
    "fabric.max_bit_error_rate": _FABRIC,
    "fabric.max_drop_increase": _FABRIC,
    "numerics.min_flops": Rule(_fixed(Owner("test_numerics.py", "test_numerics_throughput")), "gpu"),
    "versions": Rule(_fixed(Owner("test_burnin.py", "test_version_drift"))),
    # node readiness (checks/readiness.py): every node answers each key it sets, "not needed" included
    **{
        f"readiness.{key}": _READINESS
        for key in (
            "fabric_manager", "nvlink_domain", "max_sxid_fatal", "gpudirect_rdma", "min_memlock", "acs_disabled",
            "iommu_passthrough", "max_pending_row_remaps", "max_row_remap_failures", "max_retired_pages",
            "persistence_mode", "max_stuck_processes", "max_aer_fatal", "pcie_full_width",
        )
    },
}  # fmt: skip
"""Each threshold key of the schema (list indices written ``[]``), who judges it, where, needing what.
A key whose value is null, false or empty sets no threshold. ``nccl:`` expectations are listed by
``checks/nccl.expectations_of`` and judged by :func:`nccl_owners`."""

WHOLE = frozenset({"versions"})
"""Mappings judged as one threshold (the pins are checked together), not entry by entry."""

NOT_THRESHOLDS = frozenset(
    {
        # what the profile is, not a gate
        "name", "description", "extends", "cluster.ranks_per_node",
        # the physics of the part: ceilings a measurement is checked against, and MFU's denominator
        "cluster.peak_flops", "cluster.memory_bandwidth", "cluster.nvlink_bandwidth",
        "nccl_env", "nccl_env_prefix_match",
        # how collectives are measured
        "collectives.repeat", "collectives.sweep.min_bytes", "collectives.sweep.max_bytes",
        "collectives.sweep.factor", "collectives.sweep.warmup", "collectives.sweep.iters",
        "collectives.sweep.dtype", "collectives.sweep.op", "collectives.sweep.check",
        "collectives.checks[].collective", "collectives.checks[].scope", "collectives.checks[].size",
        "collectives.checks[].source", "collectives.checks[].algo", "collectives.nccl_tests_dir", "collectives.scope_env",
        "nvlink.speedup_sizes",
        # an SFT case's recipe
        "sft.cases[].name", "sft.cases[].model", "sft.cases[].nodes", "sft.cases[].ranks_per_node",
        "sft.cases[].zero_stage", "sft.cases[].offload", "sft.cases[].precision", "sft.cases[].micro_batch",
        "sft.cases[].grad_accum", "sft.cases[].seq_len", "sft.cases[].steps", "sft.cases[].warmup_steps",
        "sft.cases[].gradient_checkpointing", "sft.cases[].attn_implementation", "sft.cases[].timeout",
        "sft.cases[].source",
        "scaling.case", "scaling.unit", "scaling.steps[].from_nodes", "scaling.steps[].to_nodes",
        "scaling.source",
        # parameters of relative rules (a straggler is judged against its peers) and of the load
        "burnin.straggler_tolerance", "burnin.straggler_min_excess", "burnin.load_duration",
        "burnin.pair_size", "burnin.pair_iters", "burnin.soak.sample_time", "burnin.soak.source",
        "burnin.dcgm.level", "burnin.dcgm.timeout",
        "regression.tolerances[].metric", "regression.tolerances[].tolerance",
        "regression.tolerances[].source", "regression.tolerances[].healthy_spread",
        "launch.forward_env", "launch.slurm_gpu_request",
        # which fabric devices to read, and exceptions to fabric.max_error_increase judged under it
        "fabric.ib_devices", "fabric.interfaces", "fabric.retransmits_per_gb", "fabric.allowed_increase",
        "fabric.saturated", "fabric.source", "readiness.source",
        # what `gpucluster fabric scan` (checks/ib_fabric.py) expects of the IB fabric: its findings
        # record no profile key yet, so they cannot be looked up here (a follow-up: give them refs)
        "fabric.ib.link_speed", "fabric.ib.link_width", "fabric.ib.rails", "fabric.ib.topology",
        "numerics.duration", "numerics.seeds", "numerics.min_repeats", "numerics.matmul_n",
        "numerics.depth", "numerics.known_answer_k", "numerics.dtypes", "numerics.source",
        "tiers.quick.sweep", "tiers.quick.load", "tiers.quick.numerics", "tiers.quick.soak",
        "tiers.quick.source", "tiers.standard.sweep", "tiers.standard.load", "tiers.standard.numerics",
        "tiers.standard.soak", "tiers.standard.source", "tiers.burnin.sweep", "tiers.burnin.load",
        "tiers.burnin.numerics", "tiers.burnin.soak", "tiers.burnin.source",
    }
)  # fmt: skip
"""Keys of the schema that are settings, recipes or descriptions, not thresholds (with :data:`OWNERS`,
every leaf key of the schema)."""

ONLY_WHERE_WRITTEN = frozenset({"fabric.max_retransmits_per_gb", "fabric.max_bit_error_rate"})
"""Thresholds whose default applies only where the hardware has the counters (retransmit and
symbol-error counters exist on RDMA ports only): judged closed only where the profile writes them."""
