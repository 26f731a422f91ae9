"""Sharing one node's devices between pytest-xdist workers.

Two rules make ``pytest acceptance/ -n 8`` safe on an 8-GPU node:

- **Single-device tests spread out**: worker ``gwK`` of N owns its own slice of the node's
  devices (`device_slice`), exported as ``CUDA_VISIBLE_DEVICES`` (`cuda_visible_devices`).
- **Multi-rank jobs run alone**: every `Cluster.run` under xdist holds `launch_lock`, an
  exclusive ``flock`` on a file keyed by the results directory, so two workers never start
  jobs that use all the devices at the same time. Single-device tests may hold the same lock
  shared (``exclusive=False``) so that a multi-rank job also waits for them, and they for it.

The lock is a readers-writer lock made of two flock files: a writer first takes the "turnstile"
and keeps it while it waits for the main lock, so new readers queue behind a waiting writer
instead of starving it. flock locks are released by the kernel when the holder dies, so a
crashed worker never leaves the others waiting. The lock files live in the system temp
directory, not in the results directory, which may be on NFS where flock is unreliable.

Outside xdist (``PYTEST_XDIST_WORKER`` unset) the lock does nothing. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from pytest_gpucluster.errors import LaunchError, SettingsError

__all__ = [
    "cuda_visible_devices",
    "device_slice",
    "launch_lock",
    "lock_path",
    "under_xdist",
    "worker_index",
]

WORKER_ENV = "PYTEST_XDIST_WORKER"
COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"


def under_xdist(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(WORKER_ENV))


def worker_index(worker_id: str | int) -> int:
    """``"gw3"`` (or ``3``) -> 3; ``"master"`` (xdist's name for no worker) -> 0."""
    if isinstance(worker_id, int) and not isinstance(worker_id, bool):
        index = worker_id
    elif isinstance(worker_id, str) and worker_id == "master":
        return 0
    elif isinstance(worker_id, str) and worker_id.startswith("gw") and worker_id[2:].isdigit():
        index = int(worker_id[2:])
    else:
        raise SettingsError(f"xdist worker id {worker_id!r} is not of the form 'gw<N>'")
    if index < 0:
        raise SettingsError(f"xdist worker index must not be negative, got {index}")
    return index


def device_slice(worker_id: str | int, n_workers: int, gpus_per_node: int) -> list[int]:
    """The device indices worker ``worker_id`` of ``n_workers`` owns on a ``gpus_per_node`` node.

    With at least as many devices as workers, each worker gets a contiguous block and the
    blocks differ in size by at most one (10 devices, 4 workers: 3, 3, 2, 2). With more workers
    than devices, workers share devices round-robin (worker K gets device K mod G): a slice
    cannot be owned alone then, but no device stays idle and none gets more than its share.
    """
    if n_workers < 1:
        raise SettingsError(f"the number of xdist workers must be at least 1, got {n_workers}")
    if gpus_per_node < 1:
        raise SettingsError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    index = worker_index(worker_id)
    if index >= n_workers:
        raise SettingsError(f"xdist worker gw{index} is out of range for {n_workers} worker(s)")
    if n_workers > gpus_per_node:
        return [index % gpus_per_node]
    base, extra = divmod(gpus_per_node, n_workers)
    start = index * base + min(index, extra)
    size = base + (1 if index < extra else 0)
    return list(range(start, start + size))


def cuda_visible_devices(
    worker_id: str | int, n_workers: int, gpus_per_node: int, inherited: str | None = None
) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the worker: its slice, mapped through an inherited list
    (``"4,5,6,7"`` or UUIDs) when the session was already restricted to some devices."""
    slice_ = device_slice(worker_id, n_workers, gpus_per_node)
    if inherited is None or not inherited.strip():
        return ",".join(str(i) for i in slice_)
    visible = [part.strip() for part in inherited.split(",") if part.strip()]
    if len(visible) < gpus_per_node:
        raise SettingsError(
            f"CUDA_VISIBLE_DEVICES={inherited!r} lists {len(visible)} device(s) but the profile "
            f"has {gpus_per_node} GPUs per node"
        )
    return ",".join(visible[i] for i in slice_)


def lock_path(key: str | os.PathLike[str], directory: str | None = None) -> Path:
    """The lock file for ``key`` (the results directory): the same for every worker of a run."""
    resolved = str(Path(os.fspath(key)).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return Path(directory or tempfile.gettempdir()) / f"pytest-gpucluster-{digest}.lock"


def _flock(fd: int, operation: int, path: Path, deadline: float | None) -> None:
    if deadline is None:
        fcntl.flock(fd, operation)
        return
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"waited too long for the device lock {path}: another pytest-xdist worker is "
                    "still running a job on this node's devices"
                ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def launch_lock(
    key: str | os.PathLike[str],
    *,
    exclusive: bool = True,
    timeout: float | None = None,
    force: bool = False,
    directory: str | None = None,
) -> Iterator[Path | None]:
    """Hold the node's device lock for ``key`` while the block runs (only under xdist).

    ``exclusive``: a multi-rank job (alone on the node); ``False``: a single-device test (many
    at once, never alongside a multi-rank job). ``timeout``: give up with `LaunchError` after
    that many seconds (None: wait as long as it takes). ``force``: lock outside xdist too.
    Yields the lock file's path, or None when no lock was taken.
    """
    if not (force or under_xdist()):
        yield None
        return
    main = lock_path(key, directory)
    turnstile = main.with_suffix(".turnstile")
    deadline = None if timeout is None else time.monotonic() + timeout
    main_fd = os.open(main, os.O_RDWR | os.O_CREAT, 0o666)
    gate_fd = os.open(turnstile, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        _flock(gate_fd, fcntl.LOCK_EX, turnstile, deadline)
        try:
            _flock(main_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, main, deadline)
        finally:
            fcntl.flock(gate_fd, fcntl.LOCK_UN)
        try:
            yield main
        finally:
            fcntl.flock(main_fd, fcntl.LOCK_UN)
    finally:
        os.close(gate_fd)
        os.close(main_fd)
