"""The capacity model of colocated workers: TTFT and TPOT when each worker serves both phases, and the N it
needs.

A colocated worker runs chunked prefill: every step carries its running batch's decode work plus a share of
the prompts waiting. Per replica, prompts arrive at `rate/N`; alone each costs `prefill_ms(prompt)` of step
time, and the prompts that arrive during a step share the next one's fixed cost (prefill_share, as capacity.py
batches them), so a share `u` (`rate/N x prefill_ms(prompt_mean)` with less than one prompt a step) of every
step is prefill work, spread evenly over the steps: a step lasts `decode_step(b) / (1 - u)`, and TPOT is that
step at the batch Little's law gives (`b = rate/N x output x TPOT`, capacity.decode_tpot_ms with the step
stretched). TTFT is the prefill queue of capacity.prefill_ttft_ms on the N replicas, plus the decode step that
each chunk of the prompt rides with. `u >= 1` means the worker cannot keep up. Built on the split model's own
functions, from the profile's prefill and decode rows; no second model.

That stretch is the mean (colocated_step_ms). A request's own TPOT depends on the prompts that land in its
worker's steps while it decodes: a Poisson count at `rate/N` over its prefill and its steps, each prompt's
prefill time drawn from a Weibull through the prompts' mean and p90 lengths, shared over the request's own
output (geometric lengths at evenly spaced quantiles); a prompt that waits finds a backlog (M/G/c, Erlang C)
that drains in full chunks. colocated_tpot_ms is that TPOT at the SLO percentile over requests: with short
outputs and long prompts (one prompt landing adds several ms to a 13-token answer's TPOT) it is far above the
mean, and it is what a tight TPOT SLO is judged on.
"""

from __future__ import annotations

import bisect
import math

from tandem.operator.autoscale.core.capacity import (
    MAX_REPLICAS_SEARCHED,
    DecodeLoad,
    Need,
    PrefillLoad,
    decode_tpot_ms,
    erlang_c,
    prefill_full_step,
    prefill_ttft_ms,
)
from tandem.profile import Profile
from tandem.slo import Slo


def prefill_share(profile: Profile, replicas: int, load: PrefillLoad, decode_step_ms: float = 0.0) -> float:
    """The share of a colocated worker's step time that goes to prefill (`u`); inf with no replica, or when
    full chunks of prompts do not keep up.

    The prompts that arrive during a step share the next one's prefill, as in capacity.py: a step of decode
    part `decode_step_ms` carries b = rate/N x (decode_step_ms + S(b m)) prompts (at least 1, at most a
    chunk), each costing S(b m) / b. With less than one prompt a step, each pays its own `S(m)`."""
    if load.rate_rps <= 0:
        return 0.0
    if replicas <= 0:
        return math.inf
    uncached = 1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0)
    mean = load.prompt_tokens_mean * uncached
    per_ms = load.rate_rps / replicas / 1000
    most, _ = prefill_full_step(profile, mean)

    def excess(b: float) -> float:
        return per_ms * (decode_step_ms + profile.prefill_ms(b * mean)) - b

    if excess(most) >= 0 and most > 1:
        return math.inf
    batch = 1.0
    if excess(1.0) > 0 and most > 1:
        lo, hi = 1.0, most
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
        batch = hi
    return per_ms * profile.prefill_ms(batch * mean) / batch


def colocated_step_ms(profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad) -> float:
    """The mean step on `replicas` colocated workers: the decode step at Little's batch, stretched by 1/(1 -
    u)."""
    u = prefill_share(profile, replicas, prefill, profile.decode_step_ms(1, decode.context_tokens))
    if u >= 1:
        return math.inf
    return decode_tpot_ms(profile, replicas, decode, stretch=1 / (1 - u))


def colocated_tpot_ms(
    profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad, percentile: float = 90.0
) -> float:
    """TPOT at `percentile` over requests on `replicas` colocated workers: the plain decode step plus the
    prompts that land in a request's own steps, shared over its output (a short output that meets one long
    prompt pays most of its prefill per token)."""
    step = colocated_step_ms(profile, replicas, prefill, decode)
    if math.isinf(step):
        return math.inf
    u = prefill_share(profile, replicas, prefill, profile.decode_step_ms(1, decode.context_tokens))
    plain = step * (1 - u)  # the decode step at the batch, without prompts
    if prefill.rate_rps <= 0:
        return plain
    costs = _prompt_costs(profile, prefill)
    arrivals_per_ms = prefill.rate_rps / replicas / 1000
    steps = _decode_steps(decode.output_tokens_mean)
    tail = 1 - percentile / 100

    # a prompt that waits finds a backlog: the steps until it drains carry full chunks of queued prompts
    mean_cost = sum(costs) / len(costs)
    scv = sum((c - mean_cost) ** 2 for c in costs) / len(costs) / mean_cost**2
    offered = prefill.rate_rps * mean_cost / 1000
    if offered >= replicas:
        return math.inf
    waits = erlang_c(replicas, offered)
    backlog_ms = mean_cost / (replicas - offered) * (1 + scv) / 2  # the mean wait of one that waits (M/G/c)
    chunk_ms = profile.prefill_ms(profile.prefill_chunk_tokens)

    def missed(tpot: float) -> float:
        def one(k: float) -> float:
            own = arrivals_per_ms * (
                k * step + mean_cost
            )  # prompts arriving during its own prefill and its steps
            backlog = min(backlog_ms, k * chunk_ms) / k
            return waits * (plain + backlog > tpot) + (1 - waits) * _exceeds(
                own, (tpot - plain) * k, costs, u
            )

        return sum(one(k) for k in steps) / len(steps)

    lo, hi = plain, plain + costs[-1] * 4 + step
    if missed(lo) <= tail:
        return lo
    while missed(hi) > tail:
        lo, hi = hi, hi * 2
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if missed(mid) <= tail else (mid, hi)
    return hi


