"""The environment fingerprint stored in results.json: what was tested, with which software.

Two runs are only comparable when their fingerprints are; the baseline gate diffs them so a
report can say "NCCL 2.21.5 -> 2.23.4". Secrets never enter it: only ``NCCL_*`` variables (and
a few named launcher ones) are kept, and any value whose name looks secret is redacted.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_gpucluster.cluster.nccl_names import redact_env
from pytest_gpucluster.workloads._cgroup import RANK_CGROUP_ENV

_KEPT_PREFIXES = ("NCCL_", "FI_", "UCX_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """Keep what shapes communication performance; redact secrets (by name, and passwords in URLs)."""
    return redact_env({name: value for name, value in sorted(env.items()) if name.startswith(_KEPT_PREFIXES)})


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software_versions() -> dict[str, str | None]:
    """Package versions without importing the packages (no torch import at session start)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "pytest": _version("pytest"),
        "pytest-gpucluster": _version("pytest-gpucluster"),
    }


def device_versions(cuda_available: bool) -> dict[str, Any]:
    """Driver, CUDA and NCCL versions where a GPU is present; nulls otherwise."""
    info: dict[str, Any] = {"driver": None, "cuda": None, "nccl": None}
    if not cuda_available:
        return info
    try:
        import torch

        info["cuda"] = torch.version.cuda
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:  # a broken CUDA install must not stop the results file
        info["error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        pass
    return info


def rank_cpu_quota(environ: Mapping[str, str]) -> str | None:
    """The CPU quota the ranks of this run join (``GPUCLUSTER_RANK_CGROUP``, testbed/cpu_quota.py),
    as ``0.67 CPUs``; None without one. A deliberate slowdown shows in the environment diff."""
    path = environ.get(RANK_CGROUP_ENV, "").strip()
    if not path:
        return None
    cgroup = Path(path)
    try:
        if (cgroup / "cpu.max").is_file():
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        else:
            quota = (cgroup / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return f"no limit ({path})"
        return f"{int(quota) / int(period):.3g} CPUs"
    except (OSError, ValueError) as exc:
        return f"unreadable ({path}: {exc})"


def fingerprint(
    *,
    hosts: list[str],
    gpu_names: list[str],
    cuda_available: bool,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    return {
        "hostname": socket.gethostname(),
        "hosts": hosts,
        "gpu_model": gpu_names[0] if gpu_names else None,
        "gpu_count": len(gpu_names),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "versions": {**software_versions(), **device_versions(cuda_available)},
        "environment": redact(env),
        "rank_cpu_quota": rank_cpu_quota(env),
        "load_average": _load_average(),
    }


def _load_average() -> float | None:
    """The 1-minute load average when the run starts: other work on the machine slows it, which a
    comparison with a baseline should say (never a verdict: it is shown, not diffed)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
