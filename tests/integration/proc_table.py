"""The process table, read directly from /proc (never through the code under test)."""

from __future__ import annotations

import os
import time


def job_pids(job_id: str) -> list[int]:
    """Live processes whose environment holds ``GPUCLUSTER_JOB_ID=<job_id>`` (read from /proc)."""
    needle = f"GPUCLUSTER_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(entry))
    return sorted(found)


def wait_until_gone(job_id: str, seconds: float) -> list[int]:
    """Poll the process table until no process of ``job_id`` is left; returns what is left."""
    end = time.monotonic() + seconds
    while (left := job_pids(job_id)) and time.monotonic() < end:
        time.sleep(0.1)
    return left
