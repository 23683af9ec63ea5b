"""The PushKv stream: bulk channel options, the sender (inline payload or staging ring), the server side."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import torch

from tandem.v1 import common_pb2, decode_pb2

from . import transports
from .base import (
    ChecksumMismatch,
    DecodeUnreachable,
    IncompleteTransfer,
    InvalidChunk,
    KvLayout,
    KvSender,
    KvTransferError,
)
from .chunking import DEFAULT_CHUNK_BYTES, plan_chunks
from .codec import NONE, chunk_nbytes, encode_blocks
from .framing import identity, pack_chunk, unpack_chunk
from .receiver import KvReceiver, chunk_checksum
from .reservations import ChunkVerdict
from .staging import StagingRing

PUSH_KV_METHOD = "/tandem.v1.DecodeService/PushKv"
MAX_MESSAGE_BYTES = 64 << 20

# Options for channels and servers that carry KV: messages up to 64 MiB, HTTP/2 windows for bulk data.
BULK_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.lookahead_bytes", 16 << 20),  # initial stream flow-control window
    # BDP probing pings on every data burst; with a fixed 16 MiB window it only adds latency (measured).
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.max_frame_size", (1 << 24) - 1),
    ("grpc.http2.write_buffer_size", 8 << 20),
    ("grpc.experimental.tcp_read_chunk_size", 4 << 20),
    ("grpc.experimental.tcp_max_read_chunk_size", 16 << 20),
]

_END = object()
SHM_CHUNK_BYTES = 4 << 20  # staged chunks cost no socket bytes: fewer, larger ones (at most a quarter ring)


def push_kv_callable(channel: grpc.Channel) -> grpc.StreamUnaryMultiCallable:
    """Client of PushKv that sends pre-framed bytes (no protobuf copy of the payload)."""
    return channel.stream_unary(
        PUSH_KV_METHOD, request_serializer=identity, response_deserializer=decode_pb2.PushKvReply.FromString
    )


class StreamKvSender(KvSender):
    """Pushes one reservation's KV on a PushKv stream; bytes go inline (gRPC) or through a staging ring.

    `send` only queues (slices of) the tensors: framing, checksums and copies run on gRPC's request
    thread, so they overlap the next layer's compute. Tensors must not be modified until `commit`.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        transfer_id: str,
        reservation: decode_pb2.ReserveReply,
        layout: KvLayout,
        *,
        ring: StagingRing | None = None,
        checksum: bool | None = None,
        compression: int = NONE,
        chunk_bytes: int | None = None,
        timeout_s: float = 60.0,
    ):
        self.transfer_id, self.reservation, self.layout = transfer_id, reservation, layout
        self.ring, self.compression = ring, compression
        self.transport = reservation.transport or common_pb2.KV_TRANSPORT_GRPC
        # Bytes that cross a socket are checksummed by default; shared memory is not, unless asked.
        self.checksum = (ring is None) if checksum is None else checksum
        if ring is not None and ring.region.is_cuda:
            self.checksum = False  # bytes staged on the GPU are not checksummed
        if ring is not None:
            chunk_bytes = min(chunk_bytes or SHM_CHUNK_BYTES, max(1, ring.capacity // 4))
        self.chunk_bytes = chunk_bytes or DEFAULT_CHUNK_BYTES
        self._deadline = time.monotonic() + timeout_s
        self._allowed = set(reservation.block_ids)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._future = push_kv_callable(channel).future(self._frames(), timeout=timeout_s)

    # -- KvSender ----------------------------------------------------------------------------------
    def send(
        self,
        layer: int,
        block_ids: Sequence[int],
        k: torch.Tensor,
        v: torch.Tensor,
        ready: torch.cuda.Event | None = None,
    ) -> None:
        self._check_open()
        ids = list(block_ids)
        if len(ids) != k.shape[0] or k.shape != v.shape:
            raise ValueError(f"{len(ids)} block ids for keys {tuple(k.shape)} and values {tuple(v.shape)}")
        if not set(ids) <= self._allowed:
            raise InvalidChunk(f"blocks {sorted(set(ids) - self._allowed)[:8]} are not in the reservation")
        event = ready  # KV read on a copy stream (and perhaps into pinned host memory): wait for that
        if event is None and k.is_cuda:  # the copy runs on another thread: wait for the compute stream there
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(k.device))
        per_block = chunk_nbytes(self.layout, 1, self.compression)
        for r in plan_chunks(len(ids), per_block, self.chunk_bytes):
            header = decode_pb2.KvChunkHeader(
                transfer_id=self.transfer_id,
                epoch=self.reservation.epoch,
                kind=decode_pb2.KV_CHUNK_KIND_DATA,
                layer=layer,
                block_ids=ids[r.start : r.stop],
                compression=self.compression,
            )
            self._queue.put((header, k[r.start : r.stop], v[r.start : r.stop], event))

    def send_chunk(self, header: decode_pb2.KvChunkHeader, payload: bytes | memoryview = b"") -> None:
        self._check_open()
        self._queue.put((header, payload))

    def commit(
        self,
        first_token: int,
        first_token_logprob: float = 0.0,
        top_logprobs: list[tuple[int, float]] | None = None,
    ) -> decode_pb2.PushKvReply:
        self._check_open()
        header = decode_pb2.KvChunkHeader(
            transfer_id=self.transfer_id,
            epoch=self.reservation.epoch,
            kind=decode_pb2.KV_CHUNK_KIND_COMMIT,
            first_token=first_token,
            first_token_logprob=first_token_logprob,
            first_token_top_logprobs=[
                common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in top_logprobs or []
            ],
        )
        self._queue.put((header, b""))
        self._queue.put(_END)
        self._done.set()
        try:
            return self._future.result()
        except grpc.RpcError as e:
            if self._error is not None:
                raise self._error from e
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise DecodeUnreachable(f"PushKv failed: {e.code()} {e.details()}") from e
            raise KvTransferError(f"PushKv failed: {e.code()} {e.details()}") from e

    def abort(self, reason: str = "") -> None:
        if not self._done.is_set():
            self._done.set()
            self._queue.put(_END)
            self._future.cancel()

    # -- internals ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._done.is_set():
            raise KvTransferError(f"transfer {self.transfer_id} already committed or aborted")
        if self._future.done():
            failed = None if self._future.cancelled() else self._future.exception()
            reply = None if self._future.cancelled() or failed else self._future.result()
            lost = isinstance(failed, grpc.RpcError) and failed.code() in (  # type: ignore[attr-defined]
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            raise (DecodeUnreachable if lost else KvTransferError)(
                f"PushKv stream ended early: {reply or failed}"
            )

    def _frames(self) -> Iterator[bytes]:
        try:
            while True:
                item = self._queue.get()
                if item is _END:
                    return
                if len(item) == 2:
                    header, payload = item
                    frame = pack_chunk(header, [payload] if len(payload) else [])
                else:
                    frame = self._encode(*item)
                yield frame
        except Exception as e:  # surfaced by commit(); gRPC cancels the call (not GeneratorExit)
            self._error = e
            raise

    def _encode(self, header: decode_pb2.KvChunkHeader, k: torch.Tensor, v: torch.Tensor, event) -> bytes:
        if event is not None:
            if self.ring is not None and self.ring.region.is_cuda:
                torch.cuda.current_stream(k.device).wait_event(event)
            else:
                event.synchronize()
                k, v = k.cpu(), v.cpu()
        parts, scales = encode_blocks(k, v, self.compression)
        header.scales.extend(scales)
        header.sequence = self._seq
        self._seq += 1
        if self.ring is not None:
            header.staging.CopyFrom(
                self.ring.write(parts, self.reservation.epoch, self._deadline, cancelled=self._future.done)
            )
            if self.checksum:
                header.checksum = chunk_checksum([self.ring.view(header.staging)], scales)
                header.has_checksum = True
            return pack_chunk(header)
        if self.checksum:
            header.checksum = chunk_checksum(parts, scales)
            header.has_checksum = True
        return pack_chunk(header, [p.numpy().data for p in parts])


def push_kv_handler(receiver: KvReceiver) -> grpc.RpcMethodHandler:
    """Server side of PushKv over a KvReceiver: frames parsed by hand, payloads applied as views."""

    def push_kv(
        requests: Iterator[tuple[decode_pb2.KvChunkHeader, memoryview]], context: grpc.ServicerContext
    ):
        reply = decode_pb2.PushKvReply()
        transfer: tuple[str, int] | None = None
        try:
            for header, payload in requests:
                reply.transfer_id = header.transfer_id
                reply.bytes_received += len(payload)
                if transfer is None:
                    transfer = (header.transfer_id, header.epoch)
                if header.kind == decode_pb2.KV_CHUNK_KIND_COMMIT:
                    verdict, _ = receiver.commit(header)
                    reply.status = (
                        decode_pb2.PUSH_KV_STATUS_COMMITTED
                        if verdict is ChunkVerdict.ACCEPT
                        else decode_pb2.PUSH_KV_STATUS_REJECTED
                    )
                    if verdict is not ChunkVerdict.ACCEPT:
                        reply.error = f"commit {verdict.value}"
                    return reply
                verdict = receiver.apply(header, payload)
                if verdict is ChunkVerdict.ACCEPT:
                    reply.chunks_applied += 1
                elif verdict is ChunkVerdict.STALE:
                    reply.chunks_dropped_stale += 1
                else:
                    reply.status = decode_pb2.PUSH_KV_STATUS_REJECTED
                    reply.error = (
                        f"no live reservation for transfer {header.transfer_id} epoch {header.epoch}"
                    )
                    return reply
        except (ChecksumMismatch, InvalidChunk, IncompleteTransfer) as e:
            if transfer:
                receiver.fail(*transfer, reason=type(e).__name__)
            code = (
                grpc.StatusCode.DATA_LOSS
                if isinstance(e, ChecksumMismatch)
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            context.abort(code, str(e))
        except Exception:
            # The sender went away (stream error) or the chunk broke the receiver: free the reservation.
            if transfer:
                receiver.fail(*transfer, reason="stream error")
            raise
        if transfer:
            receiver.fail(*transfer, reason="stream ended without commit")
        reply.status = decode_pb2.PUSH_KV_STATUS_INCOMPLETE
        reply.error = "stream ended without commit"
        return reply

    return grpc.stream_unary_rpc_method_handler(
        push_kv,
        request_deserializer=unpack_chunk,
        response_serializer=decode_pb2.PushKvReply.SerializeToString,
    )


def service_handler(
    service: object, servicer: object, overrides: dict[str, grpc.RpcMethodHandler] | None = None
) -> grpc.GenericRpcHandler:
    """A generic handler for every method of a service descriptor, bound to `servicer`'s methods with the
    generated message classes, except the `overrides` (e.g. PushKv with hand-framed chunks)."""
    from google.protobuf import message_factory

    overrides = overrides or {}
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:  # type: ignore[attr-defined]
        if method.name in overrides:
            handlers[method.name] = overrides[method.name]
            continue
        req = message_factory.GetMessageClass(method.input_type)
        resp = message_factory.GetMessageClass(method.output_type)
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            getattr(servicer, method.name, _unimplemented(method.full_name)),
            request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)  # type: ignore[attr-defined]


def _unimplemented(name: str):
    def behavior(request, context: grpc.ServicerContext):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by this worker")

    return behavior


def add_decode_service(server: grpc.Server, servicer: object, receiver: KvReceiver) -> None:
    """Register DecodeService on `server` with PushKv served by `receiver` (use instead of the generated
    add_DecodeServiceServicer_to_server, which would parse KV payloads with protobuf)."""
    service = decode_pb2.DESCRIPTOR.services_by_name["DecodeService"]
    server.add_generic_rpc_handlers(
        (service_handler(service, servicer, {"PushKv": push_kv_handler(receiver)}),)
    )


def staging_for(reservation: decode_pb2.ReserveReply, cuda_device: int = -1) -> StagingRing | None:
    """The ring a reservation's transport writes into, or None for inline gRPC payloads. `cuda_device` is
    where this (sending) worker's KV cache lives, -1 for the CPU: a CUDA buffer elsewhere is refused."""
    kind = reservation.transport
    return transports.by_kind(kind).attach(reservation, cuda_device) if transports.known(kind) else None
