"""Timed spans of a rank-side measurement: ``iters`` calls per span, ``repeat`` spans, after one
untimed call, with an optional injected delay per call (a synthetic straggler). Used by the
health job's CPU and GPU parts. Standard library only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["timed_median", "timed_spans"]


def timed_spans(
    run: Callable[[], None], iters: int, repeat: int, sync: Callable[[], None], delay: float
) -> list[float]:
    """Seconds per call in each of ``repeat`` spans of ``iters`` calls (after one untimed call)."""
    run()
    sync()
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(iters):
            if delay:
                time.sleep(delay)
            run()
        sync()
        out.append((time.perf_counter() - start) / iters)
    return out


def timed_median(
    run: Callable[[], None], iters: int, repeat: int, sync: Callable[[], None], delay: float
) -> float:
    """Median seconds per call over the spans."""
    return statistics.median(timed_spans(run, iters, repeat, sync, delay))
