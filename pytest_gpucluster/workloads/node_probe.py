"""The per-node probe, rank side: one rank per node says what its node is.

`probe` is the workload the session runs first, one rank per node through the selected launcher
(``pytest_gpucluster.cluster.probe``); `read_node` is the same reading for the pytest process
itself when every host is this machine. What one node reports, as plain JSON:

- **GPUs, through one seam** (`gpu_facts`): NVML when it loads (names, UUIDs, memory, PCI bus ids,
  driver and CUDA driver versions, whether any NVLink is active, and the compute processes on each
  GPU); otherwise the output of ``nvidia-smi`` (the plain table, parsed by the parent with
  `parsers.nvidia_smi`), or why neither could be asked;
- versions: torch (and, where GPUs were found, what this torch sees: ``torch.cuda.is_available()``,
  its CUDA and NCCL), Python, the kernel;
- InfiniBand/RoCE ports: ``/sys/class/infiniband/*/ports/*`` through `workloads.fabric_probe`
  (``options["sysfs_root"]``, ``{host}`` replaced by this node's name, reads a recorded tree);
- the environment that matters: the variables matching ``options["env_patterns"]`` (the launch's
  forward list), secret-looking values already replaced here;
- CPUs: ``os.cpu_count()``, and ``SLURM_CPUS_ON_NODE`` inside a Slurm step;
- reachability (`reach`): a TCP connect to each of ``options["peers"]`` (a few of the session's
  other nodes) on a port where nothing need listen: a refusal is an answer (the peer is reached),
  only silence (a timeout) or "no route" is not. NCCL and gloo open TCP connections between all
  nodes, so a node its peers cannot reach is unfit whatever launched it.
- readiness (`workloads.readiness_probe`): Fabric Manager, SXids, peermem, memlock, ACS, IOMMU,
  row remaps, persistence, stuck processes, PCIe links and AER (``options["proc_root"]``, like
  the sysfs root, reads a recorded tree).

torch is imported only where GPUs were found (it costs a second or more). Standard library, torch
and (lazily) pynvml only, like the rest of ``workloads/``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads import fabric_probe
from pytest_gpucluster.workloads._runtime import RankContext
from pytest_gpucluster.workloads.gpu_processes import gpu_compute_processes
from pytest_gpucluster.workloads.nvlink_probe import load_nvml
from pytest_gpucluster.workloads.readiness_probe import FM_LOG, read_readiness

__all__ = ["REDACTED", "gpu_facts", "probe", "read_node"]

REDACTED = "<redacted>"
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY")
SMI_TIMEOUT_S = 60.0
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


NVML_ERROR_NO_PERMISSION = 4
"""NVML's return code for a GPU this process may not read (a GPU of another job's cgroup)."""


def _no_permission(exc: Exception) -> bool:
    return getattr(exc, "value", None) == NVML_ERROR_NO_PERMISSION or "NoPermission" in type(exc).__name__


def _mig_mode(nvml: Any, handle: Any) -> str | None:
    """``Enabled``/``Disabled`` (the current mode); None where the GPU has no MIG (NOT_SUPPORTED)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:
        return None
    return "Enabled" if current else "Disabled"