_QUANTILES = 24  # points that stand for a distribution of prompt costs or of output lengths


def _prompt_costs(profile: Profile, prefill: PrefillLoad) -> list[float]:
    """The prefill time of prompts at evenly spaced quantiles (sorted): a Weibull through the mean and the
    percentile length (shape < 1 for heavy tails, about 2 for narrow ones)."""
    uncached = 1.0 - min(max(prefill.prefix_hit_rate, 0.0), 1.0)
    mean, p90 = (
        prefill.prompt_tokens_mean * uncached,
        max(prefill.prompt_tokens_p * uncached, prefill.prompt_tokens_mean * uncached),
    )
    ratio = p90 / mean if mean > 0 else 1.0
    lo, hi = 0.3, 20.0  # Weibull shape: p90 / mean = ln(10)^(1/k) / Gamma(1 + 1/k) falls as k grows
    for _ in range(40):
        k = (lo + hi) / 2
        lo, hi = (k, hi) if math.log(10) ** (1 / k) / math.gamma(1 + 1 / k) > ratio else (lo, k)
    k = (lo + hi) / 2
    scale = mean / math.gamma(1 + 1 / k) if mean > 0 else 0.0
    qs = ((i + 0.5) / _QUANTILES for i in range(_QUANTILES))
    return sorted(profile.prefill_ms(scale * (-math.log(1 - q)) ** (1 / k)) for q in qs)


def _decode_steps(output_mean: float) -> list[float]:
    """Decode steps per request (output - 1, at least 1) at evenly spaced quantiles of a geometric length."""
    mean = max(output_mean - 1, 1.0)
    return [max(1.0, math.ceil(-mean * math.log(1 - (i + 0.5) / _QUANTILES))) for i in range(_QUANTILES)]


def _exceeds(expected: float, budget: float, costs: list[float], share: float) -> float:
    """P(the prompts landing in a request's steps cost more than `budget` ms): a Poisson count with mean
    `expected`, each prompt's cost drawn from `costs`; many prompts by the normal approximation, whose spread
    grows by 1/(1 - share) because prompts arriving during a prefill step stretch the life that collects
    them."""
    if budget < 0:
        return 1.0
    n = len(costs)
    mean = sum(costs) / n
    if expected > 12:
        var = expected * sum(c * c for c in costs) / n / (1 - share) ** 2
        return 0.5 * math.erfc((budget - expected * mean) / math.sqrt(2 * var))
    total, pmf, m = 0.0, math.exp(-expected), 0
    spread = math.sqrt(sum((c - mean) ** 2 for c in costs) / n)
    while m < 40:
        m += 1
        pmf *= expected / m
        if pmf < 1e-6 and m > expected:
            break
        # m prompts: their mean cost plus sqrt(m) x one prompt's deviation
        threshold = mean + (budget - m * mean) / math.sqrt(m) if m > 1 else budget
        over = (
            n - bisect.bisect_right(costs, threshold)
            if spread > 0 or m == 1
            else (n if m * mean > budget else 0)
        )
        total += pmf * over / n
    return total


def colocated_ttft_ms(
    profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad, percentile: float
) -> float:
    """TTFT at `percentile` on `replicas` colocated workers: the prefill queue plus a decode step per
    chunk."""
    step = colocated_step_ms(profile, replicas, prefill, decode)
    if math.isinf(step):
        return math.inf
    chunks = max(1, math.ceil(prefill.prompt_tokens_p / profile.prefill_chunk_tokens))
    batch = decode.rate_rps / max(replicas, 1) * decode.output_tokens_mean * step / 1000
    return prefill_ttft_ms(profile, replicas, prefill, percentile) + chunks * profile.decode_step_ms(
        batch, decode.context_tokens
    )


def colocated_need(
    profile: Profile, prefill: PrefillLoad, decode: DecodeLoad, slo: Slo, target_share: float
) -> Need:
    """The fewest colocated workers whose TTFT and TPOT (at the SLO percentile) both stay within
    `target_share` of the SLO (at least 1).

    `latency_ms` is the predicted TPOT at that count; MAX_REPLICAS_SEARCHED with inf when no count meets it
    (an idle worker's own step or prompt already misses)."""
    ttft_target, tpot_target = slo.ttft_ms * target_share, slo.tpot_ms * target_share
    ctx = decode.context_tokens
    chunks = max(1, math.ceil(prefill.prompt_tokens_p / profile.prefill_chunk_tokens))
    uncached = 1.0 - min(max(prefill.prefix_hit_rate, 0.0), 1.0)
    floor_tpot = profile.decode_step_ms(1, ctx)
    floor_ttft = profile.prefill_ms(prefill.prompt_tokens_p * uncached) + chunks * floor_tpot
    most, full_ms = prefill_full_step(profile, prefill.prompt_tokens_mean * uncached)
    load = prefill.rate_rps * full_ms / most / 1000  # workers whose steps are all full chunks of prompts
    if floor_tpot > tpot_target or floor_ttft > ttft_target:
        return Need(MAX_REPLICAS_SEARCHED, load, math.inf)
    for n in range(max(1, math.floor(load)), MAX_REPLICAS_SEARCHED):
        tpot = colocated_tpot_ms(profile, n, prefill, decode, slo.percentile)
        if (
            tpot <= tpot_target
            and colocated_ttft_ms(profile, n, prefill, decode, slo.percentile) <= ttft_target
        ):
            return Need(n, load, tpot)
    return Need(MAX_REPLICAS_SEARCHED, load, math.inf)
