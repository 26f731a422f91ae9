"""How much memory the sweep's correctness check needs beyond its two buffers.

The sweep fills every rank's input from a deterministic pattern and, after the collective,
recomputes what each output element must be (nccl-tests ``-c``). Done over the whole buffer at
once, the int64 indices and float64 temporaries cost about 12x the buffer: at the 16 GiB
all_reduce size the 8-GPU profiles sweep, the job ran out of memory. `SweepData` now works in
fixed chunks. This measures the peak on the CPU — the same code as on CUDA, only the device
differs — as the growth of the process's peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` just before the fill) over the bytes of the two buffers:

    peak extra memory / buffer bytes ratio 0.03      (target <= 0.10)

For contrast it also measures the unchunked fill and check (chunk = whole buffer) at a smaller
size, which is what the sweep did before. Linux only (``/proc``).

    python benchmarks/check_memory.py [--size 1G] [--nranks 8] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_gpucluster.maths.sweep import DTYPE_SIZES, layout, parse_size  # noqa: E402
from pytest_gpucluster.workloads._sweep_data import SweepData  # noqa: E402


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _reset_peak() -> None:
    """Make VmHWM start again from the current resident set (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(size_bytes: int, nranks: int, dtype: str, chunk: int | None) -> tuple[float, int, int]:
    """(ratio, extra bytes, buffer bytes) for one all_reduce check of ``size_bytes`` per buffer."""
    elt = DTYPE_SIZES[dtype]
    lay = layout("all_reduce", size_bytes, elt, nranks)
    torch_dtype = getattr(torch, dtype)
    send = torch.empty(lay.count, dtype=torch_dtype)
    recv = torch.empty(lay.count, dtype=torch_dtype)
    send.fill_(0)  # touch every page, so both buffers are resident before the baseline
    recv.fill_(0)
    data = SweepData(torch, "cpu", "all_reduce", "sum", dtype, 0, nranks, root=0)
    if chunk is not None:
        data = SweepData(torch, "cpu", "all_reduce", "sum", dtype, 0, nranks, root=0, chunk=chunk)
    # The result every rank must hold, written chunk by chunk (not measured).
    step = 1 << 20
    for i in range(0, lay.count, step):
        n = min(step, lay.count - i)
        recv[i : i + n].copy_(data.reduced(i, n, 0))
    baseline_kib = _status_kib("VmRSS")
    _reset_peak()
    data.fill(send, src_rank=0, rep=0)  # what the sweep does before the timed span...
    wrong = data.count_wrong(recv, lay, rep=0)  # ...and after it
    peak_kib = _status_kib("VmHWM")
    if wrong:
        raise SystemExit(f"the check found {wrong} wrong elements in a correct buffer")
    buffers = send.numel() * elt + recv.numel() * elt
    extra = max(peak_kib - baseline_kib, 0) * 1024
    return extra / buffers, extra, buffers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="bytes per buffer (default 1G)")
    parser.add_argument("--nranks", type=int, default=8, help="ranks the expected reduction sums over")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--unchunked-size", default="64M", help="size for the unchunked contrast")
    args = parser.parse_args()
    size = parse_size(args.size)
    gib = 2**30
    ratio, extra, buffers = measure(size, args.nranks, args.dtype, chunk=None)
    print(
        f"chunked fill+check at {size / gib:g} GiB per buffer: {extra / 2**20:.0f} MiB over {buffers / gib:g} GiB"
    )
    small = parse_size(args.unchunked_size)
    old_ratio, old_extra, old_buffers = measure(small, args.nranks, args.dtype, chunk=1 << 62)
    print(
        f"unchunked (one piece, as before) at {small / 2**20:g} MiB per buffer: {old_extra / 2**20:.0f} MiB "
        f"over {old_buffers / 2**20:g} MiB, extra/buffer {old_ratio:.2f}"
    )
    print(f"peak extra memory / buffer bytes ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
