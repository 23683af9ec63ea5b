"""SLO search: the highest request rate whose joint SLO attainment stays at or above a target (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SearchResult:
    """`rate` is the highest probed rate that met the target (0.0 if none did); `probes` lists every
    (rate, attainment) measured, in order."""

    rate: float
    probes: list[tuple[float, float]] = field(default_factory=list)


def search_max_rate(
    attainment_at: Callable[[float], float],
    start: float,
    *,
    target: float = 0.9,
    growth: float = 2.0,
    rel_tol: float = 0.05,
    max_probes: int = 16,
    max_rate: float | None = None,
    min_rate: float | None = None,
) -> SearchResult:
    """Step from `start` by `growth` (up while the target holds, down while it does not) until the
    target is bracketed, then bisect until the bracket is within `rel_tol` of its upper end.
    Assumes attainment falls as the rate rises; each call to `attainment_at` is one benchmark run."""
    if start <= 0 or growth <= 1 or not 0 < rel_tol < 1:
        raise ValueError("need start > 0, growth > 1 and 0 < rel_tol < 1")
    min_rate = start / growth**8 if min_rate is None else min_rate
    probes: list[tuple[float, float]] = []

    def passes(rate: float) -> bool:
        attainment = attainment_at(rate)
        probes.append((rate, attainment))
        return attainment >= target

    good: float | None = None  # highest rate known to pass
    bad: float | None = None  # lowest rate known to fail
    rate = min(start, max_rate) if max_rate is not None else start
    # Bracket.
    while len(probes) < max_probes:
        if passes(rate):
            good = rate
            if bad is not None or (max_rate is not None and rate >= max_rate):
                break
            rate = rate * growth if max_rate is None else min(rate * growth, max_rate)
        else:
            bad = rate
            if good is not None:
                break
            rate /= growth
            if rate < min_rate:
                break
    # Bisect.
    while good is not None and bad is not None and len(probes) < max_probes:
        if (bad - good) <= rel_tol * bad:
            break
        mid = (good + bad) / 2
        if passes(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(rate=good or 0.0, probes=probes)
