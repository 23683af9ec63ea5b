"""The prefill worker's gRPC service: run a prompt and push each layer's KV to the decode worker as
soon as that layer is written, so the transfer overlaps the compute; the first token goes last."""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from tandem.identity import Identity
from tandem.v1 import common_pb2, decode_pb2, prefill_pb2
from tandem.worker.api.params import InvalidRequest
from tandem.worker.api.tls import TlsConfig
from tandem.worker.api.wire import params_from_proto
from tandem.worker.engine.core.scheduler import SchedulerOutput
from tandem.worker.engine.runner.engine import Engine
from tandem.worker.engine.runner.engine_loop import EngineLoop, StreamEnd
from tandem.worker.kv_transport.base import DecodeUnreachable, KvLayout, KvSender, KvTransferError
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS, StreamKvSender, staging_for
from tandem.worker.kv_transport.handshake import check_compatible, reserve_transport
from tandem.worker.kv_transport.pairing_log import PairingLog, transport_label
from tandem.worker.serve.authz import ROUTER, caller_identity
from tandem.worker.serve.colocated import generate_tokens
from tandem.worker.serve.decode_channels import DecodeChannels
from tandem.worker.serve.drain import refuse_while_draining
from tandem.worker.serve.kv_push import LayerKvReader
from tandem.worker.serve.metrics import WorkerMetrics
from tandem.worker.serve.rpc_end import on_rpc_end
from tandem.worker.serve.wire import load_report

log = logging.getLogger(__name__)


@dataclass
class Transfer:
    """One prompt's KV on its way out: which local blocks go to which reserved decode blocks."""

    sender: KvSender
    first_block: int  # the decode worker already holds blocks [0, first_block) by prefix
    decode_blocks: list[int]
    next_block: int = -1  # first local block index not yet pushed (all layers)
    kv_bytes: int = 0  # KV payload pushed, whatever the transport
    first_pushed: float | None = None  # perf_counter when its first chunk was queued
    errors: list[Exception] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.next_block = self.first_block


