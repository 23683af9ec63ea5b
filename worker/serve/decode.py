"""The decode worker's gRPC service: reserve blocks for a transfer, take the pushed KV, stream tokens; or
prefill a short prompt itself (Generate) when the router decides a transfer is not worth it.

Blocks are reserved under a lease. A reservation that is aborted, fails or expires gives its blocks back
and ends the waiting token stream with an error; a committed one is admitted straight into the running
batch, its first token (computed by the prefill worker) first in its stream. A token queue whose
StreamTokens never opens (the router crashed or gave up between Reserve and the stream) is dropped, with
its reservation or sequence, when the lease runs out, so it never holds blocks or a drain.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc

from tandem.periodic import Every
from tandem.v1 import common_pb2, decode_pb2
from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.api.wire import params_from_proto
from tandem.worker.engine.core.block_manager import OutOfBlocks
from tandem.worker.engine.runner.engine import StepOutput
from tandem.worker.engine.runner.engine_loop import EngineLoop, StreamEnd
from tandem.worker.kv_transport import transports
from tandem.worker.kv_transport.base import KvLayout
from tandem.worker.kv_transport.grpc_stream import add_decode_service
from tandem.worker.kv_transport.handshake import (
    DEFAULT_LEASE_MS,
    check_compatible,
    reserve_transport,
    reserve_transports,
)
from tandem.worker.kv_transport.pairing_log import PairingLog, transport_label
from tandem.worker.kv_transport.receiver import Committed, KvReceiver
from tandem.worker.kv_transport.reservations import Released
from tandem.worker.kv_transport.staging import StagingPool, StagingRing
from tandem.worker.serve.colocated import generate_tokens
from tandem.worker.serve.drain import refuse_while_draining
from tandem.worker.serve.rpc_end import on_rpc_end
from tandem.worker.serve.rpc_limits import Slots
from tandem.worker.serve.wire import load_report, token_event

log = logging.getLogger(__name__)


@dataclass
class Output:
    """A request's token queue, and until a StreamTokens reads it, the monotonic time it is dropped at."""

    queue: queue.Queue[StepOutput | StreamEnd]
    unclaimed_until: float | None = None


def unclaimed_expired(outputs: dict[str, Output], now: float) -> list[str]:
    """Requests whose token queue no stream has opened within its lease (pure)."""
    return [rid for rid, o in outputs.items() if o.unclaimed_until is not None and now >= o.unclaimed_until]


