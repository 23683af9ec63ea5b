"""Prometheus metrics of a prefill, decode or colocated worker, labelled by service and pool; the engine's
state again under vLLM's names, labelled by the served model."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tandem import names
from tandem.worker.engine.core.scheduler import SchedulerOutput
from tandem.worker.engine.runner.engine import Engine

KV_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    def __init__(
        self, service: str, pool: str, registry: CollectorRegistry | None = None, model_name: str = "model"
    ):
        self.registry = registry or CollectorRegistry()
        labels = list(names.METRIC_LABELS)
        r = self.registry
        self.vllm = VllmEngineMetrics(r, model_name)

        self.service, self.pool = service, pool
        self._series: list = []  # every pool-labelled metric, relabelled when the worker changes role
        self._engine: Engine | None = None
        self._busy: Callable[[], int] | None = None

        def bind(metric):  # every series carries the service and the pool
            self._series.append(metric)
            return metric.labels(service=service, pool=pool)

        self.queued_prompt_tokens = bind(
            Gauge(names.PREFILL_QUEUED_TOKENS, "Prompt tokens waiting to be prefilled", labels, registry=r)
        )
        self.prefill_tokens = bind(
            Counter(names.PREFILL_TOKENS_TOTAL, "Prompt tokens prefilled", labels, registry=r)
        )
        per_transport = [*labels, "transport"]  # grpc | shm | cuda_ipc: what the pair used for that prompt
        self._kv_bytes = Counter(
            names.KV_TRANSFER_BYTES_TOTAL,
            "KV cache bytes pushed to decode workers, by the transport the prefill and decode worker used",
            per_transport,
            registry=r,
        )
        self._kv_seconds = Histogram(
            names.KV_TRANSFER_SECONDS,
            "Per prompt pushed to a decode worker: from its first KV chunk read for the push "
            "to the decode worker's acknowledgement of the commit (the last chunk and the first token); "
            "overlaps the compute of the prompt's later layers",
            per_transport,
            registry=r,
            buckets=KV_BUCKETS,
        )
        self._kv_tail = Histogram(
            names.KV_TRANSFER_TAIL_SECONDS,
            "Per prompt pushed to a decode worker: from its first token computed (its "
            "last layer done) to the decode worker's acknowledgement of the commit; the transfer time the "
            "compute did not hide",
            per_transport,
            registry=r,
            buckets=KV_BUCKETS,
        )
        self._per_transport = [self._kv_bytes, self._kv_seconds, self._kv_tail]
        self.running = bind(
            Gauge(names.DECODE_RUNNING_SEQUENCES, "Sequences in the running batch", labels, registry=r)
        )
        self.kv_used = bind(Gauge(names.KV_BLOCKS_USED, "KV cache blocks in use", labels, registry=r))
        self.kv_total = bind(Gauge(names.KV_BLOCKS_TOTAL, "KV cache blocks in the pool", labels, registry=r))
        self.prefix_queried = bind(
            Counter(
                names.PREFIX_CACHE_QUERIED_TOKENS_TOTAL,
                "Prompt tokens looked up in the prefix cache",
                labels,
                registry=r,
            )
        )
        self.prefix_hits = bind(
            Counter(
                names.PREFIX_CACHE_HIT_TOKENS_TOTAL,
                "Prompt tokens found in the prefix cache",
                labels,
                registry=r,
            )
        )
        self._prefix_seen = (0, 0)
        self.spec_proposed = bind(
            Counter(
                names.SPEC_PROPOSED_TOKENS_TOTAL,
                "Draft tokens verified by speculative decoding",
                labels,
                registry=r,
            )
        )
        self.spec_accepted = bind(
            Counter(names.SPEC_ACCEPTED_TOKENS_TOTAL, "Draft tokens the model accepted", labels, registry=r)
        )
        self.spec_verifies = bind(
            Counter(names.SPEC_VERIFY_STEPS_TOTAL, "Sequence steps that verified drafts", labels, registry=r)
        )
        self._spec_seen = (0, 0, 0)
        self.held = bind(
            Gauge(names.WORKER_HELD_REQUESTS, "Requests this worker holds in any state", labels, registry=r)
        )
        startup = Gauge(
            names.WORKER_STARTUP_SECONDS,
            "Seconds this worker's start spent per phase: load (weights "
            "read into memory), kv_plan (sizing the KV cache), warmup (every path a request can take, "
            "decode_graphs included), decode_graphs (the static decode step's buckets)",
            [*labels, "phase"],
            registry=r,
        )
        self.startup = {
            phase: startup.labels(service=service, pool=pool, phase=phase) for phase in names.STARTUP_PHASES
        }
        self.batch_size = bind(
            Histogram(
                names.DECODE_BATCH_SIZE,
                "Sequences per engine step",
                labels,
                registry=r,
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            )
        )

    def watch(self, engine: Engine) -> WorkerMetrics:
        """Read the KV block and running-sequence gauges from `engine` at scrape time, so that blocks freed
        by an abort or an expired lease show at once, not at the next engine step. Each read is one
        `len()`, safe against the engine thread."""
        self._engine = engine
        self.kv_used.set_function(lambda: engine.blocks.num_used)
        self.kv_total.set_function(lambda: engine.blocks.num_blocks)
        self.running.set_function(lambda: engine.num_running)
        self.vllm.watch(engine)
        return self

    def watch_held(self, busy: Callable[[], int]) -> WorkerMetrics:
        """Read the held-requests gauge from the servicer's `busy()` at scrape time."""
        self._busy = busy
        self.held.set_function(busy)
        return self

    def kv_pushed(self, transport: str, nbytes: int, span_s: float, tail_s: float) -> None:
        """One prompt's KV pushed and committed over `transport`: its bytes, its span (first chunk to the
        commit's acknowledgement) and its tail (first token to that acknowledgement)."""
        labels = {"service": self.service, "pool": self.pool, "transport": transport}
        self._kv_bytes.labels(**labels).inc(nbytes)
        self._kv_seconds.labels(**labels).observe(span_s)
        self._kv_tail.labels(**labels).observe(tail_s)

    def set_pool(self, pool: str) -> None:
        """Label every series with `pool` from now on (the worker changed role); the old pool's are dropped,
        so the worker counts in one pool only."""
        if pool == self.pool:
            return
        old = {"service": self.service, "pool": self.pool}
        children = {id(m.labels(**old)): m for m in self._series}
        for name, value in list(vars(self).items()):
            parent = children.get(id(value))
            if parent is not None:
                setattr(self, name, parent.labels(service=self.service, pool=pool))
        for m in self._series:
            m.remove(*(old[label] for label in names.METRIC_LABELS))
        for m in self._per_transport:  # only this worker's pool has series: all of them are the old pool's
            m.clear()
        self.pool = pool
        if self._engine is not None:
            self.watch(self._engine)
        if self._busy is not None:
            self.watch_held(self._busy)

    def on_step(self, engine: Engine) -> None:
        """Refresh what a step changes (runs on the engine thread, so it stays cheap)."""
        sched = engine.last_schedule
        self.queued_prompt_tokens.set(engine.queued_prompt_tokens)
        queried, hits = engine.blocks.prefix_queried_tokens, engine.blocks.prefix_hit_tokens
        self.prefix_queried.inc(queried - self._prefix_seen[0])
        self.prefix_hits.inc(hits - self._prefix_seen[1])
        self.vllm.prefix_queries.inc(queried - self._prefix_seen[0])
        self.vllm.prefix_hits.inc(hits - self._prefix_seen[1])
        self._prefix_seen = (queried, hits)
        spec = engine.speculator
        if spec is not None:
            seen = (spec.proposed_tokens, spec.accepted_tokens, spec.verifies)
            for counter, now, before in zip(
                (self.spec_proposed, self.spec_accepted, self.spec_verifies),
                seen,
                self._spec_seen,
                strict=True,
            ):
                counter.inc(now - before)
            self._spec_seen = seen
        if sched is not None and sched.seqs:
            self.batch_size.observe(len(sched.seqs))
            self.prefill_tokens.inc(prompt_tokens_computed(sched))


