"""The capacity model of colocated workers: TTFT and TPOT when each worker serves both phases, and the N it
needs.

A colocated worker runs chunked prefill: every step carries its running batch's decode work plus a share
of the prompts waiting. Per replica, prompts arrive at `rate/N` and each costs `prefill_ms(prompt)` of
step time, so a share `u = rate/N x prefill_ms(prompt_mean)` of every step is prefill work, spread evenly
over the steps: a step lasts `decode_step(b) / (1 - u)`, and TPOT is that step at the batch Little's law
gives (`b = rate/N x output x TPOT`, capacity.decode_tpot_ms with the step stretched). TTFT is the prefill
queue of capacity.prefill_ttft_ms on the N replicas, plus the decode step that each chunk of the prompt
rides with. `u >= 1` means the worker cannot keep up. Built on the split model's own functions, from the
profile's prefill and decode rows; no second model.

That stretch is the mean. A generation's own TPOT depends on how many prompts land in its worker's steps
while it decodes (a Poisson count at `rate/N` over its decode time, and the one in progress as it joins,
with the prefill share's probability), each adding the prompt's prefill time
spread over the generation's tokens. The need sizes TPOT at the SLO percentile of that count: with short
generations and long prompts (one prompt landing adds several ms to a 13-token answer's TPOT) the
percentile is far above the mean, and it is what a tight TPOT SLO is judged on. The need sizes the larger of
the two, each landing prompt at the percentile's length.
"""

from __future__ import annotations

import math

from tandem.operator.autoscale.core.capacity import (
    MAX_REPLICAS_SEARCHED,
    DecodeLoad,
    Need,
    PrefillLoad,
    decode_tpot_ms,
    prefill_ttft_ms,
)
from tandem.profile import Profile
from tandem.slo import Slo


def prefill_share(profile: Profile, replicas: int, load: PrefillLoad) -> float:
    """The share of a colocated worker's step time that goes to prefill (`u`); inf with no replica."""
    if load.rate_rps <= 0:
        return 0.0
    if replicas <= 0:
        return math.inf
    uncached = 1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0)
    return load.rate_rps / replicas * profile.prefill_ms(load.prompt_tokens_mean * uncached) / 1000


def colocated_tpot_ms(profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad) -> float:
    """TPOT on `replicas` colocated workers: the decode step at Little's batch, stretched by 1/(1 - u)."""
    u = prefill_share(profile, replicas, prefill)
    if u >= 1:
        return math.inf
    return decode_tpot_ms(profile, replicas, decode, stretch=1 / (1 - u))


def colocated_tpot_at_ms(
    profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad, percentile: float
) -> float:
    """TPOT at `percentile` on `replicas` colocated workers: the decode step at the mean's batch, plus the
    prefill time of the prompts that land in a generation's steps (their count at `percentile` of a Poisson
    count: those arriving over its decode time and the one in progress as it joins, each a prompt at the
    percentile's length), spread over its tokens; never
    below the mean's TPOT, so it sizes no fewer workers than the mean alone."""
    mean = colocated_tpot_ms(profile, replicas, prefill, decode)
    if math.isinf(mean) or prefill.rate_rps <= 0:
        return mean
    u = prefill_share(profile, replicas, prefill)
    step = mean * (1 - u)  # the decode step without prefill in it
    tokens = max(decode.output_tokens_mean - 1, 1.0)
    uncached = 1.0 - min(max(prefill.prefix_hit_rate, 0.0), 1.0)
    per_prompt = profile.prefill_ms(prefill.prompt_tokens_p * uncached) / tokens
    if prefill.rate_rps / replicas * tokens * per_prompt / 1000 >= 1:
        return math.inf  # each prompt landing lengthens the generation enough for another: no fixed point
    tpot, landing = mean, -1
    for _ in range(MAX_LANDING_ROUNDS):  # a generation lasts its tokens at its own TPOT: to the fixed point
        # the prompts arriving while it decodes, and the one in progress when it joins (the prefill share)
        now = poisson_quantile(prefill.rate_rps / replicas * tokens * tpot / 1000 + u, percentile)
        if now == landing:
            break
        landing, tpot = now, step + now * per_prompt
    return max(mean, tpot)


MAX_LANDING_ROUNDS = 50


def poisson_quantile(mean: float, percentile: float) -> int:
    """The smallest k with P(K <= k) >= percentile/100 for K ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    target, total, k = percentile / 100, 0.0, 0
    while True:
        total += math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
        if total >= target or k > mean + 50 * math.sqrt(mean) + 50:
            return k
        k += 1


def colocated_ttft_ms(
    profile: Profile, replicas: int, prefill: PrefillLoad, decode: DecodeLoad, percentile: float
) -> float:
    """TTFT at `percentile` on `replicas` colocated workers: the prefill queue plus a decode step per
    chunk."""
    tpot = colocated_tpot_ms(profile, replicas, prefill, decode)
    if math.isinf(tpot):
        return math.inf
    chunks = max(1, math.ceil(prefill.prompt_tokens_p / profile.prefill_chunk_tokens))
    batch = decode.rate_rps / max(replicas, 1) * decode.output_tokens_mean * tpot / 1000
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
    load = prefill_share(profile, 1, prefill)
    if floor_tpot > tpot_target or floor_ttft > ttft_target:
        return Need(MAX_REPLICAS_SEARCHED, load, math.inf)
    for n in range(max(1, math.floor(load)), MAX_REPLICAS_SEARCHED):
        tpot = colocated_tpot_at_ms(profile, n, prefill, decode, slo.percentile)
        if (
            tpot <= tpot_target
            and colocated_ttft_ms(profile, n, prefill, decode, slo.percentile) <= ttft_target
        ):
            return Need(n, load, tpot)
    return Need(MAX_REPLICAS_SEARCHED, load, math.inf)
