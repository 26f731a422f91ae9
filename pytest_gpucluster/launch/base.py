"""What every launcher backend shares: the job it is asked to start and the commands it returns.

A backend is a pure command builder: ``commands(job)`` turns a `JobSpec` into one
`LaunchCommand` per agent (an argv list, never a shell string, plus the environment to add),
so its exact argv is unit-tested with no cluster. Starting, watching and killing the processes
is `launch.process`'s job, the same for every backend.

Remote nodes are reached through a `RemoteExec` prefix (``ssh {host}``, ``pdsh -w {host}``,
``srun ... -w {host}``, or ``ip netns exec {host}`` in the tests). The environment of a remote
agent travels inside its argv as ``env K=V ...`` because ssh does not forward it.

Standard library only; no torch, no pytest.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from pytest_gpucluster.errors import SettingsError

__all__ = [
    "REMOTE_PRESETS",
    "JobSpec",
    "LaunchCommand",
    "Launcher",
    "RemoteExec",
    "is_local_host",
]


def _frozen_env(env: Mapping[str, Any] | None) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in (env or {}).items()})


@dataclass(frozen=True)
class LaunchCommand:
    """One process to start on this machine: an agent for ``host`` (local or through a prefix)."""

    host: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to this machine's environment for the process (never the whole environ)."""
    remote: bool = False
    """True when argv goes through a remote-exec prefix to another node."""
    node_argv: tuple[str, ...] = ()
    """For a remote command: what runs on the node, before the prefix and ``env K=V`` were put
    around it (the launch wraps it in the node-side guard, `launch.guard`, and wraps it again)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        object.__setattr__(self, "node_argv", tuple(str(a) for a in self.node_argv))
        object.__setattr__(self, "env", _frozen_env(self.env))

    def shell_line(self) -> str:
        """For people only (dry run, error messages): the command as one copy-pasteable line, with
        the values of secret-looking variables (``HF_TOKEN=...``, in the environment or in the
        argv's ``env K=V`` / ``-x K=V``) replaced by ``<redacted>``."""
        prefix = [f"{k}={shlex.quote(_shown(k, v))}" for k, v in sorted(self.env.items())]
        return " ".join([*prefix, *(shlex.quote(_shown_arg(a)) for a in self.argv)])


def _shown(name: str, value: str) -> str:
    from pytest_gpucluster.cluster.nccl_names import REDACTED, is_secret_name

    return REDACTED if value and is_secret_name(name) else value


def _shown_arg(arg: str) -> str:
    name, sep, value = arg.partition("=")
    quote = "'" if name.startswith("'") else ""  # an argument already quoted for ssh
    if sep and name.removeprefix(quote).isidentifier() and _shown(name.removeprefix(quote), value) != value:
        return f"{name}={_shown(name.removeprefix(quote), value)}{quote}"
    return arg


REMOTE_PRESETS: dict[str, tuple[str, ...]] = {
    "ssh": ("ssh", "-o", "BatchMode=yes", "{target}"),
    "pdsh": ("pdsh", "-w", "{target}"),
    "srun": ("srun", "--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=1", "-w", "{host}"),
    # Network namespaces standing in for nodes (FEASIBILITY §1, variant B): `ip netns exec`
    # bind-mounts /etc/netns/<ns>/hosts; `unshare --uts` gives the namespace its own hostname.
    # The hostname reaches the script as $0 and is never interpolated into it.
    "netns": (
        "ip", "netns", "exec", "{host}", "unshare", "--uts", "sh", "-c",
        'hostname "$0" && exec "$@"', "{host}",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class RemoteExec:
    """How to run an argv on another node: a template whose ``{host}`` (``{user}``, ``{target}``
    = ``user@host`` or ``host``) is filled per node.

    ``quote``: the remote side joins argv into a shell line (ssh, pdsh), so each argument is
    shell-quoted; ``None`` decides from the program name. ``shares_proc``: the "remote" processes
    are visible in this machine's /proc (network namespaces), so no remote reaper is needed.
    """

    template: tuple[str, ...]
    quote: bool | None = None
    shares_proc: bool = False

    def __post_init__(self) -> None:
        template = tuple(self.template)
        if not template:
            raise SettingsError("the remote-exec template is empty; give e.g. 'ssh {host}'")
        if not any(("{host}" in part or "{target}" in part) for part in template):
            raise SettingsError(
                f"the remote-exec template {' '.join(template)!r} never names the node: "
                "it needs '{host}' (or '{target}' for user@host)"
            )
        object.__setattr__(self, "template", template)
        if self.quote is None:
            object.__setattr__(self, "quote", Path(template[0]).name in {"ssh", "pdsh", "rsh", "pdsh.bash"})

    @classmethod
    def parse(cls, text: str | Sequence[str]) -> RemoteExec:
        """A preset name (``ssh``, ``pdsh``, ``srun``, ``netns``) or a template (``"ssh -p 2222 {host}"``)."""
        if isinstance(text, str):
            name = text.strip()
            if name in REMOTE_PRESETS:
                return cls(REMOTE_PRESETS[name], shares_proc=name == "netns")
            parts = tuple(shlex.split(text))
        else:
            parts = tuple(text)
        return cls(parts)

    def wrap(
        self, host: str, argv: Sequence[str], env: Mapping[str, str], user: str | None = None
    ) -> list[str]:
        """``prefix... env K=V ... argv...`` for ``host``."""
        target = f"{user}@{host}" if user else host
        prefix = [part.format(host=host, user=user or "", target=target) for part in self.template]
        inner = [*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *argv]
        if self.quote:
            inner = [shlex.quote(part) for part in inner]
        return [*prefix, *inner]


def is_local_host(host: str) -> bool:
    """True for this machine's names: an agent for it starts here, without the remote prefix."""
    if host in {"localhost", "127.0.0.1", "::1"}:
        return True
    name = socket.gethostname()
    return host in {name, name.split(".")[0]}


@dataclass(frozen=True)
class JobSpec:
    """Everything a backend needs to build the commands of one job."""

    job_id: str
    job_dir: Path
    workload: str
    """``package.module:function`` on the rank side."""
    hosts: tuple[str, ...]
    nproc_per_node: int
    backend: str = "gloo"
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to every agent's and rank's environment (NCCL_*, the job id, PYTHONPATH...)."""
    timeout_s: float = 120.0
    rendezvous_port: int | None = None
    """For multi-node jobs; single-node jobs let the kernel pick (``--standalone``)."""
    rendezvous_timeout_s: float = 60.0
    remote: RemoteExec | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    """``host -> user`` for remote targets (hostfile ``user@host``)."""
    python: str = sys.executable
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "env", _frozen_env(self.env))
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))
        if not self.hosts:
            raise SettingsError(f"job {self.job_id} has no host to run on")
        if self.nproc_per_node < 1:
            raise SettingsError(
                f"job {self.job_id}: nproc_per_node must be at least 1, got {self.nproc_per_node}"
            )

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def needs_remote(self, host: str) -> bool:
        return self.remote is not None and not is_local_host(host)


@runtime_checkable
class Launcher(Protocol):
    """A backend: torchrun, srun, mpirun, the DeepSpeed launcher."""

    name: str

    def available(self) -> str | None:
        """``None`` when this backend can be used here, otherwise the reason it cannot."""

    def commands(self, job: JobSpec) -> list[LaunchCommand]:
        """The commands that start ``job``: pure, no I/O, one per agent."""


def worker_argv_tail(job: JobSpec) -> list[str]:
    """The rank program and its one argument, shared by every backend."""
    return ["-m", "pytest_gpucluster.workloads._worker", str(job.job_dir)]


def current_pythonpath_entry() -> str:
    """The directory this package is imported from, so ranks import the same copy."""
    return str(Path(__file__).resolve().parents[2])


def merge_pythonpath(*entries: str, existing: str | None = None) -> str:
    existing = os.environ.get("PYTHONPATH", "") if existing is None else existing
    parts: list[str] = []
    for part in [*entries, *existing.split(os.pathsep)]:
        if part and part not in parts:
            parts.append(part)
    return os.pathsep.join(parts)
