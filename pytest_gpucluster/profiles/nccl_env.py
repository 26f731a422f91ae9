"""The NCCL environment a profile sets, read the way NCCL reads it.

- :func:`scope_env`: what a collectives job of one scope runs under (``nccl_env`` with
  ``collectives.scope_env[scope]`` over it). The launch side calls it to build the sweep job's
  environment; the physics checks call it to know which algorithms that job may use.
- :func:`allowed_algorithms`: the NCCL algorithms ``NCCL_ALGO`` leaves a collective, parsed as
  NCCL 2.24+ does (``src/graph/tuning.cc`` ``parseList``): ``Ring,Tree`` for every function,
  ``^NVLS`` for all but NVLS, ``ring;allreduce:tree`` per function (``;``-separated, only the first
  entry without a function prefix). ``NCCL_NVLS_ENABLE=0`` and ``NCCL_COLLNET_ENABLE`` unset or 0
  take NVLS/NVLSTree and CollNet away as NCCL does.
- :func:`nic_selection`: how many NICs ``NCCL_IB_HCA`` leaves NCCL, and whether its entries are
  prefixes. NCCL matches each entry as a *prefix* unless the list starts with ``=`` (NCCL user
  guide, NCCL_IB_HCA / NCCL_SOCKET_IFNAME: "To match (or not) an exact interface name, begin the
  prefix string with the = character"), so ``mlx5_1`` also selects ``mlx5_10`` ... ``mlx5_19``.

Imports the schema only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_gpucluster.profiles.schema import ProfileModel

__all__ = [
    "ALGORITHM_FUNCTIONS",
    "PER_FUNCTION_SYNTAX_VERSION",
    "NicSelection",
    "algo_syntax_problem",
    "allowed_algorithms",
    "nic_selection",
    "prefix_entries",
    "scope_env",
    "uses_per_function_syntax",
]

ALGORITHM_FUNCTIONS: dict[str, frozenset[str]] = {
    "Ring": frozenset({"broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"}),
    "Tree": frozenset({"all_reduce"}),
    "CollNetDirect": frozenset({"all_gather", "reduce_scatter", "all_reduce"}),
    "CollNetChain": frozenset({"all_reduce"}),
    "NVLS": frozenset({"all_gather", "reduce_scatter", "all_reduce"}),
    "NVLSTree": frozenset({"all_reduce"}),
    "PAT": frozenset({"all_gather", "reduce_scatter"}),
}
"""Which collectives each algorithm implements (NCCL ``src/graph/tuning.cc``, the model map's
Broadcast/Reduce/AllGather/ReduceScatter/AllReduce columns). alltoall and sendrecv are
point-to-point and take no algorithm."""

_FUNCTION_NAMES = {
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "allreduce": "all_reduce",
}
_ALGO_NAMES = {a.lower(): a for a in ALGORITHM_FUNCTIONS}

PER_FUNCTION_SYNTAX_VERSION = (2, 24)
"""``NCCL_ALGO="allreduce:tree"`` is understood from NCCL 2.24.3; older versions read the whole
value as one list and enable nothing they recognise."""


def scope_env(model: ProfileModel, scope: str) -> dict[str, str]:
    """The NCCL environment of a collectives job at ``scope`` (intra-node, inter-node, full)."""
    return {**model.nccl_env, **model.collectives.scope_env.get(scope, {})}  # type: ignore[call-overload]


def _parse_algo(value: str) -> dict[str, frozenset[str]]:
    """Function -> enabled algorithms, as NCCL's parseList builds them (raises ValueError)."""
    everything = frozenset(ALGORITHM_FUNCTIONS)
    enabled = dict.fromkeys(_FUNCTION_NAMES.values(), everything)
    for position, entry in enumerate(e for e in value.split(";") if e.strip()):
        prefix, sep, elems = entry.partition(":")
        if not sep:
            if position:
                raise ValueError(f"every entry after the first needs a function prefix ({entry!r})")
            prefix, elems = "", entry
        exclude = elems.strip().startswith("^")
        names = set()
        for raw in elems.strip().lstrip("^").split(","):
            name = _ALGO_NAMES.get(raw.strip().lower())
            if name is None:
                raise ValueError(f"unknown algorithm {raw.strip()!r} (NCCL knows {', '.join(everything)})")
            names.add(name)
        chosen = everything - names if exclude else frozenset(names)
        if prefix:
            function = _FUNCTION_NAMES.get(prefix.strip().lower())
            if function is None:
                raise ValueError(
                    f"unknown function {prefix.strip()!r} (NCCL knows {', '.join(_FUNCTION_NAMES)})"
                )
            enabled[function] = chosen
        else:
            enabled = dict.fromkeys(enabled, chosen)
    return enabled


