"""How many RPCs of each kind a worker's gRPC server runs at once, sized from the engine's limits.

A synchronous gRPC server gives every running RPC a thread, and a token stream holds its thread until it
ends. Work RPCs are bounded by class (token streams; reservations and prefills; KV pushes, one per
reservation a decode worker granted, so as many as streams), and an RPC past its class's bound is refused at
once with RESOURCE_EXHAUSTED (the router tries another worker) instead of holding a thread. The thread pool
is the bounds plus threads kept for control RPCs (Load, Handshake, Abort, Drain, health), so those are never
queued behind work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

# RPC method names (the last part of the full method) per bounded class; every other method is control
STREAM_METHODS = frozenset({"StreamTokens", "Generate"})
TRANSFER_METHODS = frozenset({"Reserve", "Prefill"})
PUSH_METHODS = frozenset({"PushKv"})
CONTROL_THREADS = 8


@dataclass(frozen=True)
class RpcLimits:
    streams: int  # token streams at once (running sequences and those queued or in transfer)
    transfers: int  # reservations and prefills at once
    control: int = CONTROL_THREADS

    @property
    def pushes(self) -> int:
        """KV pushes at once: one per granted reservation, which a decode worker grants only with a stream
        free."""
        return self.streams

    @property
    def threads(self) -> int:
        return self.streams + self.pushes + self.transfers + self.control


def rpc_limits(
    max_running_sequences: int, streams: int | None = None, transfers: int | None = None
) -> RpcLimits:
    """Bounds from the engine's batch (pure): streams for twice the running batch (as many again queued or in
    transfer), transfers for one batch; either may be given explicitly."""
    return RpcLimits(
        streams=streams if streams is not None else 2 * max_running_sequences,
        transfers=transfers if transfers is not None else max(4, max_running_sequences),
    )


def rpc_class(method: str) -> str | None:
    """`streams`, `transfers`, `pushes` or None (control) for a full method name like
    /tandem.v1.DecodeService/Reserve."""
    name = method.rsplit("/", 1)[-1]
    if name in STREAM_METHODS:
        return "streams"
    if name in TRANSFER_METHODS:
        return "transfers"
    if name in PUSH_METHODS:
        return "pushes"
    return None


class Slots:
    """A counter with a bound that never blocks: take() says whether there was room."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_use = limit, 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.in_use >= self.limit:
                return False
            self.in_use += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.in_use -= 1

    @property
    def room(self) -> int:
        return self.limit - self.in_use


class RpcLimiter(grpc.ServerInterceptor):
    """Refuses a work RPC past its class's bound with RESOURCE_EXHAUSTED; frees the slot when the RPC ends.

    The slot is taken when the RPC's behaviour starts on a pool thread, not when the RPC arrives: gRPC skips
    the behaviour of an RPC cancelled while it waited for a thread, and a slot taken for it would never come
    back. A refusal costs a pool thread for microseconds."""

    def __init__(self, limits: RpcLimits) -> None:
        self.limits = limits
        self.slots = {name: Slots(getattr(limits, name)) for name in ("streams", "transfers", "pushes")}

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        kind = rpc_class(handler_call_details.method)
        if handler is None or kind is None:
            return handler
        slots = self.slots[kind]
        return _bounded(
            handler, slots, f"worker at its limit of {slots.limit} concurrent {kind}; try another worker"
        )


def _bounded(handler: Any, slots: Slots, refusal: str) -> Any:
    """The handler with its behaviour run only with a slot taken (else RESOURCE_EXHAUSTED), the slot given
    back once, whether the behaviour ends or the RPC's termination callback runs first."""

    def take(context: grpc.ServicerContext) -> Callable[[], None]:
        if not slots.take():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        lock = threading.Lock()
        given = [False]

        def give() -> None:
            with lock:
                if given[0]:
                    return
                given[0] = True
            slots.give()

        context.add_callback(give)
        return give

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            give = take(context)
            try:
                return inner_uu(request, context)
            finally:
                give()

        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            give = take(context)
            try:
                yield from inner_us(request, context)
            finally:
                give()

        return handler._replace(unary_stream=unary_stream)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            give = take(context)
            try:
                return inner_su(requests, context)
            finally:
                give()

        return handler._replace(stream_unary=stream_unary)
    inner_ss = handler.stream_stream

    def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        give = take(context)
        try:
            yield from inner_ss(requests, context)
        finally:
            give()

    return handler._replace(stream_stream=stream_stream)
