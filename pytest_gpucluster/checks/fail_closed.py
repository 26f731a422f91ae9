"""Fail closed: every threshold the profile sets is judged, or the run says why it was not.

A gate that silently passes when its measurement is missing is worse than no gate (NVIDIA's
cluster-readiness engine shipped a bandwidth gate that did exactly that). At the end of a session
each threshold the profile sets (`profile_thresholds`, the keys in :data:`OWNERS`) is looked up
among the run's measurements by its profile key (``Check.ref``; a measurement under a key covers
it, e.g. ``nccl.net_plugin.min_version`` covers ``nccl.net_plugin``). One that no measurement
covers is:

- **excused** when every test that judges it (its *owners*, by test function and parameter id)
  was skipped: the skip's reason is the capability it lacked (no GPU, one node, no NVLink...);
- **not run** when no owner ran in this session (deselected by ``-m``/``-k``, or not collected):
  listed, not failed — a quick tier does not fail for the burn-in's thresholds;
- **not measured** otherwise: an owner ran (passed or failed) and recorded nothing under the key.
  That is a failing `Check` with ``problem="not measured"``, its hint naming the tests that ran.

Pure: the profile model, measurements and outcomes in; checks and sentences out.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpucluster.checks.nccl import expectations_of
from pytest_gpucluster.profiles.schema import ProfileModel
from pytest_gpucluster.results.model import Check, Measurement, TestOutcome, ThresholdRef

__all__ = ["FAIL_CLOSED_TEST_ID", "Coverage", "Owner", "ProfileThreshold", "coverage", "profile_thresholds"]

FAIL_CLOSED_TEST_ID = "gpucluster::every-threshold-measured"
"""The outcome a session's unmeasured thresholds fail under (no test of the suite is named so)."""

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Owner:
    """A test that judges a threshold: ``test_sft.py::test_sft[tiny-zero2]`` is
    ``Owner("test_sft.py", "test_sft", "tiny-zero2")``; ``param`` None: every parameter."""

    module: str
    function: str
    param: str | None = None

    def matches(self, test_id: str) -> bool:
        path, _, name = test_id.partition("::")
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


@dataclass(frozen=True, slots=True)
class ProfileThreshold:
    """One threshold the profile sets, where it is in the file and which tests judge it."""

    ref: ThresholdRef
    value: Any
    unit: str
    comparison: str
    owners: tuple[Owner, ...]


# ------------------------------------------------------------------------------- which keys, which tests

_Owners = Callable[[ProfileModel, KeyPath], tuple[Owner, ...]]


def _fixed(*owners: Owner) -> _Owners:
    return lambda _model, _path: owners