def blocks_to_push(computed_after: int, prompt_len: int, block_size: int, next_block: int) -> tuple[int, int]:
    """Block index range [lo, hi) whose KV is final after a prefill chunk: the full blocks so far, and the
    last partial block once the whole prompt is in."""
    hi = -(-prompt_len // block_size) if computed_after >= prompt_len else computed_after // block_size
    return next_block, max(next_block, hi)


_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
UNREACHABLE = "the decode worker could not be reached as a decode worker of this service"
# gRPC's schemes: a target naming one is a socket path, another resolver or an address family, never a pod
_SCHEMES = {"unix", "unix-abstract", "vsock", "dns", "ipv4", "ipv6", "xds", "google-c2p", "passthrough"}


def check_decode_address(address: str) -> str | None:
    """Why a Prefill's decode address must not be dialled (pure): it must be `host:port` with an IP
    address or a dotted DNS name, never a gRPC scheme (`unix:`, `dns:` ...). None when it may."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or host.lower() in _SCHEMES:
        return f"decode address {address[:100]!r} is not host:port"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    labels = host.split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
        return f"decode address {address[:100]!r} is not host:port"
    return None


def names_peers(caller: Identity | None) -> bool:
    """Whether `caller` may have this worker dial a decode worker (pure): the router, which names the decode
    worker of every Prefill too."""
    return caller is not None and bool(caller.roles & ROUTER)


def public_reason(e: KvTransferError) -> str:
    """What a failed transfer tells the caller: the decode worker's own refusal, but never how a connection
    failed (refused, reset, not TLS), which would make Prefill a port scanner."""
    return UNREACHABLE if isinstance(e, DecodeUnreachable) else str(e)


PUSH_GRACE_S = 1.0  # past the lease, for the decode worker's own clock and the commit's round trip
PUSH_TIMEOUT_CAP_S = 60.0
# a Handshake naming a decode worker waits this long for the channel to it (it goes on connecting after)
PEER_CONNECT_TIMEOUT_S = 1.0


def push_timeout_s(lease_deadline_ms: int, now_s: float) -> float:
    """How long a KV push may take: until the decode worker's lease on the blocks runs out (it frees them
    then, so a push still stuck on a stalled link is pointless), plus a grace; without a lease, the cap."""
    if not lease_deadline_ms:
        return PUSH_TIMEOUT_CAP_S
    return min(PUSH_TIMEOUT_CAP_S, max(PUSH_GRACE_S, lease_deadline_ms / 1000 - now_s + PUSH_GRACE_S))


class PrefillServicer:
    def __init__(
        self,
        loop: EngineLoop,
        info: common_pb2.WorkerInfo,
        compression: int = 0,
        metrics: WorkerMetrics | None = None,
        tls: TlsConfig | None = None,
    ):
        self.loop, self.info, self.compression, self.metrics = loop, info, compression, metrics
        self.layout = KvLayout.from_worker_info(info)
        self._transfers: dict[str, Transfer | None] = {}  # None: accepted, its transfer not yet set up
        self.tls = tls
        self.decode_channels = DecodeChannels(tls, BULK_CHANNEL_OPTIONS)
        self._lock = threading.Lock()
        self.draining = False
        self._inflight = 0  # Prefill RPCs accepted and not yet answered
        self._generating = 0  # whole requests (Generate streams) accepted and not yet ended
        loop.engine.layer_hook = self._after_layer
        self._kv_reader = LayerKvReader(loop.engine.kv)
        self.load_of: Callable[[], common_pb2.LoadReport] | None = None  # the worker's current role's report
        self.pairings = PairingLog(log)

    def activate(self, active: bool) -> None:
        """Take (or give up) the engine's layer hook: only a worker that prefills now needs it, and without
        it a decode worker's steps may run as a captured graph."""
        self.loop.engine.layer_hook = self._after_layer if active else None

    def busy(self) -> int:
        """Prefills accepted and not yet answered (their KV may still be on its way), and whole requests
        still streaming."""
        with self._lock:
            return self._inflight + self._generating

    # --- RPCs ---------------------------------------------------------------------------------
    def Handshake(
        self, request: common_pb2.HandshakeRequest, context: grpc.ServicerContext
    ) -> common_pb2.HandshakeReply:
        peer = request.peer
        connected = self._connect(request.peer_address, context)
        if not peer.num_layers:  # no peer named: nothing to check or choose
            return common_pb2.HandshakeReply(
                worker=self.info, transport=common_pb2.KV_TRANSPORT_UNSPECIFIED, peer_connected=connected
            )
        transport = reserve_transport(
            self.info.transports, self.info.host_id, peer, self.info.cuda_device_uuid
        )
        self.pairings.note(
            peer.worker_id, transport, "handshake: KV to decode worker %s would go over %s", peer.worker_id
        )
        return common_pb2.HandshakeReply(
            worker=self.info,
            problems=check_compatible(self.info, peer),
            transport=transport,
            peer_connected=connected,
        )

    def _connect(self, address: str, context: grpc.ServicerContext) -> bool:
        """Open the channel to a decode worker before the first transfer to it needs it (the router names
        each decode worker it may pair this one with)."""
        if not address:
            return False
        if self.tls is not None and not names_peers(caller_identity(context)):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "only the router names decode workers to dial")
        if problem := check_decode_address(address):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        started = time.perf_counter()
        connected = self.decode_channels.open(address, PEER_CONNECT_TIMEOUT_S)
        if connected:
            log.info("channel to decode worker %s open in %.3f s", address, time.perf_counter() - started)
        else:
            log.info("channel to decode worker %s not open after %.1f s", address, PEER_CONNECT_TIMEOUT_S)
        return connected

    def Load(self, request: common_pb2.LoadRequest, context: grpc.ServicerContext) -> common_pb2.LoadReport:
        return self.load_of() if self.load_of is not None else self.own_load()

    def own_load(self) -> common_pb2.LoadReport:
        return load_report(self.loop.snapshot, self.info.worker_id, "prefill", 0, self.draining)

    def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: grpc.ServicerContext
    ) -> prefill_pb2.PrefillReply:
        with self._lock:
            if self.draining:
                refuse_while_draining(context, "prefill worker")
            self._inflight += 1
        try:
            return self._prefill(request, context)
        finally:
            with self._lock:
                self._inflight -= 1

    def Generate(self, request: common_pb2.GenerateRequest, context: grpc.ServicerContext):
        """Both phases here, as a colocated worker would (the router's mixed route, when the decode pool is
        the busier one); the stream closing aborts the sequence and frees its blocks."""
        with self._lock:
            if self.draining:
                refuse_while_draining(context, "prefill worker")
            self._generating += 1
        try:
            yield from generate_tokens(self.loop, request, context)
        finally:
            with self._lock:
                self._generating -= 1

    def _prefill(
        self, request: prefill_pb2.PrefillRequest, context: grpc.ServicerContext
    ) -> prefill_pb2.PrefillReply:
        arrived = time.perf_counter()
        prompt = list(request.prompt_token_ids)
        try:
            params = params_from_proto(request.sampling)
            params.max_tokens, params.ignore_eos = 1, True
        except InvalidRequest as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        problem = check_decode_address(request.decode_address)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        with self._lock:  # a second Prefill under one request id must not take over the first one's transfer
            if request.request_id in self._transfers:
                context.abort(
                    grpc.StatusCode.ALREADY_EXISTS, f"request {request.request_id!r} is already prefilling"
                )
            self._transfers[request.request_id] = None
        try:
            return self._transfer(request, context, prompt, params, arrived)
        finally:
            with self._lock:
                self._transfers.pop(request.request_id, None)

    def _transfer(self, request, context, prompt, params, arrived: float) -> prefill_pb2.PrefillReply:
        reservation = request.reservation
        try:
            ring = staging_for(reservation, self.info.cuda_device)
        except (KvTransferError, OSError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"reservation's staging ring refused: {e}")
        sender = StreamKvSender(
            self.decode_channels.get(request.decode_address),
            request.transfer_id,
            reservation,
            self.layout,
            ring=ring,
            compression=self.compression,
            timeout_s=push_timeout_s(reservation.lease_deadline_ms, time.time()),
        )
        transfer = Transfer(sender, reservation.first_block_index, list(reservation.block_ids))
        self.pairings.note(
            request.decode_address,
            sender.transport,
            "KV to decode worker %s goes over %s",
            request.decode_address,
        )
        with self._lock:
            self._transfers[request.request_id] = transfer
        try:
            try:
                stream = self.loop.submit(prompt, params, request.request_id)
            except InvalidRequest as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            on_rpc_end(context, lambda: self.loop.abort_soon(request.request_id, "abort"))
            first = next(EngineLoop.iterate(stream))
            computed = time.perf_counter()
            if isinstance(first, StreamEnd):
                context.abort(
                    grpc.StatusCode.INTERNAL, first.error or f"prefill ended: {first.finish_reason}"
                )
            if transfer.errors:
                unreachable = any(isinstance(e, DecodeUnreachable) for e in transfer.errors)
                raise (DecodeUnreachable if unreachable else KvTransferError)(
                    "; ".join(map(str, transfer.errors))
                )
            reply = sender.commit(first.token_id, first.logprob, first.top_logprobs)
        except KvTransferError as e:
            sender.abort(str(e))
            log.warning("KV transfer %r to %r failed: %s", request.transfer_id, request.decode_address, e)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"KV transfer failed: {public_reason(e)}")
        finally:
            sender.close()
        if reply.status != decode_pb2.PUSH_KV_STATUS_COMMITTED:
            context.abort(grpc.StatusCode.ABORTED, f"decode worker refused the KV: {reply.error}")
        done = time.perf_counter()
        if self.metrics is not None and transfer.first_pushed is not None:
            self.metrics.kv_pushed(
                transport_label(sender.transport),
                transfer.kv_bytes,
                done - transfer.first_pushed,
                done - computed,
            )
        return prefill_pb2.PrefillReply(
            first_token=first.token_id,
            first_token_logprob=first.logprob,
            kv_bytes=transfer.kv_bytes,
            timings=prefill_pb2.PrefillTimings(
                compute_s=computed - arrived, transfer_tail_s=done - computed, transfer_s=done - arrived
            ),
            transport=sender.transport,
            push_status=reply.status,
        )

    # --- the layer hook (engine thread) -------------------------------------------------------
    def _after_layer(self, layer: int, sched: SchedulerOutput) -> None:
        engine: Engine = self.loop.engine
        bs = engine.config.block_size
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            transfer = self._transfers.get(seq.request_id)
            if transfer is None or transfer.errors:
                continue
            lo, hi = blocks_to_push(seq.num_computed + n, len(seq.prompt_ids), bs, transfer.next_block)
            if hi > lo:
                try:
                    if transfer.first_pushed is None:
                        transfer.first_pushed = time.perf_counter()
                    to_host = transfer.sender.transport != common_pb2.KV_TRANSPORT_CUDA_IPC
                    k, v, ready = self._kv_reader.read(layer, seq.block_table[lo:hi], to_host)
                    first = transfer.first_block
                    transfer.sender.send(layer, transfer.decode_blocks[lo - first : hi - first], k, v, ready)
                    transfer.kv_bytes += 2 * k.numel() * k.element_size()
                except Exception as e:  # the RPC thread reports it; the engine keeps going
                    transfer.errors.append(e)
            if layer == engine.model.config.num_layers - 1:
                transfer.next_block = hi
