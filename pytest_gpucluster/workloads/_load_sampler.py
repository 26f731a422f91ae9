"""A GPU's state sampled on a thread while it works, and what the samples say.

Read after a load, NVML describes an idle GPU: an idle GPU drops its PCIe link to Gen1, its clocks
and power to idle levels, and reports ``gpu_idle`` as its clock reason. The burn-in's health job
therefore samples during its matmul and memory load (:class:`LoadSampler`), and the parent judges
the extremes: the hottest reading, the highest power, the PCIe generation the link reached, every
clock reason seen and how often. Cumulative counters (NVML's violation times, energy) are read
before and after the load; :func:`counter_deltas` says how much each grew.

What one sample holds is the reader's business: a callable returning ``{field: number}`` and, for
``throttle_reasons``, a list of names. On a GPU that is ``_node_facts.nvml_sample_reader``; the
tests replay recorded values. Rank-side: standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["LoadSampler", "counter_deltas", "summarize_samples"]

Reader = Callable[[], Mapping[str, Any]]
REASONS_FIELD = "throttle_reasons"


SUSTAINED_FROM = 0.5
"""The sustained part of a load is its last half: a GPU's temperature and power climb for tens of
seconds to minutes before they settle, so the ceilings are judged where they have settled."""


def summarize_samples(
    samples: Sequence[Mapping[str, Any]],
    duration_s: float,
    interval_s: float,
    error: str | None = None,
    times: Sequence[float] = (),
) -> dict[str, Any]:
    """Per numeric field its min, max and mean over the samples; per clock reason the number of
    samples it was active in. ``error`` says why sampling stopped early (None: it did not).
    ``times`` (seconds from the load's start, one per sample): the same summary of the samples
    in the load's last half is added under ``sustained`` (with ``from_s``, where it starts)."""
    out = _summary(samples)
    out.update(interval_s=interval_s, duration_s=duration_s, error=error)
    if times and len(times) == len(samples):
        start = duration_s * SUSTAINED_FROM
        late = [s for s, t in zip(samples, times, strict=True) if t >= start]
        if late:
            out["sustained"] = {**_summary(late), "from_s": start}
    return out


def _summary(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    numbers: dict[str, list[float]] = {}
    reasons: dict[str, int] = {}
    for sample in samples:
        for name, value in sample.items():
            if name == REASONS_FIELD:
                for reason in value or ():
                    reasons[str(reason)] = reasons.get(str(reason), 0) + 1
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                numbers.setdefault(name, []).append(float(value))
    fields = {
        name: {"min": min(vals), "max": max(vals), "mean": sum(vals) / len(vals), "samples": len(vals)}
        for name, vals in numbers.items()
    }
    return {"samples": len(samples), "fields": fields, "reasons": reasons}


def counter_deltas(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """How much each cumulative counter grew between two readings (nested mappings kept nested);
    a counter missing or non-numeric in either reading is left out."""
    out: dict[str, Any] = {}
    for name, was in before.items():
        now = after.get(name)
        if isinstance(was, Mapping) and isinstance(now, Mapping):
            nested = counter_deltas(was, now)
            if nested:
                out[name] = nested
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (was, now)):
            out[name] = now - was
    return out


class LoadSampler:
    """Calls ``read`` every ``interval_s`` on a daemon thread from :meth:`start` to :meth:`stop`.

    The first sample is taken one interval after the start (not before the load begins). A load
    shorter than one interval still gets one sample, taken at :meth:`stop`. A reader that raises
    ends the sampling; the samples so far are kept and the error is in the summary.
    """

    def __init__(
        self, read: Reader, interval_s: float = 0.1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"a sampling interval must be positive, got {interval_s}")
        self._read, self._interval, self._clock = read, interval_s, clock
        self._samples: list[Mapping[str, Any]] = []
        self._times: list[float] = []
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-load-sampler", daemon=True)
        self._started = 0.0

    def _sample(self) -> bool:
        try:
            sample = dict(self._read())
            self._times.append(self._clock() - self._started)
            self._samples.append(sample)
        except Exception as exc:  # an NVML error must not cost the load's own measurements
            self._error = (
                f"sampling stopped after {len(self._samples)} sample(s): {type(exc).__name__}: {exc}"
            )
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self._sample():
                return

    def start(self) -> LoadSampler:
        self._started = self._clock()
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the summary of every sample (:func:`summarize_samples`)."""
        self._stop.set()
        self._thread.join()
        if not self._samples and self._error is None:
            self._sample()
        return summarize_samples(
            self._samples, self._clock() - self._started, self._interval, self._error, self._times
        )
