"""Checks of the NCCL environment itself: NIC lists that select more than they name, and
``NCCL_ALGO`` values NCCL would misread or that leave a swept collective no algorithm.

- NIC selection by prefix (class 4 of thresholds/README.md): ``NCCL_IB_HCA`` entries are prefixes
  unless the list starts with ``=``, so ``NCCL_IB_HCA=mlx5_0,mlx5_1`` also selects ``mlx5_10`` ...
  ``mlx5_19`` on a node with that many devices (a warning, unless the profile lists the variable in
  ``nccl_env_prefix_match``). ``NCCL_SOCKET_IFNAME`` works the same way, but there a prefix
  (``eth``, ``bond0`` for its VLANs) is the usual intent, so it is not flagged.
- ``NCCL_ALGO`` that NCCL cannot parse, per-function syntax (``allreduce:tree``) with
  ``nccl.min_version`` below 2.24, and a collectives job whose NCCL_ALGO leaves one of the swept
  collectives no algorithm (``NCCL_ALGO=Tree`` runs all_reduce only; NCCL fails the others with
  "no algorithm/protocol available"): errors.
"""

from __future__ import annotations

from pytest_gpucluster.profiles.findings import Collector
from pytest_gpucluster.profiles.nccl_env import (
    PER_FUNCTION_SYNTAX_VERSION,
    algo_syntax_problem,
    allowed_algorithms,
    nic_selection,
    prefix_entries,
    scope_env,
    uses_per_function_syntax,
)
from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = ["check_nccl_env"]

_SWEPT = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
"""Collectives a sweep job runs that take an NCCL algorithm (alltoall and sendrecv take none)."""


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    digits = text.strip().lstrip(">=v ").split("+")[0]
    try:
        return tuple(int(p) for p in digits.split(".")[:2])
    except ValueError:
        return None


def _environments(model: ProfileModel) -> list[tuple[tuple[str, ...], dict[str, str], str]]:
    """(key prefix, env, where) for nccl_env and each collectives.scope_env entry."""
    found: list[tuple[tuple[str, ...], dict[str, str], str]] = [(("nccl_env",), model.nccl_env, "nccl_env")]
    for scope, env in model.collectives.scope_env.items():
        found.append((("collectives", "scope_env", scope), env, f"collectives.scope_env.{scope}"))
    return found


def _check_prefixes(out: Collector, model: ProfileModel) -> None:
    for base, env, where in _environments(model):
        for variable in ("NCCL_IB_HCA",):
            if variable not in env or variable in model.nccl_env_prefix_match:
                continue
            selection = nic_selection(env, variable)
            loose = prefix_entries(selection)
            if not loose:
                continue
            examples = "; ".join(f"{e} also selects {e}0 ... {e}9" for e in loose[:2])
            exact = ("^=" if selection.exclude else "=") + ",".join(selection.entries)
            out.warning(
                (*base, variable),
                f"{where} {variable}={selection.value!r} matches by prefix (NCCL reads each entry as a prefix "
                f"unless the list starts with '='): {examples}, where a node has that many devices. Write "
                f"{variable}: '{exact}' for exactly these, or list {variable} in nccl_env_prefix_match if every "
                "device starting so is meant.",
            )


def _check_algo(out: Collector, model: ProfileModel) -> None:
    min_version = _version(model.nccl.min_version if model.nccl else None)
    for base, env, where in _environments(model):
        if not env.get("NCCL_ALGO"):
            continue
        key = (*base, "NCCL_ALGO")
        problem = algo_syntax_problem(env)
        if problem:
            out.error(key, f"{where} NCCL_ALGO={env['NCCL_ALGO']!r}: NCCL refuses it: {problem}")
            continue
        if uses_per_function_syntax(env) and (
            min_version is None or min_version < PER_FUNCTION_SYNTAX_VERSION
        ):
            need = ".".join(map(str, PER_FUNCTION_SYNTAX_VERSION))
            have = model.nccl.min_version if model.nccl and model.nccl.min_version else "unset"
            out.error(
                key,
                f"{where} NCCL_ALGO={env['NCCL_ALGO']!r} uses per-collective syntax, which NCCL reads from "
                f"{need} on (older versions take the whole value as one list and enable nothing they know); "
                f"nccl.min_version is {have}: set it to '{need}' or more.",
            )
    reported: set[str] = set()
    for scope in ("intra-node", "inter-node", "full"):
        env = scope_env(model, scope)
        if not env.get("NCCL_ALGO") or algo_syntax_problem(env):
            continue
        scoped = "NCCL_ALGO" in model.collectives.scope_env.get(scope, {})  # type: ignore[call-overload]
        where = f"collectives.scope_env.{scope}" if scoped else "nccl_env"
        starved = [c for c in _SWEPT if not allowed_algorithms(env, c)]
        if not starved or where in reported:
            continue
        reported.add(where)
        key = ("collectives", "scope_env", scope, "NCCL_ALGO") if scoped else ("nccl_env", "NCCL_ALGO")
        jobs = (
            f"the {scope} sweep job" if scoped else "every job (collectives sweeps and ZeRO training alike)"
        )
        out.error(
            key,
            f"{where} NCCL_ALGO={env['NCCL_ALGO']!r} leaves {', '.join(starved)} no algorithm in {jobs}: "
            "Tree and NVLSTree run all_reduce only, and NCCL fails the others with 'no algorithm/protocol "
            "available'. Force an algorithm for all_reduce alone: 'allreduce:Tree' (NCCL 2.24+).",
        )


def check_nccl_env(out: Collector, model: ProfileModel) -> None:
    if model.cluster.backend != "nccl":
        return
    _check_prefixes(out, model)
    _check_algo(out, model)
