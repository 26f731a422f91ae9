"""Keeps one core of a VM busy at the lowest priority there is, so it never halts.

``python keep_awake.py CORE PARENT_PID``: pinned to ``CORE``, ``SCHED_IDLE``, spinning until
``PARENT_PID`` is gone (checked every ~10 ms) or it is killed.

Why: on a KVM/Firecracker guest an idle vCPU halts, and the host takes tens to hundreds of
microseconds to run it again when a wake-up arrives. A gloo collective wakes its peer thousands
of times, so its speed depends on how long the host's adaptive halt-polling window has grown:
the first seconds of every job ran 20-35% slower than the rest (all_reduce 16 MiB 1.6-2.2
GB/s, then 2.5). With a spinner on each core the vCPU never halts; a rank (SCHED_FIFO) or any
ordinary process preempts the spinner at once, so it takes no time from them, only the halt.
On bare metal the same condition is ``cpupower idle-set -D 0``; this script needs no root for
SCHED_IDLE but is started by the benchmarks only together with the pinned ranks.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    core, parent = int(sys.argv[1]), int(sys.argv[2])
    os.sched_setaffinity(0, {core})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    next_check = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= next_check:
            if os.getppid() != parent:
                os._exit(0)
            next_check = now + 0.01


if __name__ == "__main__":
    main()
