"""The colocated worker's gRPC service: both phases in one engine, the baseline disaggregation is measured
against."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from tandem.v1 import colocated_pb2, common_pb2
from tandem.worker.api.params import InvalidRequest
from tandem.worker.api.wire import params_from_proto
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.serve.drain import refuse_while_draining
from tandem.worker.serve.rpc_end import on_rpc_end
from tandem.worker.serve.wire import load_report, token_event


class ColocatedServicer:
    def __init__(self, loop: EngineLoop, info: common_pb2.WorkerInfo):
        self.loop, self.info = loop, info
        self.draining = False
        self._lock = threading.Lock()
        self._streams = 0  # Generate streams accepted and not yet ended
        self.load_of: Callable[[], common_pb2.LoadReport] | None = None  # the worker's current role's report

    def activate(self, active: bool) -> None:
        """Nothing to take or give up: both phases run on the engine as it is."""

    def busy(self) -> int:
        load = self.loop.snapshot
        with self._lock:
            return self._streams + load.running + load.waiting

    def Handshake(
        self, request: common_pb2.HandshakeRequest, context: grpc.ServicerContext
    ) -> common_pb2.HandshakeReply:
        return common_pb2.HandshakeReply(worker=self.info, transport=common_pb2.KV_TRANSPORT_UNSPECIFIED)

    def Generate(self, request: common_pb2.GenerateRequest, context: grpc.ServicerContext):
        with self._lock:
            if self.draining:
                refuse_while_draining(context, "colocated worker")
            self._streams += 1
        try:
            yield from self._generate(request, context)
        finally:
            with self._lock:
                self._streams -= 1

    def _generate(self, request: common_pb2.GenerateRequest, context: grpc.ServicerContext):
        yield from generate_tokens(self.loop, request, context)

    def Abort(
        self, request: colocated_pb2.ColocatedAbortRequest, context: grpc.ServicerContext
    ) -> colocated_pb2.ColocatedAbortReply:
        return colocated_pb2.ColocatedAbortReply(found=self.loop.abort(request.request_id, "abort"))

    def Load(self, request: common_pb2.LoadRequest, context: grpc.ServicerContext) -> common_pb2.LoadReport:
        return self.load_of() if self.load_of is not None else self.own_load()

    def own_load(self) -> common_pb2.LoadReport:
        return load_report(self.loop.snapshot, self.info.worker_id, "colocated", 0, self.draining)


def generate_tokens(loop: EngineLoop, request: common_pb2.GenerateRequest, context: grpc.ServicerContext):
    """Both phases of one prompt in `loop`'s engine, as token events (the colocated worker's Generate, and a
    decode worker's local prefill). However the stream ends, the sequence is aborted and its blocks freed."""
    try:
        params = params_from_proto(request.sampling)
        stream = loop.submit(list(request.prompt_token_ids), params, request.request_id)
    except InvalidRequest as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    on_rpc_end(context, lambda: loop.abort_soon(request.request_id, "abort"))
    for index, item in enumerate(EngineLoop.iterate(stream)):
        yield token_event(request.request_id, item, index)
