#!/usr/bin/env python
"""The launch reference: N ranks join a gloo process group and leave it, nothing else.

An independent reference for ``benchmarks/launch_overhead.py``, importing nothing from
pytest_gpucluster and started by plain torchrun as its own job::

    torchrun --standalone --nproc-per-node=2 benchmarks/reference/noop_job.py

It does what the harness's ``workloads.basic:noop`` job does on a rank — import torch, join
the group, leave it — and ends the way the harness's worker ends: process group destroyed,
output flushed, ``os._exit``. The worker cannot end otherwise (a gloo thread racing Python's
finalization aborts about one job in six, pytorch/pytorch#190489); a reference that ran the
interpreter's normal shutdown instead would time a longer exit the harness never pays, and make
the harness look faster than plain torchrun (issue 21 measured 0.81-0.84 that way).
"""

from __future__ import annotations

import gc
import os
import sys

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    dist.destroy_process_group()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
