"""A scripted backend for the router's HTTP app and the helpers that talk to it in process: what the router
tests share (the `tok` fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import json

import httpx

from tandem.worker.api.params import SamplingParams
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router.backend import BackendError, Timing, TokenOut

SERVED = "tiny"
ANSWER = "Hello world, stop here. END now"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]


class ScriptedBackend:
    """Yields the token ids of `text` (or `ids`), each with logprob -0.1 * (i + 1); records what it saw."""

    def __init__(self, tok: Tokenizer, text: str = ANSWER, *, finish: str | None = "stop") -> None:
        self.ids = tok.encode(text, add_special_tokens=False)
        self.finish = finish
        self.fail_after: int | None = None  # raise BackendError before yielding token i
        self.error_first: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.delay_s = 0.0
        self.healthy = True
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self.aborted: list[str] = []  # request ids whose iterator was closed before the end
        self.in_flight = 0
        self.lifecycle: list[str] = []
        self.route = "disaggregated"  # where it says each prompt ran

    async def start(self) -> None:
        self.lifecycle.append("start")

    async def close(self) -> None:
        self.lifecycle.append("close")

    def ready(self) -> bool:
        return self.healthy

    def queue_depth(self) -> int:
        return self.in_flight

    def routable_workers(self) -> dict[str, int]:
        return {"prefill": 2, "decode": int(self.healthy), "colocated": 0}

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams, timing: Timing):
        self.calls.append((request_id, prompt_ids, params))
        timing.prefill_worker, timing.decode_worker = "127.0.0.1:7001", "127.0.0.1:7002"
        timing.prefill = self.route
        self.in_flight += 1
        done = False
        try:
            if self.error_first is not None:
                raise self.error_first
            if self.gate is not None:
                await self.gate.wait()
            for i, token_id in enumerate(self.ids):
                if self.fail_after == i:
                    raise BackendError("decode worker went away", status=503)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                last = i == len(self.ids) - 1
                prompt = None
                if i == 0 and params.prompt_logprobs is not None:  # each prompt token at -0.01 x its position
                    k = params.prompt_logprobs
                    prompt = [
                        (-0.01 * p, 2, [(3, -0.001), (t, -0.01 * p)][:k])
                        for p, t in enumerate(prompt_ids[1:], 1)
                    ]
                yield TokenOut(token_id, -0.1 * (i + 1), self.finish if last else None, [], prompt)
            done = True
        finally:
            self.in_flight -= 1
            if not done:
                self.aborted.append(request_id)


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router")


def sse_events(body: str) -> list:
    """The JSON payloads of an SSE body ('[DONE]' kept as the string), checking the framing."""
    assert body.endswith("\n\n")
    events = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def post(app, path: str, body) -> httpx.Response:
    async with client_for(app) as c:
        if isinstance(body, bytes | str):
            return await c.post(path, content=body, headers={"content-type": "application/json"})
        return await c.post(path, json=body)