def _collective(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    check = model.collectives.checks[int(path[2])]
    case = f"{check.collective}-{check.scope}"  # checks.collectives.Case.id
    return (
        Owner("test_collectives.py", "test_collective", case),
        Owner("test_collectives.py", "test_nccl_tests", case),
    )


def _sft(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    return (Owner("test_sft.py", "test_sft", model.sft.cases[int(path[2])].name),)


def _scaling(model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    assert model.scaling is not None
    s = model.scaling
    step = s.steps[int(path[2])]
    return (
        Owner("test_scaling.py", "test_scaling", f"{s.case}-{step.from_nodes}-to-{step.to_nodes}-{s.unit}"),
    )


def _nccl(_model: ProfileModel, path: KeyPath) -> tuple[Owner, ...]:
    return (Owner("test_nccl.py", "test_nccl_expectation", ".".join(str(p) for p in path[1:])),)


_GPU_HEALTH = _fixed(Owner("test_burnin.py", "test_gpu_health"))
_CPU_HEALTH = _fixed(Owner("test_burnin.py", "test_rank_health_cpu"))
_SPEEDUP = _fixed(Owner("test_nvlink.py", "test_speedup"))

OWNERS: dict[str, _Owners] = {
    "collectives.checks[].min_busbw": _collective,
    "collectives.checks[].max_latency": _collective,
    "sft.cases[].max_step_time": _sft,
    "sft.cases[].min_samples_per_s": _sft,
    "sft.cases[].min_tokens_per_s_per_gpu": _sft,
    "sft.cases[].min_mfu": _sft,
    "sft.cases[].max_peak_memory": _sft,
    "sft.cases[].min_gpu_util": _sft,
    "scaling.steps[].min_efficiency": _scaling,
    "nvlink.min_link_speed": _fixed(Owner("test_nvlink.py", "test_links_up")),
    "nvlink.min_counter_fraction": _fixed(Owner("test_nvlink.py", "test_counters_move_during_all_reduce")),
    "nvlink.min_speedup": _SPEEDUP,
    "nvlink.min_busbw": _SPEEDUP,
    "nvlink.isolated_intra_min_busbw": _fixed(Owner("test_nvlink.py", "test_isolated_intra_node_busbw")),
    "nvlink.isolated_inter_min_busbw": _fixed(Owner("test_nvlink.py", "test_isolated_inter_node_busbw")),
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
    "burnin.max_corrected_ecc_per_hour": _fixed(Owner("test_burnin.py", "test_counters_after")),
    "burnin.pair_min_busbw": _fixed(Owner("test_burnin.py", "test_pairwise_localization")),
    "burnin.soak.min_busbw_fraction": _fixed(Owner("test_fabric.py", "test_soak")),
    "burnin.soak.max_cv": _fixed(Owner("test_fabric.py", "test_soak")),
    "fabric.max_error_increase": _fixed(Owner("test_fabric.py", "test_fabric_after")),
    "fabric.max_retransmits_per_gb": _fixed(Owner("test_fabric.py", "test_fabric_after")),
    "fabric.max_bit_error_rate": _fixed(Owner("test_fabric.py", "test_fabric_after")),
    "fabric.max_drop_increase": _fixed(Owner("test_fabric.py", "test_fabric_after")),
    "numerics.min_flops": _fixed(Owner("test_numerics.py", "test_numerics_throughput")),
}
"""Each threshold key of the schema (list indices written ``[]``) and the tests that judge it. A
schema key named ``min_*``/``max_*`` is either here or in :data:`NOT_THRESHOLDS` (a unit test keeps
the two whole), so a new threshold cannot slip past the fail-closed rule."""

NOT_THRESHOLDS = frozenset(
    {
        "collectives.sweep.min_bytes",  # the sweep's grid
        "collectives.sweep.max_bytes",
        "burnin.straggler_min_excess",  # a parameter of the straggler rule, judged relative to peers
        "numerics.min_repeats",  # how often each seed runs
    }
)
"""``min_*``/``max_*`` keys of the schema that are settings, not thresholds."""

ONLY_WHERE_WRITTEN = frozenset({"fabric.max_retransmits_per_gb", "fabric.max_bit_error_rate"})
"""Thresholds whose default applies only where the hardware has the counters (retransmit and
symbol-error counters exist on RDMA ports only): judged closed only where the profile writes them."""

_NCCL_PATTERN = "nccl.*"
"""The ``nccl:`` expectations (``checks/nccl.expectations_of``), each its own threshold."""


def _pattern(path: KeyPath) -> str:
    text = ""
    for part in path:
        text += "[]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _unit(model: Any, name: str) -> str:
    """The canonical unit a field's value is in, from its annotation (``Bandwidth`` -> ``B/s``)."""
    from pytest_gpucluster.profiles import fields as f

    annotation = type(model).model_fields[name].annotation
    units = {
        f.parse_bandwidth: "B/s",
        f.parse_bytes: "B",
        f.parse_duration: "s",
        f.parse_fraction: "fraction",
        f.parse_flops: "FLOP/s",
    }
    for arg in (annotation, *typing.get_args(annotation)):
        for meta in getattr(arg, "__metadata__", ()):
            unit = units.get(getattr(meta, "func", None))
            if unit:
                return unit
    return ""


def _walk(model: Any, path: KeyPath) -> Iterable[tuple[KeyPath, Any, str]]:
    """(key path, value, unit) of every non-null field under ``model``, lists entered."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        here = (*path, name)
        if value is None:
            continue
        if hasattr(type(value), "model_fields"):
            yield from _walk(value, here)
        elif isinstance(value, (list, tuple)) and value and hasattr(type(value[0]), "model_fields"):
            for index, item in enumerate(value):
                yield from _walk(item, (*here, index))
        elif isinstance(value, dict) and _pattern(here) in OWNERS:
            for key, item in value.items():  # per-dtype floors: each entry its own threshold
                if item is not None:
                    yield (*here, str(key)), item, _unit(model, name)
        else:
            yield here, value, _unit(model, name)


def _written(model: Any, path: KeyPath) -> bool:
    """Whether the profile wrote the key (pydantic's ``model_fields_set``), not only its default."""
    node = model
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else getattr(node, str(part))
    return path[-1] in node.model_fields_set


def profile_thresholds(model: ProfileModel) -> list[ProfileThreshold]:
    """Every threshold ``model`` sets (a value that is not null), in file order."""
    out: list[ProfileThreshold] = []
    for path, value, unit in _walk(model, ()):
        owners = OWNERS.get(_pattern(path)) or OWNERS.get(_pattern(path[:-1]))
        if owners is None:
            continue
        if _pattern(path) in ONLY_WHERE_WRITTEN and not _written(model, path):
            continue
        name = str(path[-1])
        comparison = "<=" if name.startswith("max_") else ">="
        out.append(
            ProfileThreshold(ThresholdRef(model.name, path), value, unit, comparison, owners(model, path))
        )
    for expectation in expectations_of(model.nccl):
        path = ("nccl", *expectation.split("."))
        assert model.nccl is not None
        value = getattr(model.nccl, expectation)
        out.append(ProfileThreshold(ThresholdRef(model.name, path), value, "", "==", _nccl(model, path)))
    return out


# ------------------------------------------------------------------------------- the verdict


@dataclass(frozen=True, slots=True)
class Unjudged:
    """A threshold nothing measured that does not fail: why (a skip's reason, or not run)."""

    ref: ThresholdRef
    why: str


@dataclass(slots=True)
class Coverage:
    """The fail-closed verdict of one session."""

    checks: list[Check] = field(default_factory=list)
    """One failing check (``problem="not measured"``) per threshold an owner ran for and missed."""
    excused: list[Unjudged] = field(default_factory=list)
    """Every owner skipped: the reason (a capability the cluster lacks)."""
    not_run: list[Unjudged] = field(default_factory=list)
    """No owner ran in this session (deselected, not collected)."""
    measured: int = 0
    """Thresholds a measurement covered."""

    def to_json(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "not_measured": [c.ref.key for c in self.checks if c.ref is not None],
            "excused": [{"key": u.ref.key, "why": u.why} for u in self.excused],
            "not_run": [u.ref.key for u in self.not_run],
        }


def _covered(threshold: KeyPath, measured: Iterable[KeyPath]) -> bool:
    n = len(threshold)
    return any(path[:n] == threshold for path in measured)


def coverage(
    model: ProfileModel, measurements: Sequence[Measurement], outcomes: Sequence[TestOutcome]
) -> Coverage:
    """Which of the profile's thresholds the run judged, excused, did not run, or missed."""
    # A check recorded under the key judged it, whatever its verdict: one the test could not
    # measure (problem "not measured") already failed its test, saying why.
    measured = {m.ref.key_path for m in measurements if m.ref is not None}
    out = Coverage()
    for t in profile_thresholds(model):
        if _covered(t.ref.key_path, measured):
            out.measured += 1
            continue
        mine = [o for o in outcomes if any(owner.matches(o.test_id) for owner in t.owners)]
        ran = [o for o in mine if o.category != "skipped"]
        if not mine:
            out.not_run.append(
                Unjudged(t.ref, "no test that judges it ran: " + ", ".join(map(str, t.owners)))
            )
        elif not ran:
            reasons = sorted(
                {(o.message.splitlines() or ["skipped"])[0].removeprefix("Skipped: ") for o in mine}
            )
            out.excused.append(Unjudged(t.ref, "; ".join(reasons)))
        else:
            out.checks.append(_not_measured(t, ran))
    return out


def _not_measured(t: ProfileThreshold, ran: Sequence[TestOutcome]) -> Check:
    tests = "; ".join(f"{o.test_id} ({'passed' if o.category == 'pass' else o.category})" for o in ran)
    numeric = isinstance(t.value, (int, float)) and not isinstance(t.value, bool)
    return Check(
        metric=f"profile.{t.ref.key}",
        value=float("nan"),
        unit=t.unit,
        threshold=float(t.value) if numeric else None,  # an expectation (a version, a name): said in the hint
        comparison=t.comparison if numeric else "==",  # type: ignore[arg-type]
        ref=t.ref,
        problem="not measured",
        hint=(
            f"The profile sets {t.ref.key} = {t.value!r}, and no value was recorded under it although "
            f"the test(s) that judge it ran: {tests}. A gate with no value never passes: find why the "
            "test measured nothing for this key (its log, its skip conditions), or remove the key."
        ),
    )
