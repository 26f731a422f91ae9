"""Die with the parent: ``prctl(PR_SET_PDEATHSIG)`` through ctypes (Linux only).

A rank calls `die_with_parent` on itself when it starts, and the guard
(`pytest_gpucluster.launch.guard`) sets it in the agent it starts, so that when a process of
a job loses its parent, the kernel ends it at once, whatever the process is busy with (the
signal needs no Python code to run, so a rank stuck in a collective holding the GIL dies too).

The kernel sends the signal when the *thread* that forked the process exits, not the whole
parent. Every launcher used here (torchrun, srun's slurmstepd, mpirun, the DeepSpeed launcher)
forks its ranks from a thread that lives as long as it does.

Standard library only: this runs inside ranks and inside the guard.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent"]

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""

_libc: ctypes.CDLL | None = None


def _prctl() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return getattr(_libc, "prctl", None)


def die_with_parent(sig: int = signal.SIGKILL, *, expected_parent: int | None = None) -> str | None:
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    Returns None when it is in place, else why not (not Linux, no prctl, the call failed).
    ``expected_parent``: the parent pid seen before the call; if the parent is already another
    process (it died in between and this one was reparented), ``sig`` is sent to this process
    right away, as the kernel would have.

    Safe to call between fork and exec (``preexec_fn``): it allocates nothing once the C library
    is loaded, which the first call in the parent does.
    """
    prctl = _prctl()
    if prctl is None:
        return f"PR_SET_PDEATHSIG is Linux-only (this is {sys.platform})"
    if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        return f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}"
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return None


# Load the C library now, in the parent, so that a preexec_fn call after fork does no loading.
_prctl()