def algo_syntax_problem(env: dict[str, str]) -> str | None:
    """Why ``NCCL_ALGO`` in ``env`` would not parse, in NCCL's terms; None when it parses."""
    value = env.get("NCCL_ALGO")
    if not value:
        return None
    try:
        _parse_algo(value)
    except ValueError as exc:
        return str(exc)
    return None


def uses_per_function_syntax(env: dict[str, str]) -> bool:
    return ":" in env.get("NCCL_ALGO", "") or ";" in env.get("NCCL_ALGO", "")


def allowed_algorithms(env: dict[str, str], collective: str, nodes: int = 1) -> frozenset[str]:
    """The algorithms NCCL may run ``collective`` with under ``env`` on ``nodes`` nodes (all that
    implement it when NCCL_ALGO is unset). As NCCL's tuning does: NVLSTree needs 2+ nodes, and NVLS
    across nodes needs CollNet (SHARP). An unparsable NCCL_ALGO leaves none."""
    implements = frozenset(a for a, fns in ALGORITHM_FUNCTIONS.items() if collective in fns)
    value = env.get("NCCL_ALGO", "").strip()
    if value:
        try:
            chosen = _parse_algo(value).get(collective, frozenset())
        except ValueError:
            return frozenset()
    else:
        chosen = frozenset(ALGORITHM_FUNCTIONS)
    if env.get("NCCL_NVLS_ENABLE", "").strip() == "0":
        chosen -= {"NVLS", "NVLSTree"}
    collnet = env.get("NCCL_COLLNET_ENABLE", "0").strip() == "1"
    if not collnet:
        chosen -= {"CollNetDirect", "CollNetChain"}
    if nodes == 1:
        chosen -= {"NVLSTree"}
    elif not collnet:
        chosen -= {"NVLS"}
    return chosen & implements


@dataclass(frozen=True, slots=True)
class NicSelection:
    """What ``NCCL_IB_HCA`` leaves NCCL: an exact list, prefixes, exclusions, or nothing set."""

    value: str | None
    exact: bool
    exclude: bool
    entries: tuple[str, ...]
    """Device names (a ``:port`` suffix kept), without the leading ``^``/``=``."""

    @property
    def exact_count(self) -> int | None:
        """How many NICs NCCL uses when the list names them exactly; None otherwise."""
        return len(self.entries) if self.exact and not self.exclude else None


def nic_selection(env: dict[str, str], variable: str = "NCCL_IB_HCA") -> NicSelection:
    value = env.get(variable)
    if not value or not value.strip():
        return NicSelection(None, False, False, ())
    text = value.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    entries = tuple(e.strip() for e in text.lstrip("=").split(",") if e.strip())
    return NicSelection(value, exact, exclude, entries)


_TRAILING_NUMBER = re.compile(r"(\d+)$")


def prefix_entries(selection: NicSelection) -> tuple[str, ...]:
    """Entries that, read as prefixes, also select longer device names when the list is not
    ``=``-exact: those ending in a number other than 0 (``mlx5_1`` -> ``mlx5_10`` ... ``mlx5_19``;
    device numbers have no leading zeros, so ``mlx5_0`` selects only itself)."""
    if selection.exact:
        return ()
    found = []
    for entry in selection.entries:
        number = _TRAILING_NUMBER.search(entry.split(":")[0])
        if number and number.group(1) != "0":
            found.append(entry)
    return tuple(found)
