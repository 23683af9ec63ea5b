"""What a metric source would report over the last window, kept by the simulator as requests finish."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of nothing")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Completed:
    """Sliding windows of TTFT and TPOT samples (ms) and output lengths, by the time they were observed."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._ttft: deque[tuple[float, float]] = deque()
        self._tpot: deque[tuple[float, float]] = deque()
        self._outputs: deque[tuple[float, float]] = deque()

    def first_token(self, at_s: float, ttft_s: float) -> None:
        self._ttft.append((at_s, ttft_s * 1000))

    def finished(self, at_s: float, tpot_s: float | None, output_len: int) -> None:
        if tpot_s is not None:
            self._tpot.append((at_s, tpot_s * 1000))
        self._outputs.append((at_s, float(output_len)))

    def _recent(self, samples: deque[tuple[float, float]], now_s: float) -> list[float]:
        while samples and samples[0][0] < now_s - self.window_s:
            samples.popleft()
        return [v for t, v in samples if t <= now_s]

    def ttft(self, now_s: float, p: float) -> float | None:
        values = self._recent(self._ttft, now_s)
        return percentile(values, p) if values else None

    def tpot(self, now_s: float, p: float) -> float | None:
        values = self._recent(self._tpot, now_s)
        return percentile(values, p) if values else None

    def output_lengths(self, now_s: float) -> list[float]:
        return self._recent(self._outputs, now_s)