class VllmEngineMetrics:
    """vLLM's engine-state series: running and waiting requests, KV-cache use (a fraction) and prefix-cache
    queries and hits (tokens), labelled with the served model's name."""

    def __init__(self, r: CollectorRegistry, model_name: str) -> None:
        label = [names.VLLM_MODEL_LABEL]

        def gauge(name: str, doc: str):
            return Gauge(name, doc, label, registry=r).labels(model_name)

        def counter(name: str, doc: str):
            return Counter(name, doc, label, registry=r).labels(model_name)

        self.running = gauge(names.VLLM_RUNNING, "Number of requests in model execution batches.")
        self.waiting = gauge(names.VLLM_WAITING, "Number of requests waiting to be processed.")
        self.kv_usage = gauge(names.VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            names.VLLM_PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            names.VLLM_PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens."
        )

    def watch(self, engine: Engine) -> None:
        """Read the gauges from `engine` at scrape time, like tandem's own."""
        self.running.set_function(lambda: engine.num_running)
        self.waiting.set_function(lambda: engine.num_waiting)
        self.kv_usage.set_function(lambda: engine.blocks.num_used / max(engine.blocks.num_blocks, 1))


def prompt_tokens_computed(sched: SchedulerOutput) -> int:
    """Prompt tokens (not decode tokens) among those a finished step computed."""
    total = 0
    for seq, n, draft in zip(sched.seqs, sched.num_new_tokens, sched.drafts, strict=True):
        if draft:  # a verify: a decoding sequence's last token and its drafts
            continue
        start = max(0, seq.num_computed - n)
        total += max(0, min(n, len(seq.prompt_ids) - start))
    return total
