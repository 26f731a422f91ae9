"""The typed schema of a hardware profile (``thresholds/<name>.yaml``).

Every section is a pydantic model that refuses unknown keys (a typo such as ``min_bwsbw``
must not silently disable a check) and parses quantities with units into canonical units:
bandwidth in bytes/s, sizes in bytes, durations in seconds, percentages as fractions,
compute rates in FLOP/s. The loader turns validation errors into messages naming the file,
key path and line. Field docstrings are the reference of the format (thresholds/README.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from pytest_gpucluster.profiles.fields import (
    _ALGORITHMS,
    Bandwidth,
    CollectiveName,
    Duration,
    FlopRate,
    Fraction,
    NcclAlgorithm,
    Scope,
    Section,
    Size,
    Timeout,
)
from pytest_gpucluster.profiles.schema_burnin import (  # noqa: F401 - re-exported
    BurninSection,
    DcgmSettings,
    FabricSection,
    SoakSettings,
)
from pytest_gpucluster.profiles.schema_numerics import NumericsSection
from pytest_gpucluster.profiles.schema_readiness import ReadinessSection
from pytest_gpucluster.profiles.schema_run import (  # noqa: F401 - re-exported
    LaunchSection,
    RegressionSection,
    RegressionTolerance,
)
from pytest_gpucluster.profiles.schema_tiers import TiersSection


class ClusterSection(Section):
    """What the cluster is: the inventory test compares the detected machine with this."""

    nodes: int = Field(1, ge=1, description="Number of nodes the full-scale tests use.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node; 0 for a CPU-only profile.")
    ranks_per_node: int | None = Field(
        None, ge=1, description="Ranks per node; defaults to gpus_per_node (2 on a CPU profile)."
    )
    device: Literal["cpu", "cuda"] = "cuda"
    """Where ranks compute: ``cuda`` (one GPU per rank) or ``cpu``."""
    gpu_model: str | None = Field(
        None,
        description="The GPU part: its name as the driver reports it, without 'NVIDIA ' ('H100 80GB HBM3', "
        "'A800-SXM4-80GB', 'H200'), or a devices.yaml key ('h100-sxm'). Matched whole, never as a "
        "substring: 'GH200 480GB' is not 'H200', 'H100 PCIe' is not 'H100 80GB HBM3'.",
    )
    gpu_memory: Size | None = None
    """Memory per GPU, as the datasheet gives it (``141GB``)."""
    backend: Literal["gloo", "nccl"] = "nccl"
    """The torch.distributed backend: ``nccl`` on GPUs, ``gloo`` on a CPU profile."""
    interconnects: tuple[Literal["nvlink", "pcie", "ib", "roce", "efa", "ethernet", "shm"], ...] = ()
    """The links the cluster has (nvlink, pcie, ib, roce, efa, ethernet, shm); they decide which tests apply."""
    peak_flops: FlopRate | None = Field(
        None, description="Dense bf16/fp16 peak per device (MFU denominator)."
    )
    memory_bandwidth: Bandwidth | None = None
    """Datasheet memory bandwidth per GPU: the ceiling a device copy cannot exceed."""
    nvlink_bandwidth: Bandwidth | None = Field(None, description="NVLink bandwidth per direction per GPU.")
    nics_per_node: int | None = Field(None, ge=0)
    """RDMA NICs per node: the active ports the inventory and fabric checks expect."""
    nic_line_rate: Bandwidth | None = None
    """Line rate of each NIC (``400Gbps``); with nics_per_node, the network's ceiling for inter-node busbw."""

    @property
    def effective_ranks_per_node(self) -> int:
        if self.ranks_per_node is not None:
            return self.ranks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 2

    @model_validator(mode="after")
    def _cpu_has_no_gpus(self) -> ClusterSection:
        if self.device == "cpu" and self.backend == "nccl":
            raise ValueError("a cpu profile cannot use the nccl backend; use backend: gloo")
        if self.device == "cuda" and self.gpus_per_node == 0:
            raise ValueError("a cuda profile needs gpus_per_node >= 1")
        return self


