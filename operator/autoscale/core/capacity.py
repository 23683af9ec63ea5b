"""The capacity model: from a profile, the TTFT and TPOT a pool of N replicas gives at a load, and the N it
needs.

Prefill is a queue served in batched steps, as the engine (and the simulator) runs it: a replica's step takes
every prompt waiting while their tokens fit the profile's chunk `K` (`prefill_chunk_tokens`; the first prompt
always), and lasts `S(tokens)`, the profile's prefill time of that many tokens (`Profile.prefill_ms`), so the
part of `S` that does not grow with length is paid once per step, not once per prompt. With `m` and `p` the
uncached prompt tokens (mean, and at the SLO percentile), `lam = rate / N` per replica, `c` the percentile's
tail (`1 - percentile/100`):

    busy batch    b = the root of b = lam x S(b m) on [1, B], B = max(1, K / m)   (1 when lam x S(m) <= 1)
    stability     rate < N x mu,  mu = B / S(B m)   (a replica's prompts per ms in full steps)
    P(wait)       W = ErlangC(N, rate x S(b m) / b)   (1 once steps batch: a step is always in progress)
    wait at p     w = ln(W / c) / (N mu - rate) x (1 + scv) / 2   if W > c, else 0
    TTFT at p     w + S(min((b - 1) m + p, max(K, p)))   (its own step, with the prompts batched beside it)

A prompt that waits finds a backlog the replicas drain in full steps (the M/G/c waiting-time tail, Erlang C
with the Allen-Cunneen correction, at the full-step rate `mu`), then rides a step with the busy batch's other
prompts. With one prompt per step (`B = 1`: prompts as long as the chunk), or a profile with no fixed cost
(`B / S(B m) = 1 / S(m)`), this is the M/G/c queue of one prompt per service; where no prompt waits at the
percentile it is `S(p)`, the service time of one prompt alone. `prefill_need` plans a pool at no more than
`PREFILL_MOST_USE` (0.9) of its full-step rate `N mu`.

Decode is a batch: each step serves every running sequence, and by Little's law a replica carries
`rate x output tokens x TPOT` running sequences; TPOT is the step time at that batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.profile import Profile
from tandem.slo import Slo

MAX_REPLICAS_SEARCHED = 4096
# The most of a prefill pool's full-step rate the need plans for. The TTFT tail assumes Poisson arrivals at a
# known rate; a batching pool's wait stays short almost to its full-step rate, where a burst or a rate misread
# by a few percent is a queue that grows without bound. Chosen on the code day (at the model's own answer,
# 0.98-0.99 of the rate at a 2 s TTFT SLO, auto missed 95% there; at 0.9 it reaches it).
PREFILL_MOST_USE = 0.9


@dataclass(frozen=True)
class PrefillLoad:
    rate_rps: float
    prompt_tokens_mean: float
    prompt_tokens_p: float  # at the SLO percentile
    prefix_hit_rate: float = 0.0
    service_scv: float = 1.0  # squared coefficient of variation of the service time (1 = exponential)


@dataclass(frozen=True)
class DecodeLoad:
    rate_rps: float
    prompt_tokens_mean: float
    output_tokens_mean: float

    @property
    def context_tokens(self) -> float:
        return self.prompt_tokens_mean + self.output_tokens_mean / 2  # mean context over a generation


@dataclass(frozen=True)
class Need:
    """Replicas a pool needs at a load: the whole number that meets the target, and the load in replicas."""

    replicas: int
    load_replicas: (
        float  # the work in replica-equivalents at full use (prefill) or at the chosen batch (decode)
    )
    latency_ms: float  # predicted latency at `replicas`
    batch: float = 0.0  # decode: the largest batch per replica that meets the TPOT target


def burst_rate(slice_rates: tuple[float, ...] | list[float], percentile: float, slice_s: float) -> float:
    """The arrival rate the p-th percentile request arrived at: slices weighted by the requests they hold,
    each slice's rate first stripped of the Poisson noise in its count.

    A slice of `slice_s` seconds at rate r holds c = r x slice_s requests. Were the arrivals Poisson at one
    steady rate, the counts would spread with a variance equal to their mean, and the busiest slice would sit
    above the mean by counting noise alone, which the queue model (M/G/c) already prices. So the counts'
    sample variance v is read as Poisson noise (the mean m) plus the spread of the rate itself (v - m); the
    best linear guess of a slice's own rate from its count (the Gamma-Poisson empirical-Bayes, or
    credibility, estimate) moves it toward the mean by the share of the spread the noise explains:
    r' = mean + (r - mean) x (1 - m / v). Poisson or calmer traffic (v <= m) thus gives the mean rate, and a
    burst of many requests, whose spread dwarfs the noise, keeps its rate. On smooth traffic this is about
    the mean rate; on traffic that comes in bursts it is the burst's rate, which is what a queue with no time
    to scale sees.
    """
    if slice_s <= 0:
        raise ValueError(f"slice_s must be positive, got {slice_s}")
    total = sum(slice_rates)
    if total <= 0:
        return 0.0
    n = len(slice_rates)
    mean_rate = total / n
    counts = [rate * slice_s for rate in slice_rates]
    mean = mean_rate * slice_s
    variance = sum((c - mean) ** 2 for c in counts) / (n - 1) if n > 1 else 0.0
    if variance <= mean:  # no spread beyond Poisson noise: the queue model prices all of it
        return mean_rate
    keep = 1 - mean / variance
    rates = sorted(mean_rate + (rate - mean_rate) * keep for rate in slice_rates)
    seen = 0.0
    for rate in rates:
        seen += rate
        if seen >= total * percentile / 100:
            return rate
    return rates[-1]


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `offered` = rate x service time."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    term, total = 1.0, 1.0  # sum_{k<c} a^k/k!, computed iteratively
    for k in range(1, servers):
        term *= offered / k
        total += term
    last = term * offered / servers
    tail = last * servers / (servers - offered)
    return tail / (total + tail)


def _uncached(load: PrefillLoad) -> float:
    return 1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0)


def prefill_full_step(profile: Profile, prompt_tokens: float) -> tuple[float, float]:
    """A replica's largest step for prompts of this mean length: (prompts in it, its time in ms). Prompts fill
    the chunk; one longer than the chunk is a step alone."""
    batch = max(1.0, profile.prefill_chunk_tokens / max(prompt_tokens, 1.0))
    return batch, profile.prefill_ms(batch * prompt_tokens)


def prefill_drain_tokens_per_ms(profile: Profile, prompt_tokens: float) -> float:
    """Prompt tokens a replica with a backlog serves per ms: full steps of prompts of this mean length."""
    most, full_ms = prefill_full_step(profile, prompt_tokens)
    return most * max(prompt_tokens, 1.0) / full_ms


def prefill_busy_batch(profile: Profile, rate_per_replica_rps: float, prompt_tokens: float) -> float:
    """Prompts in a busy replica's step: the root of b = rate x S(b x prompt), between 1 and the full step;
    inf when even full steps do not keep up."""
    most, _ = prefill_full_step(profile, prompt_tokens)
    per_ms = rate_per_replica_rps / 1000

    def excess(b: float) -> float:
        return per_ms * profile.prefill_ms(b * prompt_tokens) - b

    if excess(most) >= 0:
        return math.inf
    if excess(1.0) <= 0:
        return 1.0
    lo, hi = 1.0, most
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi


def prefill_ttft_ms(profile: Profile, replicas: int, load: PrefillLoad, percentile: float) -> float:
    """TTFT at `percentile` for `replicas` prefill replicas that batch prompts into steps (module docstring);
    inf when the pool cannot keep up."""
    uncached = _uncached(load)
    mean, at_p = load.prompt_tokens_mean * uncached, load.prompt_tokens_p * uncached
    if load.rate_rps <= 0:
        return profile.prefill_ms(at_p)
    if replicas <= 0:
        return math.inf
    batch = prefill_busy_batch(profile, load.rate_rps / replicas, mean)
    most, full_ms = prefill_full_step(profile, mean)
    drain_per_s = replicas * most / (full_ms / 1000) - load.rate_rps
    if math.isinf(batch) or drain_per_s <= 0:
        return math.inf
    own_tokens = min((batch - 1) * mean + at_p, max(profile.prefill_chunk_tokens, at_p))
    own_ms = profile.prefill_ms(own_tokens)
    waits = erlang_c(replicas, load.rate_rps * profile.prefill_ms(batch * mean) / 1000 / batch)
    tail = 1.0 - percentile / 100
    wait_s = 0.0
    if waits > tail:
        # M/G/c: P(W > t) = C * exp(-(c*mu - lambda) t), the backlog drained in full steps; the spread of the
        # service time scales the wait.
        wait_s = math.log(waits / tail) / drain_per_s * (1 + load.service_scv) / 2
    return wait_s * 1000 + own_ms


def prefill_need(profile: Profile, load: PrefillLoad, slo: Slo, target_share: float) -> Need:
    """The fewest prefill replicas whose predicted TTFT stays within `target_share` of the SLO, at no more
    than PREFILL_MOST_USE of their full-step rate; its `load_replicas` is the work in replicas at full steps
    (the fewest that keep up)."""
    if load.rate_rps <= 0:
        return Need(0, 0.0, 0.0)
    target = slo.ttft_ms * target_share
    uncached = _uncached(load)
    most, full_ms = prefill_full_step(profile, load.prompt_tokens_mean * uncached)
    offered = load.rate_rps * full_ms / 1000 / most
    alone_ms = profile.prefill_ms(load.prompt_tokens_p * uncached)
    for n in range(max(1, math.ceil(offered / PREFILL_MOST_USE - 1e-9)), MAX_REPLICAS_SEARCHED):
        ttft = prefill_ttft_ms(profile, n, load, slo.percentile)
        if ttft <= target:
            return Need(n, offered, ttft)
        if n > offered + 1 and ttft - alone_ms < 1.0:
            return Need(n, offered, ttft)  # no queueing left: the service time alone misses the target
    return Need(MAX_REPLICAS_SEARCHED, offered, math.inf)


def decode_batch_cap(profile: Profile, context_tokens: float) -> int:
    """The most sequences one decode replica can hold: its batch cap and its KV capacity."""
    by_kv = int(profile.kv_capacity_tokens // max(context_tokens, 1.0))
    return max(1, min(profile.max_running_sequences, by_kv))


def decode_max_batch(profile: Profile, context_tokens: float, tpot_target_ms: float) -> int:
    """The largest batch whose step time meets `tpot_target_ms` (at least 1)."""
    best = 1
    for b in range(1, decode_batch_cap(profile, context_tokens) + 1):
        if profile.decode_step_ms(b, context_tokens) <= tpot_target_ms:
            best = b
        else:
            break
    return best


def decode_tpot_ms(profile: Profile, replicas: int, load: DecodeLoad, stretch: float = 1.0) -> float:
    """TPOT with the load spread over `replicas`: the batch b solving b = rate/N x output x step(b) (Little).

    `stretch` scales every step (a colocated worker's steps also carry prefill work, colocated.py)."""
    ctx = load.context_tokens
    if load.rate_rps <= 0:
        return profile.decode_step_ms(1, ctx) * stretch
    if replicas <= 0:
        return math.inf
    per_replica = load.rate_rps / replicas * load.output_tokens_mean / 1000  # sequences per ms of step

    def excess(b: float) -> float:
        return per_replica * profile.decode_step_ms(b, ctx) * stretch - b

    cap = float(decode_batch_cap(profile, ctx))
    if excess(cap) > 0:
        return math.inf  # more sequences arrive than the batch cap lets through
    lo, hi = 0.0, cap
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return profile.decode_step_ms(max(hi, 1.0), ctx) * stretch


def decode_need(profile: Profile, load: DecodeLoad, slo: Slo, target_share: float) -> Need:
    """Decode replicas for the load at the largest batch that meets `target_share` of the TPOT SLO."""
    if load.rate_rps <= 0:
        return Need(0, 0.0, 0.0)
    target = slo.tpot_ms * target_share
    ctx = load.context_tokens
    batch = decode_max_batch(profile, ctx, target)
    running = load.rate_rps * load.output_tokens_mean * profile.decode_step_ms(batch, ctx) / 1000
    load_replicas = running / batch
    n = max(1, math.ceil(load_replicas - 1e-9))
    while n < MAX_REPLICAS_SEARCHED and decode_tpot_ms(profile, n, load) > target:
        n += 1
        if profile.decode_step_ms(1, ctx) > target:
            break  # even one sequence per replica misses: more replicas cannot help
    return Need(n, load_replicas, decode_tpot_ms(profile, n, load), float(batch))
