"""The router's gRPC backend: routes each request over the pools (membership.py), runs it on the workers it
picks (attempt.py), retries.

Disaggregated: reserve blocks on a decode worker, open its token stream, ask a prefill worker to run the
prompt and push the KV there, then relay tokens; or, when conditional disaggregation says the transfer is not
worth it (disaggregation.py), let the decode worker prefill the prompt itself. Colocated workers of a
disaggregated service (a worker that took the colocated role, as `mode: auto` does when a split does not pay)
stand beside the decode pool: one picked where a decode worker would be runs the request whole. A worker that
fails before the first token is marked unhealthy and the request is retried elsewhere; after the first token a
failure ends the stream with an error.

Scaling down never cuts a stream: a worker that refuses work because it drains is taken out of rotation
at once (and by its next load report), and a worker that leaves the membership keeps its channel until
the requests it holds have finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from tandem.worker.api.params import SamplingParams
from tandem.worker.api.tls import TlsConfig
from tandem.worker.kv_transport.handshake import DEFAULT_LEASE_MS, check_compatible
from tandem.worker.router.attempt import Retry, generate_on, reserve_prefill_relay
from tandem.worker.router.backend import COLD_START_S, BackendError, Timing, TokenOut
from tandem.worker.router.disaggregation import (
    DisaggregationMode,
    DisaggregationPolicy,
    PrefillRoute,
    choose_prefill,
    pick_mixed,
)
from tandem.worker.router.membership import STUBS, Pools, Worker
from tandem.worker.router.pairing import connected_now
from tandem.worker.router.selection import WorkerView, pick_decode, pick_prefill
from tandem.worker.router.wake_queue import WakeLimits, WakeQueue

log = logging.getLogger(__name__)


class GrpcBackend:
    def __init__(
        self,
        mode: str,
        addresses: dict[str, list[str]],
        workers_file: str | None = None,
        block_size: int = 16,
        max_attempts: int = 3,
        poll_interval_s: float = 0.5,
        lease_ms: int = DEFAULT_LEASE_MS,
        tls: TlsConfig | None = None,
        disaggregation: DisaggregationPolicy | None = None,
        tpot_slo_s: float = 0.0,
        wake: WakeLimits | None = None,
    ):
        self.mode, self.block_size, self.max_attempts = mode, block_size, max_attempts
        self.disaggregation = disaggregation or DisaggregationPolicy()
        self.tpot_slo_s = tpot_slo_s  # what conditional disaggregation keeps local prefills from breaking
        self.poll_interval_s, self.lease_ms = poll_interval_s, lease_ms
        self.pools = Pools(addresses, workers_file, tls)
        self.wake_queue = WakeQueue(wake)
        self.inflight = 0
        self._poller: asyncio.Task | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.pools.refresh()
        await self.pools.poll_all()
        self._poller = asyncio.create_task(self.pools.poll_forever(self._poll_interval))

    def _poll_interval(self) -> float:
        """Poll faster while requests wait for a pool to wake: they start once its first worker answers."""
        return (
            min(self.poll_interval_s, WAKE_POLL_INTERVAL_S) if len(self.wake_queue) else self.poll_interval_s
        )

    async def close(self) -> None:
        if self._poller:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.pools.close()

    def needed_roles(self) -> list[str]:
        """The pools every request needs (conditional disaggregation and mode auto prefill locally when
        prefill has none; a routable colocated worker serves a request whole)."""
        if self.mode == "colocated":
            return ["colocated"]
        if (
            self.disaggregation.mode is DisaggregationMode.always
            and self.mode != "auto"
            and not self._routable("colocated")
        ):
            return ["prefill", "decode"]
        return ["decode"]  # never: every prompt is prefilled where it decodes; conditional: it may be

    def ready(self) -> bool:
        """Every needed pool can take a request now, or has no worker at all and requests wait for it to
        wake (a pool scaled to zero must not take the router out of its Service). Workers that joined and
        never answered keep it unready, as at start."""
        never = (
            self.disaggregation.mode is DisaggregationMode.never
            or self.mode == "auto"
            or self._routable("colocated")
        )
        roles = self.needed_roles() if self.mode == "colocated" or never else ["prefill", "decode"]
        holds = self.wake_queue.limits.max_requests > 0
        return all(self._routable(r) or (holds and not self.pools.workers[r]) for r in roles)

    def _sides(self, role: str) -> tuple[str, ...]:
        """The pools that can take `role`'s part of a request: a colocated worker takes a decode worker's
        (and its prompt with it) in a disaggregated service."""
        return ("decode", "colocated") if role == "decode" and self.mode != "colocated" else (role,)

    def _views(self, role: str) -> list[WorkerView]:
        return [v for side in self._sides(role) for v in self.pools.views(side)]

    def _routable(self, role: str) -> bool:
        return any(v.routable for v in self._views(role))

    def _may_wake(self, role: str) -> bool:
        """No worker of `role` is routable, and one may be soon: the pool is at zero or going there (its last
        workers drain, as a scale-down's or a flip's do), or a worker of it is starting (joined, or moved here
        by a flip, and never answered or its KV channels not yet tried). A pool whose workers all failed is
        refused at once, not held."""
        members = [w for side in self._sides(role) for w in self.pools.workers[side].values()]
        starting = any(w.info is None or w.view.warming for w in members)
        return not self._routable(role) and (starting or all(w.view.draining for w in members))

    def queue_depth(self) -> int:
        return self.inflight

    def discovery_stale(self) -> int:
        """Worker names whose last lookup failed, served from their last good addresses."""
        return len(self.pools.stale_names)

    def connected_workers(self) -> dict[str, int]:
        """Workers whose channel from the router is connected now, by pool."""
        return {
            role: sum(connected_now(w.channel) for w in self.pools.workers[role].values()) for role in STUBS
        }

    def kv_pairs_connected(self) -> int:
        """Prefill-decode pairs whose KV channel the prefill worker has connected."""
        return len(self.pools.kv_pairing.connected)

    def routable_workers(self) -> dict[str, int]:
        return {role: sum(v.routable for v in self.pools.views(role)) for role in STUBS}

    def _blocks_needed(self, num_tokens: int) -> int:
        sizes = [
            w.info.block_size
            for side in self._sides("decode")
            for w in self.pools.workers[side].values()
            if w.info and w.info.block_size
        ]
        return -(-num_tokens // (sizes[0] if sizes else self.block_size))

    def _pick(self, role: str, tried: set[str], blocks_needed: int = 0) -> Worker:
        views = self._views(role)
        view = pick_decode(views, blocks_needed, tried) if role == "decode" else pick_prefill(views, tried)
        if view is None:
            view = (
                pick_decode(views, blocks_needed) if role == "decode" else pick_prefill(views)
            )  # retry a tried one
        if view is None:
            raise BackendError(f"no healthy {role} worker", status=503, retry_after_s=1)
        view.last_picked = time.monotonic()
        return next(
            self.pools.workers[side][view.address]
            for side in self._sides(role)
            if view.address in self.pools.workers[side]
        )

    # --- requests -----------------------------------------------------------------------------
    async def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, timing: Timing
    ) -> AsyncIterator[TokenOut]:
        self.inflight += 1
        try:
            waking = [r for r in self.needed_roles() if self._may_wake(r)]
            if waking:  # a pool at zero: wait for its first worker instead of refusing (wake_queue.py)
                waited = await self.wake_queue.hold(waking, lambda r: not self._may_wake(r))
                if waited:
                    timing.extra[COLD_START_S] = waited
            tried: set[str] = set()
            for attempt in range(self.max_attempts):
                timing.retries = attempt
                started = False
                attempt_id = request_id if attempt == 0 else f"{request_id}-r{attempt}"
                try:
                    run = self._colocated if self.mode == "colocated" else self._disaggregated
                    async for token in run(attempt_id, prompt_ids, params, timing, tried):
                        started = True
                        yield token
                    return
                except Retry as e:
                    if started:
                        raise BackendError(f"worker failed mid-stream: {e}", status=503) from None
                    log.warning(
                        "request %s attempt %d failed before the first token: %s", request_id, attempt, e
                    )
            raise BackendError(f"request failed on {self.max_attempts} attempts", status=503, retry_after_s=1)
        finally:
            self.inflight -= 1

    async def _pick_or_wait(self, role: str, tried: set[str], blocks_needed: int = 0) -> Worker:
        """`_pick`; with no routable worker (a retry after the only one began to drain for a flip or a
        scale-down, its successor not polled yet), poll every worker at once, then hold the request in the
        wake queue while the pool is only momentarily empty, until a worker of it answers (within the
        queue's bounds), instead of refusing with a 503. A pool whose workers failed is refused at once."""
        polled = False
        while True:
            try:
                return self._pick(role, tried, blocks_needed)
            except BackendError:
                if polled and not self._may_wake(role):
                    raise
            if polled:
                await self.wake_queue.hold([role], lambda r: not self._may_wake(r))
            else:
                await self.pools.refresh()
                await (
                    self.pools.poll_all()
                )  # every role: a worker that took this role moves here as it is polled
                polled = True

    async def _colocated(self, request_id, prompt_ids, params, timing, tried) -> AsyncIterator[TokenOut]:
        worker = await self._pick_or_wait("colocated", tried)
        timing.prefill = "colocated"
        async for token in generate_on(worker, request_id, prompt_ids, params, timing, tried):
            yield token

    async def _disaggregated(self, request_id, prompt_ids, params, timing, tried) -> AsyncIterator[TokenOut]:
        blocks = self._blocks_needed(len(prompt_ids) + params.max_tokens)
        decode = await self._pick_or_wait("decode", tried, blocks)
        if (
            decode.role == "colocated"
        ):  # a colocated worker stands in for the decode pool: the request runs whole
            timing.prefill = "colocated"
            async for token in generate_on(decode, request_id, prompt_ids, params, timing, tried):
                yield token
            return
        decision = choose_prefill(
            self.disaggregation,
            len(prompt_ids),
            self.pools.views("prefill"),
            decode.view,
            blocks,
            tpot_slo_s=self.tpot_slo_s,
        )
        # a prompt scored for its logprobs runs where it is answered: its scores come with the first token
        route = PrefillRoute.local if params.prompt_logprobs is not None else decision.route
        if self.mode == "auto" and not self._routable(
            "prefill"
        ):  # an empty prefill pool is a change of shape
            route = PrefillRoute.local  # under way (a collapse): the decode worker prefills, nothing waits
        untried = [v for v in self.pools.views("prefill") if v.address not in tried]
        mixed = pick_mixed(self.disaggregation, untried, decode.view, blocks, self.tpot_slo_s, route)
        if mixed is not None:  # the decode pool is the busier: a prefill worker runs this request whole
            timing.prefill = PrefillRoute.mixed.value
            mixed.last_picked = time.monotonic()
            worker = self.pools.workers["prefill"][mixed.address]
            async for token in generate_on(worker, request_id, prompt_ids, params, timing, tried):
                yield token
            return
        timing.prefill = route.value
        if route is PrefillRoute.local:  # no transfer: the decode worker prefills the prompt itself
            async for token in generate_on(decode, request_id, prompt_ids, params, timing, tried):
                yield token
            return
        prefill = await self._pick_or_wait("prefill", tried)
        tried.update({decode.view.address, prefill.view.address})
        if prefill.info is not None and decode.info is not None:
            problems = check_compatible(prefill.info, decode.info)
            if problems:  # refuse rather than move KV that would decode into garbage
                raise BackendError(
                    f"prefill worker {prefill.view.address} cannot send KV to decode worker "
                    f"{decode.view.address}: " + "; ".join(problems),
                    status=503,
                )
        timing.decode_worker, timing.prefill_worker = decode.view.address, prefill.view.address
        decode.in_use += 1
        prefill.in_use += 1
        try:
            async for token in reserve_prefill_relay(
                request_id, prompt_ids, params, timing, decode, prefill, self.lease_ms
            ):
                yield token
        finally:
            decode.in_use -= 1
            prefill.in_use -= 1


WAKE_POLL_INTERVAL_S = 0.1  # the worker poll interval while requests wait for a pool to wake
