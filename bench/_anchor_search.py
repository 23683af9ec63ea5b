"""The arithmetic of the autoscaling comparison in Dynamo's replay: Pareto fronts, the cost of a family at an
attainment target, and the searches for the cheapest fixed pool (pure; the replays are passed in)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    family: str  # static (split `static:P,D` or `colocated:N`) | dynamo | hpa | tandem | auto
    setting: str
    gpu_hours: float
    attainment: float
    reversals_per_hour: float = 0.0
    ttft_p90_ms: float = 0.0
    tpot_p90_ms: float = 0.0
    shape_changes_per_hour: float = 0.0  # auto: colocated <-> split changes
    gpus_over_time: tuple[
        tuple[float, int], ...
    ] = ()  # a scaling policy's GPUs billed over a day (the day plot)


def pareto(points: Iterable[Point]) -> list[Point]:
    """Points no other point beats on both cost and attainment, cheapest first."""
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, -p.attainment)):
        if not front or p.attainment > front[-1].attainment:
            front.append(p)
    return front


def cost_at(points: Iterable[Point], target: float) -> tuple[float | None, str]:
    """GPU-hours a family needs for `target` attainment: its cheapest setting that reaches it, or linear
    interpolation on its Pareto front between the settings on either side; (None, why) if unreachable."""
    front = pareto(points)
    above = [p for p in front if p.attainment >= target]
    if not above:
        best = max((p.attainment for p in front), default=0.0)
        return None, f"unreachable (best {best:.1%})"
    first = above[0]
    below = [p for p in front if p.attainment < target and p.gpu_hours < first.gpu_hours]
    if not below:
        return first.gpu_hours, first.setting
    lo = below[-1]
    share = (target - lo.attainment) / (first.attainment - lo.attainment)
    return lo.gpu_hours + share * (
        first.gpu_hours - lo.gpu_hours
    ), f"between {lo.setting} and {first.setting}"


def staircase(
    evaluate: Callable[[int, int], float], target: float, max_gpus: int, hint: tuple[int, int] | None = None
) -> list[tuple[int, int, float]]:
    """Every (P, D, attainment) evaluated while walking the boundary of the pools that reach `target`: for P =
    1, 2, ... the fewest D that reaches it among the pools cheaper than the best found (a binary search below
    the last P's, since it never grows with P), until no larger P can be cheaper. Attainment grows with P and
    D. A `hint` (a pool believed to reach the target, e.g. from an earlier run) is evaluated first; if it
    reaches, only cheaper pools are walked, so the answer is the same with fewer evaluations."""
    seen: list[tuple[int, int, float]] = []

    def reaches(p: int, d: int) -> bool:
        att = evaluate(p, d)
        seen.append((p, d, att))
        return att >= target

    best, d_hi = max_gpus + 1, max_gpus - 1
    if hint and sum(hint) <= max_gpus and reaches(*hint):
        best = sum(hint)
    for p in range(1, max_gpus):
        if p + 1 >= best or min(d_hi, max_gpus - p) < 1:
            break  # every pool from here on costs at least the best one
        d_hi = min(d_hi, max_gpus - p, best - p - 1)  # only pools cheaper than the best found
        if not reaches(p, d_hi):
            continue  # more prefill needed at this many decode workers
        lo, hi = 1, d_hi  # the fewest D in [lo, hi] that reaches the target is hi or below
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if reaches(p, mid) else (mid + 1, hi)
        d_hi, best = hi, min(best, p + hi)
    return seen


def count_search(evaluate: Callable[[int], float], target: float, most: int) -> list[tuple[int, float]]:
    """Every (N, attainment) evaluated finding the fewest N <= `most` that reaches `target` (fixed colocated
    workers): doubling from 1 until one reaches it, then a binary search below. Attainment grows with N."""
    seen: list[tuple[int, float]] = []

    def reaches(n: int) -> bool:
        att = evaluate(n)
        seen.append((n, att))
        return att >= target

    lo, hi = 1, 1
    while not reaches(hi):
        if hi >= most:
            return seen
        lo, hi = hi + 1, min(2 * hi, most)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid + 1, hi)
    return seen


def box_search(
    evaluate: Callable[[int, int], float], target: float, p_max: int, d_max: int
) -> list[tuple[int, int, float]]:
    """Every (P, D, attainment) evaluated finding the cheapest pool with P <= p_max and D <= d_max that
    reaches `target`: along the box's shorter side, for each count the fewest of the other that reaches it (a
    binary search below the last count's, since it never grows), until no pool left in the box can be cheaper
    than the best found. Attainment grows with P and D. Used with a pool known to reach the target as the
    box's corner (the day's peak hour's), it costs a few evaluations where the open staircase costs one per
    P."""
    walk_decode = d_max < p_max  # the outer loop runs over the shorter side

    def reaches(outer: int, inner: int) -> bool:
        p, d = (inner, outer) if walk_decode else (outer, inner)
        att = evaluate(p, d)
        seen.append((p, d, att))
        return att >= target

    seen: list[tuple[int, int, float]] = []
    outer_max, hi = (d_max, p_max) if walk_decode else (p_max, d_max)
    best = outer_max + hi + 1
    for outer in range(1, outer_max + 1):
        hi = min(hi, best - outer - 1)  # only pools cheaper than the best found
        if hi < 1:
            break
        if not reaches(outer, hi):
            continue
        lo = 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if reaches(outer, mid) else (mid + 1, hi)
        best = min(best, outer + hi)
    return seen
