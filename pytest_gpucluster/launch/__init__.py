"""Launcher backends by name: ``get_launcher("torchrun")``.

Like torch elastic's rendezvous registry, a name maps to a factory that imports its backend
module only when asked for, so ``pytest --help`` never pays for a backend it does not use and
a backend that cannot import here breaks only the runs that choose it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_gpucluster.errors import SettingsError

__all__ = ["get_launcher", "launcher_names", "register_launcher"]

LauncherFactory = Callable[..., Any]

_factories: dict[str, LauncherFactory] = {}


def register_launcher(name: str, factory: LauncherFactory, *, replace: bool = False) -> None:
    """Register ``factory(**kwargs) -> Launcher`` under ``name``."""
    if name in _factories and not replace:
        raise SettingsError(f"a launcher named {name!r} is already registered")
    _factories[name] = factory


def launcher_names() -> list[str]:
    return sorted(_factories)


def get_launcher(name: str, **kwargs: Any) -> Any:
    """A new launcher of backend ``name``; the error lists the backends that exist."""
    try:
        factory = _factories[name]
    except KeyError:
        raise SettingsError(
            f"unknown launcher {name!r}; known launchers: {', '.join(launcher_names())}"
        ) from None
    return factory(**kwargs)


def _torchrun(**kwargs: Any) -> Any:
    from pytest_gpucluster.launch.torchrun import TorchrunLauncher

    return TorchrunLauncher(**kwargs)


register_launcher("torchrun", _torchrun)


def _slurm(**kwargs: Any) -> Any:
    from pytest_gpucluster.launch.slurm import SlurmLauncher

    return SlurmLauncher(**kwargs)


def _mpirun(**kwargs: Any) -> Any:
    from pytest_gpucluster.launch.mpi import MpirunLauncher

    return MpirunLauncher(**kwargs)


def _deepspeed(**kwargs: Any) -> Any:
    from pytest_gpucluster.launch.deepspeed import DeepSpeedLauncher

    return DeepSpeedLauncher(**kwargs)


register_launcher("slurm", _slurm)
register_launcher("mpirun", _mpirun)
register_launcher("deepspeed", _deepspeed)
