"""Which of the controller's environment variables every rank gets, under every launcher.

Users start pytest on a login node whose environment was set up for the site: ``module load``,
a virtual environment, ``LD_LIBRARY_PATH`` pointing at aws-ofi-nccl or HPC-X, ``FI_PROVIDER=efa``.
The ranks run elsewhere, started by ssh/pdsh, mpirun, srun or the DeepSpeed runner, and each of
those forwards a different subset on its own (ssh: nothing). Without ``LD_LIBRARY_PATH`` the NCCL
net plugin is not found on the remote nodes and NCCL quietly falls back to sockets on every node
but the first. So the job's environment carries, explicitly, every variable matching:

- `DEFAULT_PATTERNS` — ``PATH``, ``LD_LIBRARY_PATH``, ``PYTHONPATH``, ``VIRTUAL_ENV``, ``CUDA_*``,
  ``NCCL_*``, ``FI_*``, ``OFI_*``, ``UCX_*``, ``TORCH_*``, ``HF_*``, ``OMP_NUM_THREADS`` — except
  ``CUDA_VISIBLE_DEVICES``, which is the node's (or the scheduler's) to set, never the login
  node's; name it explicitly to forward it anyway;
- plus the patterns of ``--forward-env`` (repeatable) and the profile's ``launch.forward_env``.

Patterns are shell-style on the variable name (``MY_SITE_*``). How each backend carries them:
remote-exec (ssh, pdsh, netns) puts ``env K=V`` in the command; mpirun ``-x K=V``; srun
``--export=ALL`` with the variables in srun's own environment; DeepSpeed's runner a
``DS_ENV_FILE`` for multi-node jobs. Values whose names look secret (``HF_TOKEN``) are forwarded
(the job needs them) but never shown: `launch.base.LaunchCommand.shell_line` redacts them.

Standard library only.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping, Sequence

from pytest_gpucluster.profiles.fields import check_pattern

__all__ = ["DEFAULT_PATTERNS", "NEVER_BY_DEFAULT", "check_pattern", "forward_patterns", "forwarded_env"]

DEFAULT_PATTERNS: tuple[str, ...] = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_*",
    "NCCL_*",
    "FI_*",
    "OFI_*",
    "UCX_*",
    "TORCH_*",
    "HF_*",
    "OMP_NUM_THREADS",
)
NEVER_BY_DEFAULT = frozenset({"CUDA_VISIBLE_DEVICES"})
"""Matched by a default pattern but left to the node: forwarded only when a pattern names it exactly."""


def forward_patterns(*extra: Iterable[str]) -> tuple[str, ...]:
    """The default patterns, then each extra one not already there (order kept)."""
    out = list(DEFAULT_PATTERNS)
    for group in extra:
        out += [p for p in group if p not in out]
    return tuple(out)


def forwarded_env(patterns: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) whose names match ``patterns``."""
    env = os.environ if environ is None else environ
    exact = {p for p in patterns if not any(ch in p for ch in "*?")}
    out = {}
    for name, value in env.items():
        if name in NEVER_BY_DEFAULT and name not in exact:
            continue
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            out[name] = value
    return dict(sorted(out.items()))
