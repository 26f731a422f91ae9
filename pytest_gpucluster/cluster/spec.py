"""`ClusterSpec`: which hosts a job may use, how many ranks per host, and which backend.

Built from the local machine, a parsed hostfile, or a Slurm allocation's environment. A spec is
a plain value; `launch.job.Cluster` turns it into running jobs.

Imports no torch and no pytest: the local GPU count is read from the device files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gpucluster.errors import HostfileError, SettingsError

if TYPE_CHECKING:
    from pytest_gpucluster.cluster.hostfile import Hostfile

__all__ = ["BACKENDS", "ClusterSpec", "local_gpu_count"]

BACKENDS = ("gloo", "nccl")


def local_gpu_count(environ: Mapping[str, str] | None = None, dev: str = "/dev") -> int:
    """NVIDIA GPUs this process may use: ``/dev/nvidia<N>`` files, limited by CUDA_VISIBLE_DEVICES."""
    env = os.environ if environ is None else environ
    try:
        present = sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        present = 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and present:
        listed = [part for part in visible.split(",") if part.strip() and part.strip() != "-1"]
        return min(len(listed), present)
    return present


@dataclass(frozen=True)
class ClusterSpec:
    """The machines a session may launch on."""

    hosts: tuple[tuple[str, int | None], ...]
    """``(host, slots)`` in launch order; the first host hosts the rendezvous. ``slots`` is what
    the source said (None: not said)."""
    nproc_per_node: int
    """Ranks started per node unless a job asks for another number."""
    backend: str = "gloo"
    source: str = "local"
    """``local``, ``hostfile:<path>`` or ``slurm``: where the host list came from, for messages."""
    users: tuple[tuple[str, str], ...] = field(default=())
    """``(host, user)`` for hostfile entries written ``user@host``."""

    def __post_init__(self) -> None:
        hosts = tuple((str(h), s) for h, s in self.hosts)
        object.__setattr__(self, "hosts", hosts)
        if not hosts:
            raise SettingsError(f"the cluster from {self.source} has no hosts")
        if self.backend not in BACKENDS:
            raise SettingsError(
                f"backend {self.backend!r} (cluster from {self.source}) is not one of {', '.join(BACKENDS)}"
            )
        if self.nproc_per_node < 1:
            raise SettingsError(
                f"nproc_per_node must be at least 1, got {self.nproc_per_node} (cluster from {self.source})"
            )

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(host for host, _ in self.hosts)

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def user_map(self) -> dict[str, str]:
        return dict(self.users)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_local(cls, nproc: int | None = None, backend: str | None = None) -> ClusterSpec:
        """This machine alone: one rank per GPU (nccl), or ``nproc`` ranks (default 1) on CPU (gloo)."""
        gpus = local_gpu_count()
        backend = backend or ("nccl" if gpus else "gloo")
        nproc = nproc or (gpus if backend == "nccl" and gpus else 1)
        return cls(hosts=(("localhost", nproc),), nproc_per_node=nproc, backend=backend, source="local")

    @classmethod
    def from_hostfile(
        cls, hostfile: Hostfile, nproc_per_node: int | None = None, backend: str | None = None
    ) -> ClusterSpec:
        """Hosts in file order; ranks per node = ``nproc_per_node``, else the smallest ``slots``, else 1."""
        entries = hostfile.entries
        if not entries:
            raise HostfileError(f"{hostfile.source}: the hostfile lists no hosts")
        if nproc_per_node is None:
            slots = [e.slots for e in entries if e.slots]
            # torchrun starts the same number of ranks on every node: the smallest fits all.
            nproc_per_node = min(slots) if slots else 1
        return cls(
            hosts=tuple((e.host, e.slots) for e in entries),
            nproc_per_node=nproc_per_node,
            backend=backend or ("nccl" if local_gpu_count() else "gloo"),
            source=f"hostfile:{hostfile.source}",
            users=tuple((e.host, e.user) for e in entries if e.user),
        )

    @classmethod
    def from_slurm_env(
        cls, environ: Mapping[str, str] | None = None, backend: str | None = None
    ) -> ClusterSpec:
        """The allocation this process runs in: ``SLURM_JOB_NODELIST``, ranks per node from
        ``SLURM_GPUS_ON_NODE`` (GPU jobs) or ``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``."""
        from pytest_gpucluster.cluster.nodelist import allocation_nodelist, expand_nodelist

        env = os.environ if environ is None else environ
        hosts = expand_nodelist(allocation_nodelist(env))
        gpus = _leading_int(env.get("SLURM_GPUS_ON_NODE"), "SLURM_GPUS_ON_NODE")
        tasks = _leading_int(
            env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"
        )
        nproc = gpus or tasks or 1
        return cls(
            hosts=tuple((host, nproc) for host in hosts),
            nproc_per_node=nproc,
            backend=backend or ("nccl" if gpus else "gloo"),
            source="slurm",
        )

    @classmethod
    def from_hostfile_path(cls, path: str | Path, nproc_per_node: int | None = None) -> ClusterSpec:
        from pytest_gpucluster.cluster.hostfile import read_hostfile

        return cls.from_hostfile(read_hostfile(path), nproc_per_node)


def _leading_int(value: str | None, name: str) -> int | None:
    """``"8"``, ``"8(x2)"``, ``"4(x2),2"`` (Slurm's per-node counts): the first node's count."""
    if value is None or not value.strip():
        return None
    match = re.match(r"\s*(\d+)", value)
    if not match:
        raise HostfileError(f"{name}={value!r} is not a count Slurm writes (e.g. '8' or '8(x2)')")
    return int(match.group(1)) or None