class SweepSettings(Section):
    """Like nccl-tests' ``-b -e -f -w -n -c``."""

    min_bytes: Size = 1024
    """Smallest message size of the sweep (nccl-tests ``-b``)."""
    max_bytes: Size = 64 * 2**20
    """Largest message size (``-e``)."""
    factor: float = Field(2.0, gt=1.0)
    """Each size is the previous one times this (``-f``)."""
    warmup: int = Field(5, ge=0)
    """Untimed collectives before the timed ones (``-w``)."""
    iters: int = Field(20, ge=1)
    """Timed collectives per point (``-n``)."""
    dtype: Literal["float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8"] = "float32"
    """Element type (``-d``)."""
    op: Literal["sum", "prod", "max", "min", "avg"] = "sum"
    """Reduction operation (``-o``)."""
    check: bool = True
    """Check every result for wrong elements (``-c``)."""

    @model_validator(mode="after")
    def _ordered(self) -> SweepSettings:
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes ({self.max_bytes:.0f}) is below min_bytes ({self.min_bytes:.0f})")
        return self


class CollectiveCheck(Section):
    """One gated point: a collective, a scope and a message size, with its floor and/or ceiling."""

    collective: CollectiveName
    """The collective, as nccl-tests names its binary without ``_perf``."""
    scope: Scope = "intra-node"
    """Where it runs: ``intra-node`` (one node), ``inter-node`` (two nodes) or ``full`` (every node)."""
    size: Size
    """The message size the floor or ceiling applies to."""
    min_busbw: Bandwidth | None = None
    """Floor on the bus bandwidth at this size (nccl-tests' definition)."""
    max_latency: Duration | None = None
    """Ceiling on the time of one collective at this size: nccl-tests' own output on a GPU profile, the sweep's on a CPU profile (thresholds/README.md, *Latency*)."""
    source: str | None = Field(None, description="Where the number comes from (seed, public figure).")
    algo: NcclAlgorithm | None = Field(
        None,
        description="The NCCL algorithm the floor was measured with. Required where the floor is above "
        "what Ring can reach (NVLS inside an NVSwitch node, Tree/NVLSTree/CollNet across nodes); the "
        "job of the check's scope must then run with it (collectives.scope_env).",
    )

    @field_validator("algo", mode="before")
    @classmethod
    def _algo_any_case(cls, value: Any) -> Any:
        return _ALGORITHMS.get(value.strip().lower(), value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _has_threshold(self) -> CollectiveCheck:
        if self.min_busbw is None and self.max_latency is None:
            raise ValueError("a check needs min_busbw or max_latency (or both)")
        return self


def env_mapping(env: Any) -> Any:
    """An environment as a profile writes it -> ``{NAME: "value"}``; bad names or values refused."""
    if isinstance(env, dict):
        for key, value in env.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise ValueError(f"environment variable name {key!r} is not a valid name")
            if isinstance(value, (dict, list)):
                raise ValueError(f"{key} must be a string or number, got {type(value).__name__}")
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}
    return env


EnvMapping = Annotated[dict[str, str], BeforeValidator(env_mapping)]


class CollectivesSection(Section):
    repeat: int = Field(3, ge=1, description="Each point is measured this many times; the median is gated.")
    sweep: SweepSettings = Field(default_factory=SweepSettings)
    checks: tuple[CollectiveCheck, ...] = ()
    nccl_tests_dir: str | None = None
    """Directory of nccl-tests binaries (all_reduce_perf, ...) to run too; ``--nccl-tests-dir`` wins."""
    scope_env: dict[Scope, EnvMapping] = Field(
        default_factory=dict,
        description="NCCL environment for the sweep job of one scope only, over nccl_env: e.g. "
        "{inter-node: {NCCL_ALGO: 'allreduce:Tree'}} runs the 2-node job with the algorithm its floor "
        "assumes without forcing it on the intra-node job or on training.",
    )


class NetPluginExpectation(Section):
    name: str
    """The net plugin NCCL must load: NCCL's name for it, the project that ships it (aws-ofi-nccl) or its library file."""
    min_version: str | None = None
    """Lowest plugin version accepted."""


