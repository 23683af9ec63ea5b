"""Request shapes and arrival schedules (Poisson, length ranges, clamps): pure functions of a seeded RNG."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: when (seconds after the start), how many prompt tokens, how many to generate."""

    arrival_s: float
    input_len: int
    output_len: int


@dataclass(frozen=True)
class LengthRange:
    """A token count, fixed (lo == hi) or drawn uniformly from [lo, hi]."""

    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)


def parse_length(text: str) -> LengthRange:
    """'128' -> fixed 128; '64:256' or '64-256' -> uniform in [64, 256]."""
    text = text.strip()
    for sep in (":", "-"):
        if sep in text:
            lo_s, hi_s = text.split(sep, 1)
            lo, hi = int(lo_s), int(hi_s)
            break
    else:
        lo = hi = int(text)
    if lo < 1 or hi < lo:
        raise ValueError(f"bad length {text!r}: need 1 <= lo <= hi")
    return LengthRange(lo, hi)


def poisson_arrivals(rate: float, n: int, rng: random.Random) -> list[float]:
    """Arrival times of n requests from a Poisson process of `rate` req/s; the first arrives at 0.
    An infinite rate sends everything at once."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    times = [0.0]
    for _ in range(n - 1):
        times.append(times[-1] + rng.expovariate(rate))
    return times


def poisson_workload(
    rate: float, n: int, input_len: LengthRange, output_len: LengthRange, rng: random.Random
) -> list[RequestSpec]:
    """A synthetic workload: Poisson arrivals with lengths drawn from the given ranges."""
    return [RequestSpec(t, input_len.draw(rng), output_len.draw(rng)) for t in poisson_arrivals(rate, n, rng)]


def shape_workload(
    specs: Iterable[RequestSpec],
    *,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    max_input_len: int | None = None,
    max_output_len: int | None = None,
    duration_s: float | None = None,
) -> list[RequestSpec]:
    """Speed up (time_scale > 1), clamp lengths, keep the first max_requests and those arriving within
    duration_s. Arrivals are re-based so the first request goes at 0."""
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    ordered = sorted(specs, key=lambda s: s.arrival_s)
    if not ordered:
        return []
    t0 = ordered[0].arrival_s
    out: list[RequestSpec] = []
    for spec in ordered:
        if max_requests is not None and len(out) >= max_requests:
            break
        arrival = (spec.arrival_s - t0) / time_scale
        if duration_s is not None and arrival >= duration_s:
            break
        in_len = max(1, min(spec.input_len, max_input_len) if max_input_len else spec.input_len)
        out_len = max(1, min(spec.output_len, max_output_len) if max_output_len else spec.output_len)
        out.append(RequestSpec(arrival, in_len, out_len))
    return out
