"""A pool's need from the capacity model: replicas at a rate, the latency its backlog or batch implies now,
and its predicted latency as a share of the SLO at N replicas (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from tandem.operator.autoscale.core.capacity import (
    DecodeLoad,
    Need,
    PrefillLoad,
    burst_rate,
    decode_need,
    decode_tpot_ms,
    prefill_drain_tokens_per_ms,
    prefill_need,
    prefill_ttft_ms,
)
from tandem.operator.autoscale.core.colocated import colocated_need, colocated_tpot_ms, colocated_ttft_ms
from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.types import Pool, PoolObservation


def missing(value: float | None) -> bool:
    """A metric is missing when absent or NaN."""
    return value is None or math.isnan(value)


@dataclass(frozen=True)
class Sizing:
    """What the capacity model says about one pool at one rate: its need, its latency now and at N
    replicas."""

    need: Need
    observed_ms: float  # the binding latency now
    slo_ms: float
    label: str
    latency_share: Callable[[int], float]  # worst predicted latency / SLO at N replicas
    now_ms: float  # the latency the present backlog (prefill) or batch (decode) implies on the ready replicas
    now_source: str = "load"
    now_need: int = 0  # decode: replicas the running sequences need at the target batch
    service_ms: float = 0.0  # prefill: the service time of a prompt at the SLO percentile (no replica helps)
    rate_rps: float = 0.0  # the rate the pool was sized for


def size_pool(obs: PoolObservation, cfg: PolicyConfig, rate: float, share: float | None = None) -> Sizing:
    """Size `obs.pool` for `rate` at the latency share `share` of the SLO (the config's margin by default)."""
    slo, profile = cfg.slo, cfg.profile
    margin = cfg.margin if share is None else share
    prompt = float(obs.prompt_tokens_mean or 0.0)
    prefill_load = PrefillLoad(
        rate_rps=rate,
        prompt_tokens_mean=prompt,
        prompt_tokens_p=float(obs.prompt_tokens_p90 if not missing(obs.prompt_tokens_p90) else prompt),
        prefix_hit_rate=float(obs.prefix_hit_rate if not missing(obs.prefix_hit_rate) else 0.0),
    )
    decode_load = DecodeLoad(rate, prompt, float(obs.output_tokens_mean or 0.0))
    slices = obs.arrival_rate_slices_rps
    if slices:  # size for the bursts a request meets, not the window's mean
        burst = max(rate, burst_rate(slices, slo.percentile, obs.window_s / len(slices)))
        prefill_load = replace(prefill_load, rate_rps=burst)
        if obs.pool != Pool.colocated:  # colocated workers: decode at the mean, as the shape rule sizes them
            decode_load = replace(decode_load, rate_rps=burst)

    def ttft_share(n: int) -> float:
        return prefill_ttft_ms(profile, n, prefill_load, slo.percentile) / slo.ttft_ms

    def tpot_share(n: int) -> float:
        return decode_tpot_ms(profile, n, decode_load) / slo.tpot_ms

    ready = max(obs.replicas.ready, 1)
    if obs.pool == Pool.prefill:
        need = prefill_need(profile, prefill_load, slo, margin)
        observed = float(obs.ttft_ms)  # type: ignore[arg-type]
        now_ms = observed
        if not missing(obs.queued_prompt_tokens) and prompt > 0:
            tokens_per_ms = ready * prefill_drain_tokens_per_ms(profile, prompt)
            now_ms = float(obs.queued_prompt_tokens) / tokens_per_ms + profile.prefill_ms(
                prefill_load.prompt_tokens_p
            )  # type: ignore[arg-type]
        service = profile.prefill_ms(prefill_load.prompt_tokens_p * (1 - prefill_load.prefix_hit_rate))
        return Sizing(
            need,
            observed,
            slo.ttft_ms,
            "TTFT",
            ttft_share,
            now_ms,
            "backlog",
            service_ms=service,
            rate_rps=prefill_load.rate_rps,
        )
    if obs.pool == Pool.decode:
        need = decode_need(profile, decode_load, slo, margin)
        observed = float(obs.tpot_ms)  # type: ignore[arg-type]
        now_ms, now_need = observed, 0
        if not missing(obs.running_sequences):
            running = float(obs.running_sequences)  # type: ignore[arg-type]
            now_ms = profile.decode_step_ms(running / ready, decode_load.context_tokens)
            now_need = math.ceil(running / max(need.batch, 1.0) - 1e-9)
        return Sizing(
            need,
            observed,
            slo.tpot_ms,
            "TPOT",
            tpot_share,
            now_ms,
            "batch",
            now_need,
            rate_rps=decode_load.rate_rps,
        )
    # colocated: both phases share each worker's steps (colocated.py), so the need is not the larger of the
    # split's
    need = colocated_need(profile, prefill_load, decode_load, slo, margin)

    def colocated_share(n: int) -> float:
        ttft = colocated_ttft_ms(profile, n, prefill_load, decode_load, slo.percentile)
        return max(ttft / slo.ttft_ms, colocated_tpot_ms(profile, n, prefill_load, decode_load) / slo.tpot_ms)

    ttft_ratio = float(obs.ttft_ms) / slo.ttft_ms  # type: ignore[arg-type]
    tpot_ratio = float(obs.tpot_ms) / slo.tpot_ms  # type: ignore[arg-type]
    observed, slo_ms, label = (
        (float(obs.ttft_ms), slo.ttft_ms, "TTFT")  # type: ignore[arg-type]
        if ttft_ratio >= tpot_ratio
        else (float(obs.tpot_ms), slo.tpot_ms, "TPOT")  # type: ignore[arg-type]
    )
    return Sizing(
        need,
        observed,
        slo_ms,
        label,
        colocated_share,
        observed,
        rate_rps=prefill_load.rate_rps,
    )
