"""A discrete-event replay of a trace through both pools, with an autoscaling policy in the loop.

Per request: the router sends it to the prefill replica with the fewest prompt tokens ahead; the replica
serves its queue first come, first served, in steps that batch queued prompts while their tokens fit the
profile's chunk, each step taking the profile's prefill time for its tokens; the first token ends TTFT; the KV
then travels to the decode replica with the fewest sequences for `kv_transfer_ms_per_token x prompt`; decode
runs continuous batches, each step taking the profile's step time at the current batch and mean context,
admitting waiting sequences at step boundaries up to the batch and KV caps. Replicas start after a cold start
(billed while starting), and on scale-down either drain (finish their work, take no new work) or, for a policy
that does not drain, drop their in-flight requests. Every `interval_s` the policy sees each pool's last window
as production shows it: the router's and workers' metrics, scraped every `scrape_s` (sim/exposition.py),
through the direct-scrape source's arithmetic. The simulated state and the policy contract are in
sim/model.py.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from typing import cast

from tandem import names
from tandem.operator.autoscale.core.types import Pool, Replicas
from tandem.operator.autoscale.sim.exposition import Exposition
from tandem.operator.autoscale.sim.model import Control as Control
from tandem.operator.autoscale.sim.model import Controller as Controller
from tandem.operator.autoscale.sim.model import Replica as Replica
from tandem.operator.autoscale.sim.model import Request as Request
from tandem.operator.autoscale.sim.model import SimConfig as SimConfig
from tandem.operator.autoscale.sim.model import SimResult as SimResult
from tandem.operator.autoscale.sim.model import Snapshot as Snapshot
from tandem.operator.autoscale.sources.observation import observation
from tandem.trace import TraceRequest


class Simulation:
    def __init__(self, trace: Sequence[TraceRequest], config: SimConfig, controller: Controller):
        self.cfg, self.controller, self.profile = config, controller, config.profile
        self.requests = [
            Request(i, r.arrival_s, max(r.input_len, 1), max(r.output_len, 1)) for i, r in enumerate(trace)
        ]
        self.events: list[tuple[float, int, int, str, object]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.replicas: dict[Pool, list[Replica]] = {Pool.prefill: [], Pool.decode: [], Pool.colocated: []}
        self._ids = itertools.count()
        self.gpu_seconds = 0.0
        self._billed_at = 0.0
        self.timeline: list[tuple[float, int, int]] = []
        self.latency_timeline: list[tuple[float, float | None, float | None]] = []
        self.actions: dict[Pool, list[tuple[float, int, int]]] = {pool: [] for pool in self.replicas}
        self.flips: list[tuple[float, Pool, Pool, int]] = []
        self.exposition = Exposition(config.window_s)
        self._pending_prefill: deque[Request] = deque()  # arrived while no prefill replica was ready
        self._pending_decode: deque[Request] = deque()
        self._arrival_times = [r.arrival_s for r in self.requests]
        self._busy_marks: dict[int, list[tuple[float, float]]] = {}
        for pool, n in config.initial.items():
            for _ in range(n):
                self._add_replica(pool, ready_at_s=0.0)

    # --- the event loop ------------------------------------------------------------------------------
    def _push(self, at_s: float, kind: str, payload: object) -> None:
        # a scrape goes first among events at one instant: a tick then reads what was true at that instant
        heapq.heappush(self.events, (at_s, kind != "scrape", next(self._seq), kind, payload))

    def run(self) -> SimResult:
        self._push(0.0, "scrape", None)  # the router's counters before any traffic
        for r in self.requests:
            self._push(r.arrival_s, "arrive", r)
        end_of_arrivals = self.requests[-1].arrival_s if self.requests else 0.0
        self._push(self.cfg.interval_s, "tick", None)
        while self.events:
            at_s, _, _, kind, payload = heapq.heappop(self.events)
            if kind in ("tick", "scrape") and at_s > end_of_arrivals and self._all_done():
                break
            self._bill(at_s)
            self.now = at_s
            getattr(self, "_on_" + kind)(payload)
        self._bill(self.now)
        return SimResult(
            self.requests,
            self.now,
            self.gpu_seconds,
            self.timeline,
            self.latency_timeline,
            self.actions,
            self.flips,
        )

    def _all_done(self) -> bool:
        return all(r.finish_s is not None or r.failed for r in self.requests)

    def _billed(self, pool: Pool) -> list[Replica]:
        return [r for r in self.replicas[pool] if r.gone_s is None]

    def _bill(self, until_s: float) -> None:
        billed = sum(len(self._billed(pool)) for pool in self.replicas)
        self.gpu_seconds += billed * self.cfg.gpus_per_replica * max(until_s - self._billed_at, 0.0)
        self._billed_at = until_s

    # --- replicas ------------------------------------------------------------------------------------
    def _add_replica(self, pool: Pool, ready_at_s: float) -> Replica:
        rep = Replica(next(self._ids), pool, ready_at_s=ready_at_s, started_s=self.now)
        self.replicas[pool].append(rep)
        if ready_at_s > self.now:
            self._push(ready_at_s, "ready", rep)
        return rep

    def _on_ready(self, rep: Replica) -> None:
        if rep.gone_s is None and not rep.draining:
            self._dispatch_waiting(rep.pool)

    def _scale(self, pool: Pool, desired: int) -> None:
        live = [r for r in self._billed(pool) if not r.draining]
        current = len(live) + self._incoming(pool)
        desired = max(desired, 0)
        if desired == current:
            return
        self.actions[pool].append((self.now, current, desired))
        if desired > current:
            for _ in range(desired - current):
                self._add_replica(pool, self.now + self.cfg.cold_start)
            return
        # Remove the ones still starting first, then one that flipped roles (its pod's deletion cost says so),
        # then the ready ones with the least work.
        order = sorted(live, key=lambda r: (r.ready_at_s <= self.now, not r.flipped, self._work(r)))
        for rep in order[: current - desired]:
            if rep.ready_at_s > self.now or (self.cfg.drain and rep.idle()):
                rep.gone_s = self.now
            elif self.cfg.drain:
                rep.draining = True
            else:
                self._kill(rep)

    def _work(self, rep: Replica) -> int:
        return rep.queued_tokens if rep.pool == Pool.prefill else len(rep.running) + len(rep.waiting)

    def _kill(self, rep: Replica) -> None:
        lost = list(rep.queue) + list(rep.running) + list(rep.waiting)
        lost += rep.serving
        for req in lost:
            req.failed = True
        rep.queue.clear()
        rep.running.clear()
        rep.waiting.clear()
        rep.serving, rep.queued_tokens, rep.gone_s = [], 0, self.now
        rep.version += 1

    def _retire_if_drained(self, rep: Replica) -> None:
        if rep.draining and rep.idle() and rep.gone_s is None:
            self._drained(rep)

    def _drained(self, rep: Replica) -> None:
        rep.gone_s = self.now

    def _incoming(self, pool: Pool) -> int:
        """Workers on their way to this role from the other (none without flips)."""
        return 0

    # --- prefill -------------------------------------------------------------------------------------
    def _on_arrive(self, req: Request) -> None:
        self.exposition.arrived(req.input_len)
        self._to_prefill(req)

    def _to_prefill(self, req: Request) -> None:
        ready = [r for r in self.replicas[Pool.prefill] if r.ready(self.now)]
        if not ready:
            self._pending_prefill.append(req)
            return
        rep = min(ready, key=lambda r: (r.queued_tokens, r.id))
        rep.queue.append(req)
        rep.queued_tokens += req.input_len
        if not rep.serving:
            self._start_prefill(rep)

    def _dispatch_waiting(self, pool: Pool) -> None:
        pending = self._pending_prefill if pool == Pool.prefill else self._pending_decode
        while pending and any(r.ready(self.now) for r in self.replicas[pool]):
            req = pending.popleft()
            (self._to_prefill if pool == Pool.prefill else self._to_decode)(req)

    def _start_prefill(self, rep: Replica) -> None:
        """One prefill step: the queue's head, with the prompts behind it while the step's tokens fit the
        profile's chunk (an engine batches prompts into a step); its time is the profile's for the sum."""
        batch = [rep.queue.popleft()]
        tokens = batch[0].input_len
        while rep.queue and tokens + rep.queue[0].input_len <= self.profile.prefill_chunk_tokens:
            tokens += rep.queue[0].input_len
            batch.append(rep.queue.popleft())
        rep.serving = batch
        service = self.profile.prefill_ms(tokens) / 1000
        rep.busy_until_s = self.now + service
        rep.busy_s += service
        self._push(rep.busy_until_s, "prefilled", (rep, rep.version))

    def _on_prefilled(self, payload: object) -> None:
        rep, version = cast(tuple[Replica, int], payload)
        if version != rep.version or not rep.serving:
            return
        batch, rep.serving = rep.serving, []
        for req in batch:
            rep.queued_tokens -= req.input_len
            req.first_token_s = self.now
            self.exposition.first_token(req.first_token_s - req.arrival_s)
            transfer = self.profile.kv_transfer_ms_per_token * req.input_len / 1000
            if req.output_len <= 1:
                req.finish_s = self.now
                self.exposition.finished(None, req.output_len)
            else:
                self._push(self.now + transfer, "kv_landed", req)
        if rep.queue:
            self._start_prefill(rep)
        else:
            self._retire_if_drained(rep)

    # --- decode --------------------------------------------------------------------------------------
    def _on_kv_landed(self, req: Request) -> None:
        if not req.failed:
            self._to_decode(req)

    def _to_decode(self, req: Request) -> None:
        ready = [r for r in self.replicas[Pool.decode] if r.ready(self.now)]
        if not ready:
            self._pending_decode.append(req)
            return
        rep = min(ready, key=lambda r: (len(r.running) + len(r.waiting), r.id))
        self._advance(rep)
        req.remaining = req.output_len - 1  # the first token came from prefill
        rep.waiting.append(req)
        if not rep.running:
            self._resegment(rep)
            return
        # A running batch admits newcomers at its next step boundary.
        steps = math.ceil((self.now - rep.segment_start_s) / rep.step_s - 1e-9)
        rep.version += 1
        self._push(rep.segment_start_s + steps * rep.step_s, "decoded", (rep, rep.version))

    def _context(self, rep: Replica) -> float:
        if not rep.running:
            return 1.0
        return sum(r.input_len + (r.output_len - 1 - r.remaining) for r in rep.running) / len(rep.running)

    def _advance(self, rep: Replica) -> None:
        """Bring the running batch up to the last step boundary at or before now."""
        if not rep.running or rep.step_s <= 0:
            rep.segment_start_s = max(rep.segment_start_s, self.now)
            return
        steps = math.floor((self.now - rep.segment_start_s) / rep.step_s + 1e-9)
        if steps <= 0:
            return
        for r in rep.running:
            r.remaining -= steps
        rep.segment_start_s += steps * rep.step_s
        self._finish_done(rep)

    def _finish_done(self, rep: Replica) -> None:
        done = [r for r in rep.running if r.remaining <= 0]
        if not done:
            return
        rep.running = [r for r in rep.running if r.remaining > 0]
        for r in done:
            r.finish_s = rep.segment_start_s
            assert r.first_token_s is not None
            tpot = (r.finish_s - r.first_token_s) / (r.output_len - 1)
            self.exposition.finished(tpot, r.output_len)

    def _resegment(self, rep: Replica) -> None:
        """Admit waiting sequences (batch and KV caps), then schedule the next completion."""
        if not rep.running:
            rep.segment_start_s = max(rep.segment_start_s, self.now)
        cap = self.profile.max_running_sequences
        kv = sum(r.input_len + r.output_len for r in rep.running)
        while rep.waiting and len(rep.running) < cap:
            nxt = rep.waiting[0]
            if rep.running and kv + nxt.input_len + nxt.output_len > self.profile.kv_capacity_tokens:
                break
            rep.waiting.popleft()
            nxt.decode_start_s = rep.segment_start_s
            rep.running.append(nxt)
            kv += nxt.input_len + nxt.output_len
        rep.version += 1
        self._decode_to_next_finish(rep)

    def _decode_to_next_finish(self, rep: Replica) -> None:
        """Plain decode steps from the segment's start until the batch's first sequence finishes; an idle
        replica is retired if it drains."""
        if not rep.running:
            rep.step_s = 0.0
            self._retire_if_drained(rep)
            return
        rep.step_s = self.profile.decode_step_ms(len(rep.running), self._context(rep)) / 1000
        steps = min(r.remaining for r in rep.running)
        self._push(rep.segment_start_s + steps * rep.step_s, "decoded", (rep, rep.version))

    def _on_decoded(self, payload: object) -> None:
        rep, version = cast(tuple[Replica, int], payload)
        if version != rep.version:
            return
        self._advance(rep)
        self._resegment(rep)

    # --- the policy ----------------------------------------------------------------------------------
    def _on_tick(self, _: object) -> None:
        snap = self.snapshot()
        obs = snap.observations
        front, back = (
            obs.get(Pool.prefill) or obs[Pool.colocated],
            obs.get(Pool.decode) or obs[Pool.colocated],
        )
        self.latency_timeline.append((self.now, front.ttft_ms, back.tpot_ms))
        self._act(self.controller(snap))
        self.timeline.append((self.now, len(self._billed(Pool.prefill)), len(self._billed(Pool.decode))))
        self._push(self.now + self.cfg.interval_s, "tick", None)

    def _act(self, out: dict[Pool, int] | Control) -> None:
        if isinstance(out, Control):
            if out.flips:
                raise ValueError("this simulation does not flip roles: use sim/flipping.py")
            out = out.replicas
        for pool, desired in out.items():
            self._scale(pool, desired)

    def _on_scrape(self, _: object) -> None:
        """Prometheus scrapes the router and every worker process that is up (starting ones are not yet)."""
        up = {
            pool: [r for r in self.replicas[pool] if r.gone_s is None and r.ready_at_s <= self.now]
            for pool in self.replicas
        }
        for rep in up[Pool.decode]:
            self._advance(rep)
        cap = float(self.profile.kv_capacity_tokens)
        gauges = {
            Pool.prefill: {
                str(r.id): {names.PREFILL_QUEUED_TOKENS: float(r.queued_tokens)} for r in up[Pool.prefill]
            },
            Pool.decode: {
                str(r.id): {
                    names.DECODE_RUNNING_SEQUENCES: float(len(r.running)),
                    names.KV_BLOCKS_USED: float(sum(q.input_len + q.output_len for q in r.running)),
                    names.KV_BLOCKS_TOTAL: cap,
                }
                for r in up[Pool.decode]
            },
        }
        if up[Pool.colocated]:  # colocated workers report both roles' gauges (sim/auto.py)
            for rep in up[Pool.colocated]:
                self._advance(rep)
            gauges[Pool.colocated] = {
                str(r.id): {
                    names.PREFILL_QUEUED_TOKENS: float(r.queued_tokens),
                    names.DECODE_RUNNING_SEQUENCES: float(len(r.running)),
                    names.KV_BLOCKS_USED: float(sum(q.input_len + q.output_len for q in r.running)),
                    names.KV_BLOCKS_TOTAL: cap,
                }
                for r in up[Pool.colocated]
            }
        self.exposition.scrape(self.now, gauges)
        self._push(self.now + self.cfg.scrape_s, "scrape", None)

    def snapshot(self) -> Snapshot:
        window = self.cfg.window_s
        lo = self.now - window
        obs = {
            pool: observation(
                pool,
                self.exposition.observed(pool, self.cfg.percentile),
                self._replica_counts(pool),
                self.now,
                window,
            )
            for pool in self._observed_pools()
        }
        # The raw replicas, for the load-based baselines that read the engines' own state.
        pre = [r for r in self.replicas[Pool.prefill] if r.ready(self.now)]
        dec = [r for r in self.replicas[Pool.decode] if r.ready(self.now)]
        for rep in dec:
            self._advance(rep)
        prompts = [r.input_len for r in self._arrivals_between(lo, self.now)]
        busy = [self._busy_share(r, lo) for r in pre]
        contexts = [self._context(r) for r in dec if r.running]
        return Snapshot(
            self.now,
            obs,
            [r.queued_tokens for r in pre],
            [len(r.running) + len(r.waiting) for r in dec],
            sum(busy) / len(busy) if busy else 0.0,
            sum(contexts) / len(contexts) if contexts else (sum(prompts) / len(prompts) if prompts else 1.0),
        )

    def _observed_pools(self) -> tuple[Pool, ...]:
        """The pools the policy is shown (split pools; sim/auto.py adds the colocated one)."""
        return (Pool.prefill, Pool.decode)

    def _arrivals_between(self, lo: float, hi: float) -> list[Request]:
        i, j = bisect.bisect_right(self._arrival_times, lo), bisect.bisect_right(self._arrival_times, hi)
        return self.requests[i:j]

    def _busy_share(self, rep: Replica, since_s: float) -> float:
        """Share of the window the replica spent serving (the busy time it accrued, spread over the
        window)."""
        hist = self._busy_marks.setdefault(rep.id, [])
        busy_now = rep.busy_s - max(rep.busy_until_s - self.now, 0.0)
        hist.append((self.now, busy_now))
        while len(hist) > 1 and hist[1][0] <= since_s:
            hist.pop(0)
        t0, b0 = hist[0]
        span = self.now - t0
        return (busy_now - b0) / span if span > 0 else (1.0 if rep.serving else 0.0)

    def _replica_counts(self, pool: Pool) -> Replicas:
        live = self._billed(pool)
        return Replicas(
            ready=sum(1 for r in live if r.ready(self.now)),
            starting=sum(1 for r in live if not r.draining and r.ready_at_s > self.now)
            + self._incoming(pool),
            draining=sum(1 for r in live if r.draining and r.flip_to is None),
        )


def simulate(trace: Sequence[TraceRequest], config: SimConfig, controller: Controller) -> SimResult:
    return Simulation(trace, config, controller).run()


def scale_trace(
    trace: Sequence[TraceRequest], time_scale: float = 1.0, rate_scale: float = 1.0
) -> list[TraceRequest]:
    """Compress time `time_scale` times; then keep every request `rate_scale` times (fractions by a fixed
    stride, so the result is deterministic): rate_scale 2 sends each request twice, 0.5 every other one."""
    out: list[TraceRequest] = []
    credit = 0.0
    for r in trace:
        credit += rate_scale
        copies = int(credit + 1e-9)
        credit -= copies
        for k in range(copies):
            out.append(TraceRequest(r.arrival_s / time_scale + k * 1e-6, r.input_len, r.output_len))
    return out
