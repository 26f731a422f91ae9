"""The value types every profile section is built from: quantities with units parsed into
canonical units (bytes/s, bytes, seconds, fractions, FLOP/s), NCCL's names, and `Section`, the
base model that refuses unknown keys (a typo such as ``min_bwsbw`` must not disable a check)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from pytest_gpucluster.errors import SettingsError
from pytest_gpucluster.profiles.quantities import (
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
    parse_fraction,
)

Bandwidth = Annotated[float, BeforeValidator(parse_bandwidth)]
"""Bytes per second; written ``"115GB/s"`` or ``"920Gbps"``."""
Size = Annotated[float, BeforeValidator(parse_bytes)]
"""Bytes; written ``"64MiB"``, ``"16GB"`` or a bare byte count."""
Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds; written ``"7.8s"``, ``"50us"``."""
Fraction = Annotated[float, BeforeValidator(parse_fraction)]
"""A fraction; written ``"92%"`` or ``0.92``."""
FlopRate = Annotated[float, BeforeValidator(parse_flops)]
"""FLOP/s; written ``"989TFLOP/s"``."""


def _timeout(value: Any) -> Any:
    # a timeout is seconds by convention (--job-timeout SECONDS), so a bare number is seconds
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return parse_duration(f"{value}s")
    return parse_duration(value)


Timeout = Annotated[float, BeforeValidator(_timeout)]
"""Seconds; written ``"20min"``, ``"1200s"`` or a bare number of seconds."""

CollectiveName = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"
]
Scope = Literal["intra-node", "inter-node", "full"]
NcclAlgorithm = Literal["Ring", "Tree", "NVLS", "NVLSTree", "CollNetDirect", "CollNetChain", "PAT"]
"""NCCL's algorithm names as ``NCCL_ALGO`` takes them and ``NCCL_DEBUG=INFO`` prints them."""
_ALGORITHMS: dict[str, str] = {a.lower(): a for a in NcclAlgorithm.__args__}  # type: ignore[attr-defined]
Capability = Literal["cuda", "nccl", "nvml", "nvlink", "ib", "roce", "efa", "slurm", "mpi", "multi-node"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")


def check_pattern(pattern: str, where: str) -> str:
    """An environment variable name or shell-style pattern (the profile's ``launch.forward_env``,
    ``--forward-env``): ``pattern`` stripped, or a SettingsError naming ``where`` it came from and
    what is allowed. Here, below both the profiles and `launch.forward_env`, which use it."""
    text = pattern.strip()
    if not _PATTERN.match(text):
        raise SettingsError(
            f"{where}: {pattern!r} is not a variable name or pattern (letters, digits, '_', and the "
            "wildcards '*' and '?', e.g. 'MY_SITE_*')"
        )
    return text
