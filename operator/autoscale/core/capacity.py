"""The capacity model: from a profile, the TTFT and TPOT a pool of N replicas gives at a load, and the N it
needs.

Prefill is a queue: requests wait for a free replica, then take their service time. TTFT at the SLO
percentile is the M/G/c waiting-time percentile (Erlang C with the Allen-Cunneen correction for the
service-time spread) plus the service time of a prompt at that percentile, so a pool is never sized at
100% utilisation. Decode is a batch: each step serves every running sequence, and by Little's law a
replica carries `rate x output tokens x TPOT` running sequences; TPOT is the step time at that batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.profile import Profile
from tandem.slo import Slo

MAX_REPLICAS_SEARCHED = 4096


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


def prefill_ttft_ms(profile: Profile, replicas: int, load: PrefillLoad, percentile: float) -> float:
    """TTFT at `percentile` for `replicas` prefill replicas; inf when the pool cannot keep up."""
    if replicas <= 0:
        return math.inf if load.rate_rps > 0 else 0.0
    uncached = 1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0)
    service_mean_s = profile.prefill_ms(load.prompt_tokens_mean * uncached) / 1000
    service_p_ms = profile.prefill_ms(load.prompt_tokens_p * uncached)
    if load.rate_rps <= 0:
        return service_p_ms
    offered = load.rate_rps * service_mean_s
    if offered >= replicas:
        return math.inf
    waits = erlang_c(replicas, offered)
    tail = 1.0 - percentile / 100
    wait_s = 0.0
    if waits > tail:
        # M/M/c: P(W > t) = C * exp(-(c*mu - lambda) t); the spread of the service time scales the wait.
        drain_rate = replicas / service_mean_s - load.rate_rps
        wait_s = math.log(waits / tail) / drain_rate * (1 + load.service_scv) / 2
    return wait_s * 1000 + service_p_ms


def prefill_need(profile: Profile, load: PrefillLoad, slo: Slo, target_share: float) -> Need:
    """The fewest prefill replicas whose predicted TTFT stays within `target_share` of the SLO."""
    target = slo.ttft_ms * target_share
    uncached = 1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0)
    offered = load.rate_rps * profile.prefill_ms(load.prompt_tokens_mean * uncached) / 1000
    if load.rate_rps <= 0:
        return Need(0, 0.0, 0.0)
    for n in range(max(1, math.floor(offered)), MAX_REPLICAS_SEARCHED):
        ttft = prefill_ttft_ms(profile, n, load, slo.percentile)
        if ttft <= target:
            return Need(n, offered, ttft)
        if n > offered + 1 and ttft - profile.prefill_ms(load.prompt_tokens_p * uncached) < 1.0:
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
