"""The /metrics a router and its workers would export for the simulator's requests, scraped on an interval
into the windows the direct-scrape source keeps, so the simulated policy reads what production gives it:
TTFT and TPOT as `histogram_quantile` over the router's buckets, rates as counter increases over the
window, gauges as of the last scrape, and no latency at all when nothing completed in the window."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

from tandem import names
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sources.observation import Figure
from tandem.operator.autoscale.sources.scrape import Labels, Samples, Snapshot, Window, figures

ROUTER_LABELS: Labels = (("pool", names.POOL_ROUTER),)


class Histogram:
    """A Prometheus histogram: counts per bucket (upper bound inclusive, then +Inf), sum and count."""

    def __init__(self, name: str, bounds: tuple[float, ...]):
        self.name, self.bounds = name, (*(float(b) for b in bounds), math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def samples(self, labels: Labels) -> Samples:
        out: Samples = {}
        total = 0
        for le, n in zip(self.bounds, self.counts, strict=True):
            total += n
            out[
                (
                    f"{self.name}_bucket",
                    tuple(sorted((*labels, ("le", "+Inf" if math.isinf(le) else repr(le))))),
                )
            ] = total
        out[(f"{self.name}_count", labels)] = float(total)
        out[(f"{self.name}_sum", labels)] = self.sum
        return out


class Exposition:
    """The router's request histograms and arrival counter, moved as requests arrive and finish, and the
    workers' gauges read at each scrape; `observed` runs the direct-scrape source's arithmetic on them."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.ttft = Histogram(names.TTFT_SECONDS, names.TTFT_BUCKETS)
        self.tpot = Histogram(names.TPOT_SECONDS, names.TOKEN_BUCKETS)
        self.prompt = Histogram(names.REQUEST_PROMPT_TOKENS, names.LENGTH_BUCKETS)
        self.output = Histogram(names.REQUEST_OUTPUT_TOKENS, names.LENGTH_BUCKETS)
        self.arrivals = 0
        self.router = Window()
        self.workers: dict[Pool, Window] = {}

    # what the router observes per request
    def arrived(self, prompt_tokens: int) -> None:
        self.arrivals += 1
        self.prompt.observe(prompt_tokens)

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def finished(self, tpot_s: float | None, output_tokens: int) -> None:
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        self.output.observe(output_tokens)

    def scrape(self, now_s: float, gauges: Mapping[Pool, Mapping[str, Mapping[str, float]]]) -> None:
        """One scrape of the router and of every worker that is up: `gauges[pool][pod][metric]`."""
        samples: Samples = {(names.REQUEST_ARRIVALS_TOTAL, ROUTER_LABELS): float(self.arrivals)}
        for h in (self.ttft, self.tpot, self.prompt, self.output):
            samples |= h.samples(ROUTER_LABELS)
        self.router.add(Snapshot(now_s, samples), self.window_s)
        for pool, pods in gauges.items():
            worker: Samples = {
                (metric, (("pod", pod), ("pool", pool.value))): value
                for pod, metrics in pods.items()
                for metric, value in metrics.items()
            }
            self.workers.setdefault(pool, Window()).add(Snapshot(now_s, worker), self.window_s)

    def observed(self, pool: Pool, percentile: float) -> dict[str, Figure]:
        """The PoolObservation fields of `pool` as of the last scrape (latencies in seconds)."""
        workers = [self.workers[pool]] if pool in self.workers else []
        return figures(pool, [self.router], workers, percentile)