class NcclSection(Section):
    """What NCCL must report having used (checked in the NCCL_DEBUG=INFO log of every rank)."""

    network: str | None = Field(None, description="As NCCL names it in 'Using network X': IB, Socket, ...")
    net_plugin: NetPluginExpectation | None = Field(
        None, description="Expected external net plugin; write null to require that none is loaded."
    )
    provider: str | None = None
    """The libfabric provider NCCL must report using (``efa``)."""
    gdr: bool | None = None
    """Whether GPUDirect RDMA must be in use on the network paths (a ``GDRDMA`` channel)."""
    nvls: bool | None = None
    """Whether NCCL must report NVLS (NVLink SHARP) support."""
    min_version: str | None = None
    """Lowest NCCL version accepted."""


class NvlinkSection(Section):
    links_per_gpu: int | None = Field(None, ge=0)
    """NVLink links each GPU must have up."""
    topology: str | None = Field(None, description="Expected topo -m cell between every GPU pair, e.g. NV18.")
    min_link_speed: Bandwidth | None = None
    """Floor on each link's speed, per direction (``nvidia-smi nvlink -s``)."""
    min_counter_fraction: Fraction | None = None
    """Each GPU's NVLink byte counters must grow during an all_reduce by this fraction of what a ring sends per GPU."""
    min_speedup: float | None = Field(
        None,
        gt=0,
        description="Busbw with the fast path over busbw without it (NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=0; "
        "on CPU: shm over gloo).",
    )
    speedup_sizes: tuple[Size, ...] = (16 * 2**20,)
    """Message sizes at which the speedup is measured."""
    min_busbw: Bandwidth | None = None
    """Floor on the fast path's busbw in the speedup test."""
    isolated_intra_min_busbw: Bandwidth | None = None
    """Floor on intra-node busbw over NVLink alone (``NCCL_SHM_DISABLE=1 NCCL_P2P_LEVEL=NVL``)."""
    isolated_inter_min_busbw: Bandwidth | None = None
    """Floor on inter-node busbw over the network alone."""


class SftCase(Section):
    """One supervised fine-tuning run and its thresholds."""

    name: str
    """Unique name: the test's parameter id, and what ``scaling.case`` refers to."""
    model: str = Field(description="A named shape (llama2-7b, tiny, ...) or a local model path.")
    nodes: int = Field(1, ge=1)
    """Nodes the case runs on."""
    ranks_per_node: int | None = Field(None, ge=1)
    """Ranks per node (default: the cluster's)."""
    zero_stage: int = Field(2, ge=0, le=3)
    """DeepSpeed ZeRO stage, 0 to 3."""
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
    """DeepSpeed offload to CPU: none, the optimizer, or the optimizer and the parameters (ZeRO-3)."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Training precision."""
    micro_batch: int = Field(1, ge=1)
    """Samples per rank per micro-step."""
    grad_accum: int = Field(1, ge=1)
    """Micro-steps per optimizer step."""
    seq_len: int = Field(512, ge=8)
    """Tokens per sample."""
    steps: int = Field(10, ge=2)
    """Optimizer steps run, warm-up included."""
    warmup_steps: int = Field(2, ge=0)
    """Steps left out of the timing."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more compute)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    """transformers' attention implementation (default: transformers' choice)."""
    timeout: Timeout | None = Field(
        None,
        description="Job timeout for this case (each of its launches, scaling steps included); default: "
        "--job-timeout. profiles check holds it against the case's estimated run time.",
    )
    max_step_time: Duration | None = None
    """Ceiling on the median optimizer-step time of the slowest rank."""
    min_samples_per_s: float | None = Field(None, gt=0)
    """Floor on the whole job's samples per second."""
    min_tokens_per_s_per_gpu: float | None = Field(None, gt=0)
    """Floor on the slowest rank's processed tokens per second."""
    min_mfu: Fraction | None = None
    """Floor on the slowest rank's model FLOPs utilisation (needs ``cluster.peak_flops``)."""
    max_peak_memory: Size | None = None
    """Ceiling on each rank's peak memory (CUDA max reserved, or the process's peak resident set on CPU)."""
    min_gpu_util: Fraction | None = None
    """Floor on each rank's mean NVML GPU utilisation (not a throughput figure: a network-bound job reads ~100%)."""
    source: str | None = None
    """Where the thresholds come from."""

    @model_validator(mode="after")
    def _offload_fits_the_stage(self) -> SftCase:
        # DeepSpeed's own rules (workloads/sft.py checks them again on the ranks)
        if self.offload == "optimizer+params" and self.zero_stage != 3:
            raise ValueError(
                f"offload {self.offload!r} needs zero_stage 3 (parameter offload is ZeRO-3 only), "
                f"got zero_stage {self.zero_stage}"
            )
        if self.offload == "optimizer" and self.zero_stage == 0:
            raise ValueError("offload 'optimizer' needs zero_stage 1, 2 or 3 (ZeRO-Offload), got 0")
        return self


