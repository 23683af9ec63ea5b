"""Every PromQL query the autoscaler runs, in one place; the Grafana dashboard charts the same expressions.

A query is built from label matchers and a range, so the operator fills in one service and its window
while the dashboard (charts/tandem/dashboards/tandem.json) fills in `$namespace`, `$service`, `$pool` and
`$__rate_interval`; tests/unit/test_autoscale_sources.py holds the two to the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tandem import names
from tandem.operator.autoscale.core.types import Pool


@dataclass(frozen=True)
class Matchers:
    """Label matchers: `op` is `=` for one service, `=~` for the dashboard's variables."""

    namespace: str
    service: str
    pool: str | None = None
    op: str = "="

    def render(self, *extra: str) -> str:
        parts = [f'namespace{self.op}"{self.namespace}"', f'service{self.op}"{self.service}"']
        if self.pool is not None:
            parts.append(f'pool{self.op}"{self.pool}"')
        return "{" + ", ".join([*parts, *extra]) + "}"

    @property
    def by(self) -> str:
        return "namespace, service, pool" if self.pool is not None else "namespace, service"


def quantile(metric: str, q: float, m: Matchers, window: str) -> str:
    """The q-quantile of a histogram over the window, all series of the selection merged."""
    return f"histogram_quantile({q:g}, sum by (le, {m.by}) (rate({metric}_bucket{m.render()}[{window}])))"


def rate_sum(metric: str, m: Matchers, window: str, *extra: str) -> str:
    return f"sum by ({m.by}) (rate({metric}{m.render(*extra)}[{window}]))"


def gauge_sum(metric: str, m: Matchers) -> str:
    return f"sum by ({m.by}) ({metric}{m.render()})"


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator} / {denominator}"


def mean(histogram: str, m: Matchers, window: str) -> str:
    """Mean of a histogram's observations over the window."""
    return ratio(rate_sum(f"{histogram}_sum", m, window), rate_sum(f"{histogram}_count", m, window))


def router(namespace: str, service: str, op: str = "=") -> Matchers:
    """The router's series: TTFT and TPOT as clients see them, arrivals, prompt and output lengths."""
    return Matchers(namespace, service, None, op)


def pool_queries(
    pool: Pool,
    namespace: str,
    service: str,
    window: str,
    percentile: float,
    op: str = "=",
    pool_value: str | None = None,
) -> Mapping[str, str]:
    """PoolObservation field -> query, for one pool. TTFT is the prefill pool's SLO, TPOT the decode
    pool's (both measured at the router); a colocated pool answers for both."""
    r = router(namespace, service, op)
    w = Matchers(namespace, service, pool_value if pool_value is not None else pool.value, op)
    q = percentile / 100
    out: dict[str, str] = {
        "arrival_rate_rps": rate_sum(names.REQUEST_ARRIVALS_TOTAL, r, window),
        "prompt_tokens_mean": mean(names.REQUEST_PROMPT_TOKENS, r, window),
        "prompt_tokens_p90": quantile(names.REQUEST_PROMPT_TOKENS, 0.9, r, window),
        "output_tokens_mean": mean(names.REQUEST_OUTPUT_TOKENS, r, window),
        "prefix_hit_rate": ratio(
            rate_sum(names.PREFIX_CACHE_HIT_TOKENS_TOTAL, w, window),
            rate_sum(names.PREFIX_CACHE_QUERIED_TOKENS_TOTAL, w, window),
        ),
        "kv_usage": ratio(gauge_sum(names.KV_BLOCKS_USED, w), gauge_sum(names.KV_BLOCKS_TOTAL, w)),
    }
    held_for = (
        f'role{op}"{pool_value if pool_value is not None else pool.value}"'  # the router's gauges, by pool
    )
    out["held_requests"] = f"sum by ({r.by}) ({names.ROUTER_HELD_REQUESTS}{r.render(held_for)})"
    out["held_oldest_s"] = f"max by ({r.by}) ({names.ROUTER_HELD_OLDEST_SECONDS}{r.render(held_for)})"
    if pool in (Pool.prefill, Pool.colocated):
        out["ttft_ms"] = quantile(names.TTFT_SECONDS, q, r, window)
        out["queued_prompt_tokens"] = gauge_sum(names.PREFILL_QUEUED_TOKENS, w)
    if pool in (Pool.decode, Pool.colocated):
        out["tpot_ms"] = quantile(names.TPOT_SECONDS, q, r, window)
        out["running_sequences"] = gauge_sum(names.DECODE_RUNNING_SEQUENCES, w)
    return out


def arrival_samples(namespace: str, service: str, span: str, op: str = "=") -> str:
    """Every sample of the router's arrival counter over `span`, not a rate: the source cuts them into slices
    of the autoscaler's interval (prometheus.slice_rates), as the direct scrape cuts its window at each tick.
    A `rate()` over one slice would need two samples inside it, which a slice as long as the scrape interval
    (both 15 s by default) seldom holds. The dashboard charts it as `irate()`, the rate between scrapes."""
    return f"{names.REQUEST_ARRIVALS_TOTAL}{router(namespace, service, op).render()}[{span}]"


def attainment(namespace: str, service: str, window: str, op: str = "=") -> str:
    """Share of completed requests that met each SLO over the window, one series per `slo` (ttft, tpot)."""
    m = router(namespace, service, op)
    by = "namespace, service, slo"
    met_true = m.render('met="true"')
    met = f"sum by ({by}) (rate({names.SLO_REQUESTS_TOTAL}{met_true}[{window}]))"
    return ratio(met, f"sum by ({by}) (rate({names.SLO_REQUESTS_TOTAL}{m.render()}[{window}]))")


def held_by_pod(namespace: str, service: str, pool: Pool) -> str:
    """Work each pod of a pool holds now (decode: running sequences; prefill: queued prompt tokens), by
    the `pod` label the PodMonitor adds: which pod a scale-down should remove."""
    metric = names.PREFILL_QUEUED_TOKENS if pool == Pool.prefill else names.DECODE_RUNNING_SEQUENCES
    return f"sum by (pod) ({metric}{Matchers(namespace, service, pool.value).render()})"


SECONDS_FIELDS = ("ttft_ms", "tpot_ms")  # queried in seconds, observed in milliseconds
