"""A token stream a worker ends with anything but stop or length (an Abort, an error) reaches the client as an
error, never as a finished answer: the router's real gRPC backend against scripted workers on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router.app import create_app
from tandem.worker.router.dispatch import GrpcBackend
from tests.scripted_workers import INFO, ScriptedDecode, serve_on_loopback


class EndingDecode(ScriptedDecode):
    """Streams `tokens` tokens, then ends the stream with `finish` and no token (as a worker-side Abort
    does)."""

    def __init__(self, tokens: int, finish: int, error: str = "") -> None:
        self.tokens, self.finish, self.error = tokens, finish, error
        self.streams = 0

    def Reserve(self, request, context):
        return decode_pb2.ReserveReply(block_ids=[1], epoch=1)

    def StreamTokens(self, request, context):
        self.streams += 1
        for i in range(self.tokens):
            yield common_pb2.TokenEvent(
                request_id=request.request_id, token_id=100 + i, has_token=True, index=i
            )
        yield common_pb2.TokenEvent(
            request_id=request.request_id, finish_reason=self.finish, error=self.error, index=self.tokens
        )

    def Abort(self, request, context):
        return decode_pb2.AbortReply(found=False)


class QuickPrefill(prefill_pb2_grpc.PrefillServiceServicer):
    def Handshake(self, request, context):
        info = common_pb2.WorkerInfo(worker_id="p", role=common_pb2.WORKER_ROLE_PREFILL, **INFO)
        return common_pb2.HandshakeReply(worker=info)

    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="p")

    def Prefill(self, request, context):
        return prefill_pb2.PrefillReply(first_token=100, push_status=decode_pb2.PUSH_KV_STATUS_COMMITTED)


async def _serve(decode: EndingDecode, tok: Tokenizer):
    servers, addresses = serve_on_loopback(
        [
            (decode_pb2_grpc.add_DecodeServiceServicer_to_server, decode),
            (prefill_pb2_grpc.add_PrefillServiceServicer_to_server, QuickPrefill()),
        ]
    )
    backend = GrpcBackend(
        "disaggregated", {"decode": [addresses[0]], "prefill": [addresses[1]]}, poll_interval_s=60
    )
    await backend.start()
    return servers, backend, create_app(backend, tok, "tiny")


def _events(body: str) -> list:
    return [b.removeprefix("data: ") for b in body.split("\n\n") if b]


@pytest.mark.asyncio
@pytest.mark.parametrize("finish", [common_pb2.FINISH_REASON_ABORT, common_pb2.FINISH_REASON_ERROR])
async def test_a_worker_side_end_mid_stream_is_an_error_event_not_a_stop(tok, finish):
    servers, backend, app = await _serve(EndingDecode(tokens=3, finish=finish), tok)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
            r = await c.post(
                "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8, "stream": True}
            )
        events = _events(r.text)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert "error" in last and last["error"]["type"] == "server_error", last
        reasons = [c["finish_reason"] for e in events[:-2] for c in json.loads(e)["choices"]]
        assert not any(reasons), f"a truncated answer was given a finish reason: {reasons}"
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)


@pytest.mark.asyncio
async def test_a_worker_side_abort_before_any_token_is_a_5xx(tok):
    decode = EndingDecode(tokens=0, finish=common_pb2.FINISH_REASON_ABORT)
    servers, backend, app = await _serve(decode, tok)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
            r = await c.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8})
            s = await c.post(
                "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8, "stream": True}
            )
        assert r.status_code == 503, r.text
        assert s.status_code == 503 and "retry-after" in s.headers, s.text
        assert decode.streams >= 2  # tried again before answering
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)