@dataclass
class Pending:
    """A reservation waiting for its KV: what to admit once it commits."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    block_table: list[int]
    ring: StagingRing | None = None
    transport: int = common_pb2.KV_TRANSPORT_GRPC  # the pool `ring` goes back to


class DecodeServicer:
    def __init__(
        self,
        loop: EngineLoop,
        info: common_pb2.WorkerInfo,
        staging: Mapping[int, StagingPool] | None = None,
        expire_every_s: float = 0.25,
        max_lease_ms: int = DEFAULT_LEASE_MS,
        kv_authenticated: bool = False,
    ):
        self.loop, self.info = loop, info
        self.staging = dict(staging or {})  # by transport: the rings it lends one reservation at a time
        self.max_lease_ms = max_lease_ms  # the service's lease: a Reserve asking longer gets this
        self.kv_authenticated = kv_authenticated  # pushes come only from a prefill identity of this service
        self.layout = KvLayout.from_worker_info(info)
        self.receiver = KvReceiver(
            loop.engine.kv,
            self.layout,
            on_release=self._released,
            on_commit=self._committed,
            vocab_size=loop.engine.model.config.vocab_size,
        )
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}  # transfer_id -> what to admit
        self._outputs: dict[str, Output] = {}  # request_id -> token queue
        self.draining = False
        self._reserving = 0  # Reserve RPCs past the draining check, not yet pending
        self._generating = 0  # local-prefill Generate streams accepted and not yet ended
        self.stream_slots: Slots | None = None  # the server's bound on token streams, when it has one
        self.load_of: Callable[[], common_pb2.LoadReport] | None = None  # the worker's current role's report
        self.pairings = PairingLog(log)
        self._expiry = Every(expire_every_s, self._expire, "kv-lease-expiry").start()

    def close(self) -> None:
        """Stop the expiry thread and unlink the shared-memory staging rings (the worker is exiting)."""
        self._expiry.stop()
        for pool in self.staging.values():
            pool.close()

    def activate(self, active: bool) -> None:
        """Nothing to take or give up: KV arrives and tokens stream only for reservations this role made."""

    def busy(self) -> int:
        """Reservations waiting for KV, token streams not yet ended, and sequences in the engine."""
        load = self.loop.snapshot
        with self._lock:
            held = self._reserving + self._generating + len(self._pending) + len(self._outputs)
            return held + load.running + load.waiting

    # --- RPCs ---------------------------------------------------------------------------------
    def Handshake(
        self, request: common_pb2.HandshakeRequest, context: grpc.ServicerContext
    ) -> common_pb2.HandshakeReply:
        peer = request.peer
        if not peer.num_layers:  # no peer named: nothing to check or choose
            return common_pb2.HandshakeReply(worker=self.info, transport=common_pb2.KV_TRANSPORT_UNSPECIFIED)
        transport = reserve_transport(peer.transports, peer.host_id, self.info, peer.cuda_device_uuid)
        self.pairings.note(
            peer.worker_id,
            transport,
            "handshake: KV from prefill worker %s would come over %s",
            peer.worker_id,
        )
        return common_pb2.HandshakeReply(  # the transport a Reserve from this peer would be granted
            worker=self.info, problems=check_compatible(peer, self.info), transport=transport
        )

    def Reserve(
        self, request: decode_pb2.ReserveRequest, context: grpc.ServicerContext
    ) -> decode_pb2.ReserveReply:
        with self._lock:
            if self.draining:
                refuse_while_draining(context, "decode worker")
            if self.stream_slots is not None:  # its StreamTokens would be refused: say so before any prefill
                waiting = sum(o.unclaimed_until is not None for o in self._outputs.values()) + self._reserving
                if waiting >= self.stream_slots.room:
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"decode worker at its limit of {self.stream_slots.limit} token streams; try another "
                        "worker",
                    )
            self._reserving += 1
        try:
            return self._reserve(request, context)
        finally:
            with self._lock:
                self._reserving -= 1

    def _reserve(
        self, request: decode_pb2.ReserveRequest, context: grpc.ServicerContext
    ) -> decode_pb2.ReserveReply:
        prompt = list(request.prompt_token_ids)
        try:
            params = params_from_proto(request.sampling)
            block_table, cached = self.loop.call(lambda e: e.reserve(prompt, params))
        except InvalidRequest as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except OutOfBlocks as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        first = cached // self.layout.block_size
        to_fill = block_table[first:]
        choices = reserve_transports(
            request.transports, request.prefill_host_id, self.info, request.prefill_cuda_device_uuid
        )
        if not choices:
            self.loop.call(lambda e: e.release(block_table))
            offered = [common_pb2.KvTransport.Name(t) for t in request.transports]
            mine = [common_pb2.KvTransport.Name(t) for t in self.info.transports]
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no KV transport in common: the prefill worker offers {offered}, this decode worker {mine}",
            )
        lease_s = min(request.lease_ms or self.max_lease_ms, self.max_lease_ms) / 1000
        with self._lock:
            self._outputs[request.request_id] = Output(queue.Queue(), time.monotonic() + lease_s)
        res = self.receiver.reserve(request.transfer_id, request.request_id, to_fill, lease_s)
        transport, ring = self._lend(choices, res.epoch)
        if transport is None:  # staged transports only, every ring lent: the router retries elsewhere
            self.receiver.abort(request.transfer_id, request.request_id, "no staging ring free")
            with self._lock:
                self._outputs.pop(request.request_id, None)
            self.loop.call(lambda e: e.release(block_table))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "every staging ring is in use")
        assert transport is not None  # context.abort raised otherwise
        asked = ", ".join(transport_label(t) for t in request.transports) or "grpc"
        self.pairings.note(
            request.prefill_host_id,
            transport,
            "KV from prefill workers on host %r (offering %s) comes over %s",
            request.prefill_host_id,
            asked,
        )
        res.staging = ring
        with self._lock:
            self._pending[request.transfer_id] = Pending(
                request.request_id, prompt, params, block_table, ring, transport
            )
        if not context.is_active():  # the router gave up while this ran: it may never send the Abort
            self._drop(request.request_id, request.transfer_id, "reserve cancelled")
        return decode_pb2.ReserveReply(
            block_ids=to_fill,
            num_cached_tokens=cached,
            epoch=res.epoch,
            lease_deadline_ms=int((time.time() + lease_s) * 1000),
            transport=transport,
            first_block_index=first,
            **(transports.by_kind(transport).describe(ring) if ring is not None else {}),
        )

    def _lend(self, choices: list[int], epoch: int) -> tuple[int | None, StagingRing | None]:
        """The first transport, best first, that can carry this transfer now: an inline one, or a staged one
        with a ring free (every ring lent: the next one instead)."""
        for kind in choices:
            if not transports.by_kind(kind).staged:
                return kind, None
            pool = self.staging.get(kind)
            ring = pool.lend(epoch) if pool is not None else None
            if ring is not None:
                return kind, ring
        return None, None

    def StreamTokens(self, request: decode_pb2.StreamTokensRequest, context: grpc.ServicerContext):
        with self._lock:
            output = self._outputs.get(request.request_id)
            if output is not None:
                output.unclaimed_until = None  # read from now on: the stream's end drops it
        if output is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no reservation or sequence for {request.request_id}")
            return
        stream = output.queue
        on_rpc_end(context, lambda: self._client_gone(request.request_id))
        try:
            for index, item in enumerate(EngineLoop.iterate(stream)):
                yield token_event(request.request_id, item, index)
        finally:
            with self._lock:
                self._outputs.pop(request.request_id, None)

    def Generate(self, request: common_pb2.GenerateRequest, context: grpc.ServicerContext):
        """Prefill locally and stream the tokens; Abort by request_id (or the stream closing) frees the
        blocks."""
        with self._lock:
            if self.draining:
                refuse_while_draining(context, "decode worker")
            self._generating += 1
        try:
            yield from generate_tokens(self.loop, request, context)
        finally:
            with self._lock:
                self._generating -= 1

    def Abort(self, request: decode_pb2.AbortRequest, context: grpc.ServicerContext) -> decode_pb2.AbortReply:
        released, running = self._drop(request.request_id, request.transfer_id, request.reason or "aborted")
        freed = sum(len(r.block_ids) for r in released)
        return decode_pb2.AbortReply(found=bool(released) or running, blocks_freed=freed)

    def Load(self, request: common_pb2.LoadRequest, context: grpc.ServicerContext) -> common_pb2.LoadReport:
        return self.load_of() if self.load_of is not None else self.own_load()

    def own_load(self) -> common_pb2.LoadReport:
        reserved = self.receiver.table.reserved_blocks()
        return load_report(self.loop.snapshot, self.info.worker_id, "decode", reserved, self.draining)

    # --- reservation outcomes -----------------------------------------------------------------
    def _committed(self, done: Committed) -> None:
        with self._lock:
            pending = self._pending.pop(done.reservation.transfer_id, None)
            output = self._outputs.get(done.reservation.request_id)
        stream = output.queue if output is not None else None
        if pending is None:
            return
        self._give_back_ring(pending)
        if stream is None:  # the router is gone: nobody will read the tokens
            self.loop.call(lambda e: e.release(pending.block_table))
            return
        self.loop.admit(
            pending.request_id,
            lambda e: e.admit_prefilled(
                pending.request_id,
                pending.prompt_ids,
                pending.params,
                pending.block_table,
                done.first_token,
                done.first_token_logprob,
                done.first_token_top_logprobs,
                share=self.kv_authenticated,
            ),
            stream,
        )

    def _released(self, released: Released) -> None:
        request_id = released.reservation.request_id
        with self._lock:
            pending = self._pending.pop(released.reservation.transfer_id, None)
            output = self._outputs.get(request_id)
            if output is not None and output.unclaimed_until is not None and released.reason != "superseded":
                del self._outputs[
                    request_id
                ]  # no stream reads it: nobody to tell (a superseding Reserve's is new)
        if pending is None:
            return
        self._give_back_ring(pending)
        self.loop.post(
            lambda e: e.release(pending.block_table)
        )  # may run in a gRPC callback: never wait a step
        if output is not None:
            output.queue.put(StreamEnd("error", f"KV transfer did not complete: {released.reason}"))
        log.info("released reservation %r: %r", released.reservation.transfer_id, released.reason)

    def _give_back_ring(self, pending: Pending) -> None:
        if pending.ring is not None:
            self.staging[pending.transport].give_back(pending.ring)

    def _drop(
        self, request_id: str, transfer_id: str = "", reason: str = "aborted"
    ) -> tuple[list[Released], bool]:
        """End a request wherever it is (reservation, engine, unread token queue) and free what it holds."""
        released = self.receiver.abort(transfer_id, request_id, reason)
        running = bool(request_id) and self.loop.abort(request_id, "abort")
        with self._lock:
            output = self._outputs.get(request_id)
            if output is not None and output.unclaimed_until is not None:
                del self._outputs[request_id]
        return released, running

    def _client_gone(self, request_id: str) -> None:
        """The token stream ended (finished, or the router went away): stop the work and free its blocks."""
        self.receiver.abort(request_id=request_id, reason="token stream closed")
        self.loop.abort_soon(request_id, "abort")

    def _expire(self) -> None:
        """Give up reservations and unclaimed token queues whose lease ran out."""
        self.receiver.expire()
        with self._lock:
            stale = unclaimed_expired(self._outputs, time.monotonic())
        for request_id in stale:
            log.info("no token stream opened for %r within its lease: dropped", request_id)
            self._drop(request_id, reason="no token stream within the lease")

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._pending)


def add_to_server(server: grpc.Server, servicer: DecodeServicer) -> None:
    add_decode_service(server, servicer, servicer.receiver)
