"""``/proc/<pid>/limits``: the resource limits of a process, as the kernel prints them.

Only the locked-memory limit is judged today: NCCL and the RDMA verbs library pin (register)
communication buffers, and a ``Max locked memory`` of a few MiB (the distribution default, 64 KiB
to 8 MiB) makes ``ibv_reg_mr`` fail, so NCCL drops GPUDirect RDMA or errors out ("NET/IB :
Unable to register memory", "Cannot allocate memory"). Pure: no I/O.
"""

from __future__ import annotations

import re

from pytest_gpucluster.errors import ParseError

__all__ = ["UNLIMITED", "memlock_limit"]

UNLIMITED = -1
"""The value a limit of ``unlimited`` reads as."""
_LINE = re.compile(r"^Max locked memory\s+(?P<soft>\S+)\s+(?P<hard>\S+)\s+bytes\s*$", re.MULTILINE)


def memlock_limit(text: str) -> tuple[int, int]:
    """``(soft, hard)`` bytes of ``Max locked memory`` (`UNLIMITED` for ``unlimited``)."""
    match = _LINE.search(text)
    if match is None:
        raise ParseError(f"no 'Max locked memory' line in the limits text (got {text[:120]!r})")

    def value(word: str) -> int:
        return UNLIMITED if word == "unlimited" else int(word)

    return value(match["soft"]), value(match["hard"])
