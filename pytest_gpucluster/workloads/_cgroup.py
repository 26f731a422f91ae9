"""A rank joins the cgroup that ``GPUCLUSTER_RANK_CGROUP`` names, so a CPU quota slows the ranks
of a job and nothing else (``pytest_gpucluster.testbed.cpu_quota`` makes the cgroup).

Only the rank's own process moves (its pid, written by itself into ``cgroup.procs``): the agent
that started it, pytest and the shell stay where they are. A variable naming something that is
not a cgroup is an error of the rank, never ignored: the run was asked to be slow.

Like the rest of ``workloads/``, this depends on the standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["RANK_CGROUP_ENV", "join_rank_cgroup"]

RANK_CGROUP_ENV = "GPUCLUSTER_RANK_CGROUP"


def join_rank_cgroup(environ: Mapping[str, str] | None = None) -> str | None:
    """Move this process into the cgroup ``GPUCLUSTER_RANK_CGROUP`` names; the cgroup, or None
    when the variable is unset."""
    env = os.environ if environ is None else environ
    path = env.get(RANK_CGROUP_ENV, "").strip()
    if not path:
        return None
    procs = Path(path) / "cgroup.procs"
    if not procs.is_file():
        raise RuntimeError(
            f"{RANK_CGROUP_ENV}={path} is not a cgroup directory (it has no cgroup.procs); "
            "make one with python -m pytest_gpucluster.testbed.cpu_quota"
        )
    try:
        procs.write_text(f"{os.getpid()}\n", encoding="ascii")
    except OSError as exc:
        raise RuntimeError(f"this rank could not join the cgroup {path}: {exc.strerror or exc}") from None
    return path
