"""Stage 1 of the session's start: the settings -> the nodes the session is given (`NodeList`).

The hosts of ``--hostfile``, else of the Slurm allocation pytest runs in (``--launcher slurm``
with ``SLURM_JOB_NODELIST``), else this machine; in their order (the first hosts the
rendezvous). ``--gpucluster-exclude`` leaves the nodes it names out from the start (they are
kept in ``excluded``, for results.json and the report: never silent); a name the list does not
hold is a usage error (a typo must not leave a bad node in). A hostfile that cannot be read is
kept as the list's ``error``: the session still starts, and the tests that use the cluster
fail on it.

Plain values in and out; imports nothing else of `session/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_gpucluster.errors import GpuClusterError, SettingsError

if TYPE_CHECKING:
    from pytest_gpucluster.options import Settings

__all__ = ["NodeList", "excluded_from", "listed_hosts", "node_list"]


@dataclass(frozen=True, slots=True)
class NodeList:
    """The nodes the session is given, in launch order, and where the list comes from."""

    hosts: tuple[str, ...]
    """The nodes to probe and run on, ``excluded`` left out."""
    source: str
    """``hostfile <path>``, ``Slurm allocation (SLURM_JOB_NODELIST)`` or ``this machine``."""
    hostfile: Any = None
    """The parsed `cluster.hostfile.Hostfile`, when the list comes from one."""
    error: GpuClusterError | None = None
    """Why the list could not be read (a bad hostfile); ``hosts`` is then empty."""
    local: bool = False
    """Every host is this machine: the pytest process reads itself, nothing is launched."""
    excluded: tuple[str, ...] = ()
    """The nodes ``--gpucluster-exclude`` left out, as the list names them."""


def listed_hosts(
    hostfile: Any, settings: Settings, hostname: str, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The hosts of a parsed hostfile, else of the Slurm allocation, else ``hostname``."""
    env = os.environ if environ is None else environ
    if hostfile is not None:
        return list(hostfile.hosts)
    if env.get("SLURM_JOB_NODELIST") and settings.launcher == "slurm":
        from pytest_gpucluster.cluster.nodelist import expand_nodelist

        return expand_nodelist(env["SLURM_JOB_NODELIST"])
    return [hostname]


def node_list(settings: Settings, hostname: str, environ: Mapping[str, str] | None = None) -> NodeList:
    """The session's nodes from ``settings`` (module docstring)."""
    from pytest_gpucluster.launch.base import is_local_host

    env = os.environ if environ is None else environ
    hostfile = None
    if settings.hostfile is not None:
        from pytest_gpucluster.cluster.hostfile import read_hostfile

        source = f"hostfile {settings.hostfile}"
        try:
            hostfile = read_hostfile(settings.hostfile)
        except GpuClusterError as exc:
            return NodeList((), source, error=exc)
        hosts = tuple(hostfile.hosts)
    elif env.get("SLURM_JOB_NODELIST") and settings.launcher == "slurm":
        from pytest_gpucluster.cluster.nodelist import expand_nodelist

        source, hosts = (
            "Slurm allocation (SLURM_JOB_NODELIST)",
            tuple(expand_nodelist(env["SLURM_JOB_NODELIST"])),
        )
    else:
        source, hosts = "this machine", (hostname,)
    excluded = excluded_from(hosts, settings.exclude, source, settings.source("exclude"))
    kept = tuple(h for h in hosts if h not in excluded)
    return NodeList(kept, source, hostfile, local=all(is_local_host(h) for h in kept), excluded=excluded)


def _short(name: str) -> str:
    return name.split(".")[0]


def excluded_from(
    hosts: tuple[str, ...], names: tuple[str, ...], source: str, origin: str
) -> tuple[str, ...]:
    """The hosts of ``hosts`` that ``names`` (``--gpucluster-exclude``) names, by full or short
    name; a name matching none, or names leaving no node, is a `SettingsError`."""
    if not names:
        return ()
    unknown = [n for n in names if not any(n in (h, _short(h)) or _short(n) == h for h in hosts)]
    if unknown:
        raise SettingsError(
            f"--gpucluster-exclude (from {origin}) names {', '.join(unknown)}, which the {source} does not "
            f"list (it lists {', '.join(hosts)})"
        )
    excluded = tuple(h for h in hosts if any(n in (h, _short(h)) or _short(n) == h for n in names))
    if len(excluded) == len(hosts):
        raise SettingsError(
            f"--gpucluster-exclude (from {origin}) leaves no node of the {source} ({', '.join(hosts)}) to test"
        )
    return excluded
