"""The program every rank runs: ``python -m pytest_gpucluster.workloads._worker JOB_DIR``.

It joins the process group, runs the job's workload, writes ``rank-<i>.json`` and leaves
without Python's finalization: a DeepSpeed ZeRO-3 job on gloo aborted at interpreter exit
with ``terminate called without an active exception`` in about one run in six (a gloo
thread dropping the last reference to a tensor while Python finalizes;
pytorch/pytorch#190489). Tearing the group down and ending with ``os._exit`` after
flushing avoids it.

On a CUDA job (backend nccl) the rank takes CUDA device ``local_rank % visible devices`` and records
which physical GPU that is (its UUID, under ``"gpu"`` in ``rank-<i>.json``); a rank that sees no
GPU fails, naming its host, ``CUDA_VISIBLE_DEVICES`` and the device count — a wrong GPU request
must not pass as a skip.

The rank dies with its parent (``PR_SET_PDEATHSIG``, `workloads._parent_death`) and, at the
job's hard deadline, ends itself with a stack dump in its log (`_end_at_hard_deadline`): no
rank outlives the agent that started it, or the job's time.

Like the rest of ``workloads/``, this depends on the standard library and torch only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import faulthandler
import gc
import importlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_gpucluster.workloads._cgroup import join_rank_cgroup
from pytest_gpucluster.workloads._parent_death import die_with_parent
from pytest_gpucluster.workloads._runtime import (
    JOB_FILE,
    RankContext,
    RankIdentity,
    WorkloadSkip,
    rank_log_path,
    rank_result_path,
    write_json_atomic,
)


def resolve_workload(spec: str) -> Callable[[RankContext], Any]:
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"workload {spec!r} is not of the form 'package.module:function'")
    target: Any = importlib.import_module(module_name)
    for part in func_name.split("."):
        target = getattr(target, part)
    return target


def _redirect_output(log_path: Path) -> Any:
    """Send this rank's stdout and stderr (Python's and C's) to its own log file."""
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 - lives until os._exit
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    return log


class NoGpuOnRank(RuntimeError):
    """A rank of a CUDA job found no GPU: a failure (the GPU request or the node is wrong), never a skip."""


def _gpu_uuid(torch: Any, index: int) -> str | None:
    """The physical GPU behind CUDA device ``index`` (``GPU-<uuid>``), as nvidia-smi -L names it."""
    try:
        uuid = torch.cuda.get_device_properties(index).uuid
    except (AttributeError, RuntimeError):  # torch builds without the field
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def device_index(local_rank: int, visible: int) -> int:
    """The CUDA device a rank takes: its local rank (``LOCAL_RANK``, ``SLURM_LOCALID``,
    ``OMPI_COMM_WORLD_LOCAL_RANK``) among the devices it sees; ``local_rank % visible`` where a site
    binds one GPU per task (one visible device: device 0, the task's own). Two ranks of a node that
    end up on one GPU are named by the parent (`launch.result.shared_gpus`)."""
    return local_rank % visible


def _pick_device(identity: RankIdentity, backend: str, gpu: dict[str, Any]) -> str:
    """``cpu`` for gloo; for nccl, CUDA device ``local_rank % visible`` (sites that bind one GPU per
    task show each rank a single device, which is then device 0). ``gpu`` gets what was chosen:
    the index, how many devices were visible, CUDA_VISIBLE_DEVICES and the physical GPU's UUID."""
    if backend != "nccl":
        return "cpu"
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible == 0:
        raise NoGpuOnRank(
            f"rank {identity.rank} (local rank {identity.local_rank}) on {identity.host} found no CUDA "
            f"device under a CUDA profile: CUDA_VISIBLE_DEVICES={env if env is not None else '(unset)'}, "
            f"torch.cuda.device_count()={torch.cuda.device_count()}, torch {torch.__version__} (CUDA "
            f"{torch.version.cuda or 'none: a CPU-only build'}). Check the job's GPU request (srun "
            "--gpus-per-node/--gres), the driver on the node (nvidia-smi) and the torch build."
        )
    index = device_index(identity.local_rank, visible)
    torch.cuda.set_device(index)
    gpu.update(index=index, visible=visible, cuda_visible_devices=env, uuid=_gpu_uuid(torch, index))
    return f"cuda:{index}"


def _init_process_group(backend: str, timeout_s: float, device: str) -> None:
    import torch.distributed as dist

    kwargs: dict[str, Any] = {"backend": backend, "timeout": _dt.timedelta(seconds=max(timeout_s, 30))}
    if device.startswith("cuda"):
        import torch

        kwargs["device_id"] = torch.device(device)
    dist.init_process_group(**kwargs)