class ScalingStep(Section):
    from_nodes: int = Field(ge=1)
    """The smaller node (or rank) count."""
    to_nodes: int = Field(ge=1)
    """The larger one."""
    min_efficiency: Fraction
    """Floor on weak-scaling efficiency: throughput(to) / ((to / from) x throughput(from))."""

    @model_validator(mode="after")
    def _grows(self) -> ScalingStep:
        if self.to_nodes <= self.from_nodes:
            raise ValueError(f"to_nodes ({self.to_nodes}) must exceed from_nodes ({self.from_nodes})")
        return self


class ScalingSection(Section):
    case: str = Field(description="Name of the sft case that is repeated at each node count.")
    unit: Literal["nodes", "ranks"] = Field(
        "nodes", description="What the counts mean; 'ranks' on a single-node CPU profile."
    )
    steps: tuple[ScalingStep, ...]
    source: str | None = None
    """Where the thresholds come from."""


class SftSection(Section):
    cases: tuple[SftCase, ...] = ()

    @field_validator("cases")
    @classmethod
    def _unique_names(cls, cases: tuple[SftCase, ...]) -> tuple[SftCase, ...]:
        seen: set[str] = set()
        for case in cases:
            if case.name in seen:
                raise ValueError(f"two sft cases are named {case.name!r}; names must be unique")
            seen.add(case.name)
        return cases


class ProfileModel(Section):
    """A whole profile, after ``extends:`` has been merged."""

    name: str
    """The profile's name: what ``--hw`` takes, and what results.json records."""
    description: str
    """One line, printed by ``gpucluster profiles``."""
    extends: str | None = None
    """Name or path of the profile this one builds on; its keys are merged under this one's."""
    cluster: ClusterSection
    nccl_env: EnvMapping = Field(default_factory=dict)
    """NCCL environment for every launched job; the user's own ``NCCL_*`` variables win."""
    nccl_env_prefix_match: tuple[str, ...] = Field(
        (),
        description="Variables of nccl_env whose entries are meant as prefixes (NCCL_IB_HCA: mlx5 for "
        "every mlx5 device): silences the warning that 'mlx5_1' also selects mlx5_10..mlx5_19.",
    )
    collectives: CollectivesSection = Field(default_factory=CollectivesSection)
    nccl: NcclSection | None = None
    nvlink: NvlinkSection | None = None
    sft: SftSection = Field(default_factory=SftSection)
    scaling: ScalingSection | None = None
    burnin: BurninSection = Field(default_factory=BurninSection)
    regression: RegressionSection = Field(default_factory=RegressionSection)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    fabric: FabricSection = Field(default_factory=FabricSection)
    numerics: NumericsSection = Field(default_factory=NumericsSection)
    readiness: ReadinessSection = Field(default_factory=ReadinessSection)
    tiers: TiersSection = Field(default_factory=TiersSection)
    versions: dict[str, str] = Field(default_factory=dict)
    """Pins or bounds for driver, CUDA, NCCL, plugin and torch (the burn-in's version checks)."""

    @model_validator(mode="after")
    def _scaling_case_exists(self) -> ProfileModel:
        if self.scaling is not None and self.scaling.case not in {c.name for c in self.sft.cases}:
            names = ", ".join(c.name for c in self.sft.cases) or "none"
            raise ValueError(f"scaling.case {self.scaling.case!r} is not an sft case (cases: {names})")
        return self