def _nvml_gpus(nvml: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Every GPU NVML lists, and those it would not read: a handle answering ``NO_PERMISSION`` (a
    cgroup-constrained Slurm step) is skipped and named, the others still read."""
    gpus, skipped = [], []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = {
                "index": index,
                "name": _text(nvml.nvmlDeviceGetName(handle)),
                "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                "memory_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                "bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            }
        except Exception as exc:
            if not _no_permission(exc):
                raise
            skipped.append(f"GPU {index}: NVML answered NO_PERMISSION (not this job's GPU)")
            continue
        gpu["mig"] = _mig_mode(nvml, handle)
        gpus.append(gpu)
    return gpus, skipped


def _nvlink_active(nvml: Any, indices: Sequence[int]) -> bool:
    for index in indices:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for link in range(18):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link):
                    return True
            except Exception:  # links past the device's count raise
                break
    return False


def _from_nvml(nvml: Any) -> dict[str, Any]:
    gpus, skipped = _nvml_gpus(nvml)
    code = int(nvml.nvmlSystemGetCudaDriverVersion())
    processes, why = gpu_compute_processes(nvml)
    return {
        "source": "nvml",
        "gpus": gpus,
        "driver": _text(nvml.nvmlSystemGetDriverVersion()),
        "cuda_driver": f"{code // 1000}.{code % 1000 // 10}",
        "nvlink_active": _nvlink_active(nvml, [g["index"] for g in gpus]),
        "processes": processes,
        "processes_why": why,
        "skipped": skipped,
    }


def _from_smi(smi: str, nvml_why: str | None, run: Runner) -> dict[str, Any]:
    path = shutil.which(smi)
    if path is None:
        return {
            "source": None,
            "why": f"no NVML ({nvml_why}) and no '{smi}' on PATH",
        }
    try:
        done = run([path], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"source": "nvidia-smi", "why": f"'{path}' could not be run: {exc}", "nvml_why": nvml_why}
    return {
        "source": "nvidia-smi",
        "program": path,
        "returncode": done.returncode,
        "text": done.stdout,
        "stderr": done.stderr[-2000:],
        "nvml_why": nvml_why,
    }


def gpu_facts(*, smi: str = "nvidia-smi", nvml: Any = None, run: Runner = subprocess.run) -> dict[str, Any]:
    """The node's GPUs through NVML when it loads, else through ``smi`` (its plain table, for the
    parent to parse), else ``{"source": None, "why": ...}``. ``nvml``: an initialised pynvml
    (default: load it here)."""
    owned = nvml is None
    why = None
    if owned:
        nvml, why = load_nvml()
    if nvml is not None:
        try:
            return _from_nvml(nvml)
        except Exception as exc:  # an NVML error half way: fall back to the program
            why = f"NVML failed while reading the GPUs ({type(exc).__name__}: {exc})"
        finally:
            if owned:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
    return _from_smi(smi, why, run)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_view() -> dict[str, Any]:
    """What this node's torch makes of its GPUs (imported only where GPUs were listed)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return {"torch_error": f"torch is not importable here ({exc})"}
    view: dict[str, Any] = {
        "cuda_available": bool(torch.cuda.is_available()),
        "torch_cuda": torch.version.cuda,
        "device_count": int(torch.cuda.device_count()) if torch.cuda.is_available() else 0,
        "nccl": None,
        "nccl_available": bool(dist.is_available() and dist.is_nccl_available()),
    }
    if view["cuda_available"] and view["nccl_available"]:
        nccl = torch.cuda.nccl.version()
        view["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return view


def _secret(name: str) -> bool:
    return any(marker in name.upper() for marker in _SECRET_MARKERS)


def matching_env(patterns: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables whose names match one of ``patterns`` (shell-style), secrets redacted."""
    env = os.environ if environ is None else environ
    found = {k: v for k, v in env.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    return {k: (REDACTED if _secret(k) and v else v) for k, v in sorted(found.items())}


REACH_PORT = 9
"""The discard port: almost never served, so a reached peer answers with a refusal."""
REACH_TIMEOUT_S = 3.0


def _answer(peer: str, port: int, timeout: float) -> str | None:
    """None when ``peer`` answered a TCP connect on ``port`` (accepted or refused), else why not."""
    try:
        with socket.create_connection((peer, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None
    except TimeoutError:
        return f"no answer from {peer} within {timeout:g} s"
    except OSError as exc:
        return f"{peer}: {exc.strerror or exc}"


def reach(
    peers: Sequence[str], port: int = REACH_PORT, timeout: float = REACH_TIMEOUT_S
) -> dict[str, str | None]:
    """Peer -> None when it answered, else why not; all peers at once (one timeout in all)."""
    from concurrent.futures import ThreadPoolExecutor

    if not peers:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(peers), 16)) as pool:
        answers = list(pool.map(lambda peer: _answer(peer, port, timeout), peers))
    return dict(zip(peers, answers, strict=True))


def read_node(
    host: str | None = None,
    *,
    env_patterns: Sequence[str] = (),
    sysfs_root: str | None = None,
    smi: str = "nvidia-smi",
    peers: Sequence[str] = (),
    proc_root: str | None = None,
    fm_log: str | None = None,
) -> dict[str, Any]:
    """Everything the probe reports for this node (see the module docstring)."""
    host = host or socket.gethostname()
    gpu = gpu_facts(smi=smi)
    root = (sysfs_root or "/sys").replace("{host}", host)
    proc = (proc_root or "/proc").replace("{host}", host)
    facts: dict[str, Any] = {
        "host": host,
        "pid": os.getpid(),
        "gpu": gpu,
        "torch": _version("torch"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpu_count": os.cpu_count(),
        "slurm_cpus_on_node": os.environ.get("SLURM_CPUS_ON_NODE"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "infiniband": fabric_probe.read_ib_ports(Path(root)),
        "links": fabric_probe.read_links(Path(root), shaping=root == "/sys"),
        "sysfs_root": root,
        "env": matching_env(env_patterns),
        "reach": reach(peers),
        # readiness (workloads.readiness_probe): fabric manager, peermem, ACS, remaps, AER, ...
        "readiness": read_readiness(
            sysfs_root=root, proc_root=proc, smi=smi, fm_log=(fm_log or FM_LOG).replace("{host}", host)
        ),
    }
    if gpu.get("gpus") or gpu.get("text"):
        facts.update(_torch_view())
    return facts


def probe(ctx: RankContext) -> dict[str, Any]:
    """The workload: this node's facts (run with one rank per node, no process group)."""
    options = ctx.options
    return read_node(
        ctx.host,
        env_patterns=tuple(options.get("env_patterns") or ()),
        sysfs_root=options.get("sysfs_root"),
        peers=tuple(options.get("peers") or ()),
        proc_root=options.get("proc_root"),
        fm_log=options.get("fm_log"),
    )