def _teardown() -> None:
    if "torch" not in sys.modules:
        return  # a job that never imported torch (the DCGM diag) has no group to end: keep it torch-free
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()
        gc.collect()
    except Exception:  # teardown trouble must not turn a measured result into an error
        traceback.print_exc()


def _remove_deepspeed_shm(identity: RankIdentity) -> None:
    """DeepSpeed's CPU comm leaves a 66 MiB ``/dev/shm`` segment per rank per job; remove ours.

    The name is ``deepspeed_allreduce_buffer_<n>_<MASTER_ADDR>_<MASTER_PORT>_<local_rank>``. By
    teardown the workload is done, and unlinking a segment another process still maps is safe.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return
    for segment in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{addr}_{port}_{identity.local_rank}"):
        with contextlib.suppress(OSError):
            segment.unlink()


def _end_at_hard_deadline(job: dict[str, Any], log: Any) -> None:
    """Past the job's hard deadline (its timeout plus a grace), dump every thread's stack into
    the log and exit, even if nobody is left to kill this rank. faulthandler's timer is a C
    thread: it fires even while Python code cannot run (a collective holding the GIL)."""
    deadline = float(job.get("hard_deadline_s") or 0)
    if deadline <= 0:
        return
    when = time.strftime("%H:%M:%S", time.localtime(time.time() + deadline))
    print(f"gpucluster: this rank ends itself at {when} ({deadline:g} s from now) if it is still running")
    faulthandler.dump_traceback_later(deadline, exit=True, file=log)


def _write_final_record(result_path: Path, record: dict[str, Any]) -> bool:
    """Write the finished rank's record; False when its value is not JSON. The record is then
    written again as a TypeError without the value, so the parent still learns why the rank failed."""
    record["finished_at"] = time.time()
    try:
        write_json_atomic(result_path, record)
    except TypeError as exc:
        record.pop("value", None)
        record.update(status="error", error={"type": "TypeError", "message": str(exc), "traceback": ""})
        write_json_atomic(result_path, record)
        return False
    return True


def run(job_dir: Path) -> int:
    parent = os.getppid()
    # An agent that dies (killed, or its guard gone) takes its ranks with it.
    die_with_parent(signal.SIGKILL, expected_parent=parent)
    job = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8"))
    os.environ.update({str(k): str(v) for k, v in (job.get("env") or {}).items()})
    identity = RankIdentity.from_environ()
    identity.export()
    log = _redirect_output(rank_log_path(job_dir, identity.rank))
    faulthandler.enable(file=log, all_threads=True)
    # The parent sends SIGUSR1 to a hung rank before killing it, so its log shows where it hung.
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    timeout_s = float(job.get("timeout_s") or 0)
    _end_at_hard_deadline(job, log)

    result_path = rank_result_path(job_dir, identity.rank)
    record: dict[str, Any] = {
        "rank": identity.rank,
        "world_size": identity.world_size,
        "local_rank": identity.local_rank,
        "node_rank": identity.node_rank,
        "host": identity.host,
        "pid": os.getpid(),
        "status": "running",
        "started_at": time.time(),
    }
    write_json_atomic(result_path, record)
    backend = job.get("backend", "gloo")
    exit_code = 0
    gpu: dict[str, Any] = {}
    try:
        # A CPU quota on the ranks (testbed/cpu_quota.py), before torch starts its threads.
        if cgroup := join_rank_cgroup():
            record["cgroup"] = cgroup
        device = _pick_device(identity, backend, gpu) if job.get("pick_device", True) else "cpu"
        if gpu:
            record["gpu"] = gpu
            write_json_atomic(result_path, record)
        ctx = RankContext(
            **dataclasses.asdict(identity),
            device=device,
            backend=backend,
            job_dir=job_dir,
            options=dict(job.get("options") or {}),
        )
        workload = resolve_workload(job["workload"])
        if job.get("init_process_group", True) and identity.world_size >= 1:
            _init_process_group(backend, timeout_s or 1800, device)
        value = workload(ctx)
        record.update(status="ok", value=value if value is not None else {})
    except WorkloadSkip as skip:
        record.update(status="skipped", reason=str(skip))
    except BaseException as exc:  # every failure must reach the parent as data
        traceback.print_exc()
        record.update(
            status="error",
            error={
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            },
        )
        exit_code = 1
    if not _write_final_record(result_path, record):
        exit_code = 1
    _teardown()  # still under the hard deadline: a teardown that hangs ends there too
    _remove_deepspeed_shm(identity)
    sys.stdout.flush()
    sys.stderr.flush()
    log.flush()
    return exit_code


def main(argv: list[str] | None = None) -> None:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank")]
    if len(args) != 1:
        print("usage: python -m pytest_gpucluster.workloads._worker JOB_DIR", file=sys.stderr)
        os._exit(2)
    os._exit(run(Path(args[0]).resolve()))


if __name__ == "__main__":
    main()
