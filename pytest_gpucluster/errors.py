"""Errors the plugin raises on purpose, each meant to be read by a person.

A message states what failed, where (file, key path, line, host, rank), the bad value and
what was expected. Nothing here imports pytest or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GpuClusterError",
    "GpuClusterWarning",
    "HostfileError",
    "JobFailed",
    "JobSkipped",
    "LaunchError",
    "ParseError",
    "ProfileError",
    "SettingsError",
]


class GpuClusterError(Exception):
    """Base of every error the plugin reports without a traceback."""


class SettingsError(GpuClusterError):
    """A command-line option, environment variable or ini key has a bad value."""


class ProfileError(GpuClusterError):
    """A hardware profile is missing, malformed or asks for something impossible."""


class HostfileError(GpuClusterError):
    """A hostfile or Slurm nodelist cannot be read."""


class ParseError(GpuClusterError):
    """A recorded tool output (nccl-tests, NCCL log, nvidia-smi...) holds no usable data."""


class LaunchError(GpuClusterError):
    """A job could not be started (bad command, missing launcher, unreachable node)."""


class JobFailed(GpuClusterError):
    """A job started but at least one rank failed, hung or never reported.

    ``result`` is the job's `JobResult` (every rank's outcome, logs) when the failure came from a
    finished job, for callers that want more than the report in the message.
    """

    def __init__(self, message: str, *, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class JobSkipped(GpuClusterError):
    """Every rank that reported was fine, and at least one skipped (e.g. no NVML there).

    The plugin turns it into a pytest skip wherever a test or fixture raises it, so a job that
    cannot run here skips its test with the ranks' reason instead of failing it.
    """


class GpuClusterWarning(UserWarning):
    """Something that does not stop a run but makes it mean less (e.g. an NCCL_* name NCCL ignores)."""
