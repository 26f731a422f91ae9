"""The statistics every side-by-side benchmark shares: paired ratios, their median, and a
distribution-free confidence interval for that median.

Why the median of paired ratios: each round runs the harness and the reference back to back
(the order alternating), so the ratio of one round cancels what drifted between rounds — the
load of a shared machine, clock boosts, a warmer page cache. The median of those ratios does
not let one disturbed round move the verdict.

Why order statistics for the interval (and not a bootstrap): the rounds are independent and the
ratio is a continuous quantity, and nothing else is assumed — not normality, not symmetry. The
number of ratios below the true median is then Binomial(n, 1/2), so the interval between the
k-th smallest and the k-th largest ratio covers the median with probability
``1 - 2 * P(Binomial(n, 1/2) < k)``; we take the largest k that keeps this at or above the
confidence asked for. It is exact (conservative by the binomial's discreteness), needs no
random numbers, and with few rounds — the case that matters on a GPU, where a benchmark should
stop after a handful — it is honest, where a bootstrap of the median is known to cover too
little. Its price: no interval at all below 6 rounds at 95% (``1 - 2/2**5 < 0.95``).

Pure standard library; imports nothing from ``pytest_gpucluster``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MedianCI",
    "ci_line",
    "median_ci",
    "order_statistic_ranks",
    "paired_ratios",
    "ratio_line",
]


def _binomial_half_cdf(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k), exactly (integer arithmetic, then one division)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


def order_statistic_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """1-based ranks ``(k, n + 1 - k)`` of the sorted sample bounding the median with at least
    ``confidence``, or None when ``n`` is too small for any such pair."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    if n < 1:
        return None
    alpha_half = (1.0 - confidence) / 2.0
    k = 0
    # Largest k with P(X <= k - 1) <= alpha/2, i.e. P(the median lies below the k-th value) small.
    while k + 1 <= (n + 1) // 2 and _binomial_half_cdf(k, n) <= alpha_half:
        k += 1
    return (k, n + 1 - k) if k >= 1 else None


@dataclass(frozen=True, slots=True)
class MedianCI:
    """A sample's median and the order-statistic confidence interval around it."""

    median: float
    lo: float | None
    """None when there are too few values for an interval at this confidence."""
    hi: float | None
    n: int
    confidence: float
    coverage: float | None
    """The interval's exact coverage (at least ``confidence``)."""

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def relative_half_width(self) -> float:
        """The larger of the two distances from the median to a bound, as a fraction of the
        median (0.02 means "within +-2%"); infinite without an interval."""
        if self.lo is None or self.hi is None or self.median == 0:
            return math.inf
        return max(self.hi - self.median, self.median - self.lo) / abs(self.median)

    def within(self, tolerance: float) -> bool:
        """True when both bounds lie within ``tolerance`` (a fraction) of the median."""
        return self.relative_half_width <= tolerance


def median_ci(values: Sequence[float], confidence: float = 0.95) -> MedianCI:
    """The median of ``values`` and its distribution-free confidence interval."""
    if not values:
        raise ValueError("no values: a median needs at least one")
    clean = [float(v) for v in values]
    bad = [v for v in clean if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{len(bad)} of {len(clean)} values are not finite (first {bad[0]!r})")
    ordered = sorted(clean)
    ranks = order_statistic_ranks(len(ordered), confidence)
    middle = statistics.median(ordered)
    if ranks is None:
        return MedianCI(middle, None, None, len(ordered), confidence, None)
    k, upper = ranks
    coverage = 1.0 - 2.0 * _binomial_half_cdf(k - 1, len(ordered))
    return MedianCI(middle, ordered[k - 1], ordered[upper - 1], len(ordered), confidence, coverage)


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """``numerators[i] / denominators[i]`` for each round; the two must pair up one to one."""
    if len(numerators) != len(denominators):
        raise ValueError(
            f"cannot pair {len(numerators)} values with {len(denominators)}: every round measures both sides"
        )
    zero = [i for i, d in enumerate(denominators) if d == 0]
    if zero:
        raise ValueError(f"round {zero[0] + 1} measured 0 on the reference side: no ratio")
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


def ratio_line(label: str, ci: MedianCI) -> str:
    """The verdict line: the word ``ratio`` and, last on the line, the median paired ratio.

    The project's convention is that a benchmark's ratio is the last number on a line holding
    the word ``ratio``; the interval gets a line of its own (:func:`ci_line`) so that no other
    number trails it.
    """
    return (
        f"{label} (median of {ci.n} paired rounds; {_percent(ci.confidence)} CI below) ratio {ci.median:.3f}"
    )


def ci_line(ci: MedianCI, tolerance: float) -> str:
    """``  95% CI 0.981-1.012 (-1.5% +1.6%, 24 rounds): within +-2%`` or why there is none."""
    level = _percent(ci.confidence)
    if ci.lo is None or ci.hi is None:
        return (
            f"  {level} CI: none yet ({ci.n} rounds; an order-statistic interval at {level} needs"
            f" at least {_min_rounds(ci.confidence)})"
        )
    down = (ci.lo / ci.median - 1.0) * 100 if ci.median else math.nan
    up = (ci.hi / ci.median - 1.0) * 100 if ci.median else math.nan
    verdict = "within" if ci.within(tolerance) else "NOT within"
    return (
        f"  {level} CI {ci.lo:.3f}-{ci.hi:.3f} ({down:+.1f}% {up:+.1f}%, {ci.n} rounds):"
        f" {verdict} +-{tolerance * 100:g}% of the median"
    )


def _percent(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def _min_rounds(confidence: float) -> int:
    n = 1
    while order_statistic_ranks(n, confidence) is None:
        n += 1
    return n
