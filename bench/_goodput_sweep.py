"""The goodput sweep's arithmetic (pure): SLO attainment of recorded probes at any SLO scale, goodput from a
grid of probed rates, and the spread over repeats.

Every probe's per-request latencies are kept, so one set of runs answers every SLO scale: the SLO moves,
the measurements do not. Goodput at an SLO is the rate where the attainment curve (over the probed rates,
in increasing order) first falls below the target, interpolated linearly between the last rate that met it
and the first that did not. Where even the lowest probed rate misses, goodput is below the grid (reported
as 0 with bound "<"); where every rate meets it, it is at least the top rate (bound ">=").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.loadgen.report import meets_slo, percentile
from tandem.slo import Slo


@dataclass(frozen=True)
class Latency:
    """What the sweep keeps of one request."""

    ok: bool
    ttft_s: float | None
    tpot_s: float | None
    input_len: int


@dataclass(frozen=True)
class Probe:
    """One mode's requests at one rate in one repeat."""

    mode: str
    repeat: int
    rate: float
    requests: tuple[Latency, ...]


@dataclass(frozen=True)
class Goodput:
    rate: float
    bound: str = ""  # "" interpolated inside the grid; "<" below its lowest rate; ">=" at least its top rate

    def __str__(self) -> str:
        return f"{self.bound}{self.rate:.2f}"


def attainment(requests: Sequence[Latency], slo: Slo) -> float:
    """Fraction of the requests sent (failures are misses) that met both SLOs."""
    if not requests:
        return 0.0
    good = sum(meets_slo(r.ok, r.ttft_s, r.tpot_s, slo.ttft_s, slo.tpot_s) for r in requests)
    return good / len(requests)


def goodput(points: Sequence[tuple[float, float]], target: float) -> Goodput:
    """From (rate, attainment) points: where attainment first drops below `target` as the rate grows."""
    ordered = sorted(points)
    if not ordered:
        raise ValueError("no probes")
    if ordered[0][1] < target:
        return Goodput(0.0, "<")
    for (r0, a0), (r1, a1) in zip(ordered, ordered[1:], strict=False):
        if a1 < target:
            return Goodput(r0 + (r1 - r0) * (a0 - target) / (a0 - a1))
    return Goodput(ordered[-1][0], ">=")


def goodput_per_repeat(probes: Sequence[Probe], mode: str, slo: Slo, target: float) -> list[Goodput]:
    """One goodput per repeat of `mode`'s rate grid, in repeat order."""
    repeats = sorted({p.repeat for p in probes if p.mode == mode})
    return [
        goodput(
            [(p.rate, attainment(p.requests, slo)) for p in probes if p.mode == mode and p.repeat == k],
            target,
        )
        for k in repeats
    ]


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f} [{self.low:.2f}-{self.high:.2f}]"


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values))


def ratios(numerator: Sequence[Goodput], denominator: Sequence[Goodput]) -> list[float]:
    """Repeat-by-repeat goodput ratios (the repeats ran side by side); a zero denominator is skipped."""
    return [n.rate / d.rate for n, d in zip(numerator, denominator, strict=True) if d.rate > 0]


def short_prompt_ttft_p90(
    probes: Sequence[Probe], mode: str, rate: float, max_input_len: int
) -> float | None:
    """TTFT p90 (seconds) of the completed requests of at most `max_input_len` prompt tokens, pooled over
    the repeats of `mode` at `rate`."""
    ttfts = [
        r.ttft_s
        for p in probes
        if p.mode == mode and p.rate == rate
        for r in p.requests
        if r.ok and r.ttft_s is not None and r.input_len <= max_input_len
    ]
    return percentile(ttfts, 90)
