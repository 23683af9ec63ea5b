"""The router's HTTP layer against a scripted backend: OpenAI shapes, stop strings, errors, limits, metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from tandem import names
from tandem.slo import Slo
from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router.app import create_app
from tandem.worker.router.backend import BackendError, Timing, TokenOut
from tandem.worker.router.metrics import slo_outcomes
from tandem.worker.router.streaming import StopStringFilter, find_stop, holdback_length

SERVED = "tiny"
ANSWER = "Hello world, stop here. END now"


@pytest.fixture(scope="module")
def tok(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


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
                yield TokenOut(token_id, -0.1 * (i + 1), self.finish if last else None)
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


# ---- pure stop-string decisions ----


def test_stop_string_decisions():
    assert find_stop("abc STOP def stop", ["stop", "STOP"]) == 4
    assert find_stop("nothing", ["stop"]) is None
    assert holdback_length("say hel", ["hello"]) == 3
    assert holdback_length("say hello", ["hello"]) == 0  # a whole stop string is found, not held
    assert holdback_length("xx", ["ab", "xa"]) == 1
    f = StopStringFilter(["<end>"])
    assert [f.feed(p) for p in ["hi <", "e", "nd> more"]] == ["hi ", "", ""]
    assert f.stopped and f.finish("tail") == ""
    g = StopStringFilter(["<end>"])
    assert g.feed("a <e") == "a " and g.finish("") == "<e"  # a prefix that never completed is released


# ---- completions ----


@pytest.mark.asyncio
async def test_completion_non_streaming_shape_and_usage(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "Once upon a time", "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == SERVED and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": ANSWER, "logprobs": None, "finish_reason": "stop"}]
    prompt_ids = tok.encode("Once upon a time", add_special_tokens=True)
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(backend.ids),
        "total_tokens": len(prompt_ids) + len(backend.ids),
    }
    rid, seen_ids, params = backend.calls[0]
    assert rid == body["id"] and seen_ids == prompt_ids
    assert "x-tandem-retries" not in r.headers
    assert not any("127.0.0.1:700" in v for v in r.headers.values()), r.headers  # worker addresses stay inside
    assert params.max_tokens == 16 and params.temperature == 0.0 and params.greedy


@pytest.mark.asyncio
async def test_completion_accepts_token_ids_and_passes_sampling_fields(tok):
    backend = ScriptedBackend(tok, finish="length")
    app = create_app(backend, tok, SERVED)
    req = {
        "model": SERVED, "prompt": [5, 6, 7], "max_tokens": 40, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
        "seed": 3, "stop": "zzz", "stop_token_ids": [9], "ignore_eos": True, "min_tokens": 2, "user": "u",
    }  # fmt: skip
    r = await post(app, "/v1/completions", req)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    _, ids, p = backend.calls[0]
    assert ids == [5, 6, 7]
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (40, 0.7, 0.9, 20, 3)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.logprobs) == (["zzz"], [9], True, False)


@pytest.mark.asyncio
async def test_completion_streaming_chunks_and_usage(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    req = {"model": SERVED, "prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}}
    r = await post(app, "/v1/completions", req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert not any("127.0.0.1:700" in v for v in r.headers.values()), r.headers  # worker addresses stay inside
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert all(c["object"] == "text_completion" and c["model"] == SERVED for c in chunks)
    assert len({c["id"] for c in events[:-1]}) == 1
    assert len(chunks) > 3  # streamed piece by piece, not in one go
    assert "".join(c["choices"][0]["text"] for c in chunks) == ANSWER
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage_chunk["choices"] == []
    assert all(c["usage"] is None for c in chunks)  # OpenAI: null on every chunk but the usage one
    n_prompt = len(tok.encode("Hi"))
    assert usage_chunk["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": len(backend.ids),
        "total_tokens": n_prompt + len(backend.ids),
    }


@pytest.mark.asyncio
async def test_completion_logprobs_report_the_chosen_tokens(tok):
    backend = ScriptedBackend(tok, "Hello world")
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "logprobs": 1})
    lp = r.json()["choices"][0]["logprobs"]
    assert backend.calls[0][2].logprobs is True
    assert lp["tokens"] == ["Hello", " world"]
    assert lp["token_logprobs"] == pytest.approx([-0.1, -0.2])
    assert lp["text_offset"] == [0, 5]


@pytest.mark.asyncio
async def test_streamed_logprobs_cover_every_token_once(tok):
    text = "café 🙂 ok"  # the emoji's byte tokens print no text alone: their logprobs ride with later text
    backend = ScriptedBackend(tok, text)
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "logprobs": 0, "stream": True})
    lps = [e["choices"][0]["logprobs"] for e in sse_events(r.text)[:-1]]
    lps = [lp for lp in lps if lp]
    token_logprobs = [v for lp in lps for v in lp["token_logprobs"]]
    assert token_logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(backend.ids))])
    offsets = [o for lp in lps for o in lp["text_offset"]]
    assert offsets[0] == 0 and offsets == sorted(offsets)


# ---- chat ----

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]


@pytest.mark.asyncio
async def test_chat_non_streaming_uses_the_template_without_a_second_bos(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    r = await post(
        app, "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_completion_tokens": 50}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": ANSWER}
    assert body["choices"][0]["finish_reason"] == "stop"
    _, ids, params = backend.calls[0]
    assert ids == tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True), add_special_tokens=False)
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    assert params.max_tokens == 50
    assert body["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.asyncio
async def test_chat_streaming_role_then_content_then_finish(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert "".join(content) == ANSWER and len(content) > 3
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage


@pytest.mark.asyncio
async def test_chat_logprobs(tok):
    app = create_app(ScriptedBackend(tok, "Hello world"), tok, SERVED)
    r = await post(app, "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "logprobs": True})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hello", " world"]
    assert [c["logprob"] for c in content] == pytest.approx([-0.1, -0.2])
    assert content[0]["bytes"] == list(b"Hello")


# ---- stop strings and detokenization ----


@pytest.mark.asyncio
async def test_stop_string_truncates_and_aborts_the_rest(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stop": ["nope", " here."]})
    choice = r.json()["choices"][0]
    assert choice["text"] == "Hello world, stop" and choice["finish_reason"] == "stop"
    assert backend.aborted == [backend.calls[0][0]]  # the router closed the stream after the stop string
    assert r.json()["usage"]["completion_tokens"] < len(backend.ids)


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_streamed_stop_string_spanning_tokens_is_never_sent(tok, path):
    backend = ScriptedBackend(tok)
    assert [tok.decode([i]) for i in tok.encode(" END", add_special_tokens=False)] == [" ", "E", "N", "D"]
    app = create_app(backend, tok, SERVED)
    req = {"model": SERVED, "stream": True, "stop": "END"}
    req |= {"messages": CHAT} if "chat" in path else {"prompt": "x"}
    events = sse_events((await post(app, path, req)).text)[:-1]
    choices = [e["choices"][0] for e in events]
    pieces = [c.get("text", c.get("delta", {}).get("content")) or "" for c in choices]
    assert "".join(pieces) == "Hello world, stop here. "  # nothing of "END" leaked, even "E" alone
    assert choices[-1]["finish_reason"] == "stop"


@pytest.mark.asyncio
async def test_engine_stop_on_a_stop_string_is_still_cut(tok):
    """The engine stops once the text contains the stop string; the router must not send it."""
    backend = ScriptedBackend(tok, "Hello world, stop")  # engine says finish=stop right after " st", "o", "p"
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stop": ["stop"], "stream": True})
    text = "".join(e["choices"][0]["text"] for e in sse_events(r.text)[:-1])
    assert text == "Hello world, "


@pytest.mark.asyncio
async def test_streamed_multibyte_text_is_never_split(tok):
    text = "café 🙂 日本語"
    backend = ScriptedBackend(tok, text)
    assert len(backend.ids) > len(text)  # several tokens per character
    app = create_app(backend, tok, SERVED)
    r = await post(
        app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": True, "max_tokens": 100}
    )
    pieces = [e["choices"][0]["text"] for e in sse_events(r.text)[:-1]]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


# ---- errors ----


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/completions", {"model": SERVED}, "prompt", "prompt: Field required"),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "temperature": -1}, "temperature", "temperature"),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "n": 17}, "n", "less than or equal to 16"),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens"),
        ("/v1/completions", {"model": SERVED, "prompt": 7}, "prompt", "list of token ids"),
        ("/v1/completions", {"model": SERVED, "prompt": ["a", "b"]}, "prompt", "one prompt"),
        ("/v1/completions", {"model": SERVED, "prompt": [10**9]}, "prompt", "outside the vocabulary"),
        ("/v1/completions", {"prompt": "x"}, "model", "model: Field required"),
        ("/v1/completions", b'{"model": "tiny", "prompt": ', None, "not valid JSON"),
        ("/v1/chat/completions", {"model": SERVED}, "messages", "messages: Field required"),
        (
            "/v1/chat/completions",
            {"model": SERVED, "messages": [{"role": "robot", "content": "x"}]},
            None,
            "robot",
        ),
        ("/v1/chat/completions", {"model": SERVED, "messages": CHAT, "top_p": 0}, "top_p", "top_p"),
    ],
)
async def test_bad_requests_get_400_with_a_reason(tok, path, body, param, fragment):
    backend = ScriptedBackend(tok)
    r = await post(create_app(backend, tok, SERVED), path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error" and err["param"] == param
    assert backend.calls == []


@pytest.mark.asyncio
async def test_unknown_model_is_404(tok):
    r = await post(
        create_app(ScriptedBackend(tok), tok, SERVED), "/v1/completions", {"model": "gpt-9", "prompt": "x"}
    )
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found" and "gpt-9" in r.json()["error"]["message"]


@pytest.mark.asyncio
async def test_prompt_longer_than_the_context_is_400(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED, max_model_len=8)
    r = await post(
        app, "/v1/completions", {"model": SERVED, "prompt": "one two three four five six seven eight"}
    )
    assert r.status_code == 400 and "too long" in r.json()["error"]["message"]
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "one", "max_tokens": 50})
    assert r.status_code == 400 and "exceeds the model's context" in r.json()["error"]["message"]


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_backend_errors_before_the_first_token_keep_their_status(tok, stream):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    req = {"model": SERVED, "prompt": "x", "stream": stream}
    backend.error_first = InvalidRequest("prompt of 9000 tokens exceeds the 4096-token context")
    r = await post(app, "/v1/completions", req)
    assert r.status_code == 400 and "9000 tokens" in r.json()["error"]["message"]
    backend.error_first = BackendError("no healthy decode worker", status=503, retry_after_s=2)
    r = await post(app, "/v1/completions", req)
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json()["error"] == {
        "message": "no healthy decode worker", "type": "server_error", "param": None, "code": None,
    }  # fmt: skip
    assert app.state.admission.in_flight == 0


@pytest.mark.asyncio
async def test_error_mid_stream_becomes_an_error_event_then_done(tok):
    backend = ScriptedBackend(tok)
    backend.fail_after = 3
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {"message": "decode worker went away", "type": "server_error", "param": None, "code": None}
    }
    assert any(e["choices"][0]["delta"].get("content") for e in events[:-2])
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x"})  # not streamed: plain 503
    assert r.status_code == 503 and r.json()["error"]["message"] == "decode worker went away"
    metrics = (await client_for(app).get("/metrics")).text
    assert 'tandem_requests_total{pool="router",prefill="disaggregated",service="default",status="503"} 2.0' in metrics


@pytest.mark.asyncio
async def test_queue_full_is_429_with_retry_after(tok):
    backend = ScriptedBackend(tok)
    backend.gate = asyncio.Event()
    app = create_app(backend, tok, SERVED, max_queued_requests=2)
    req = {"model": SERVED, "prompt": "x"}
    first = [asyncio.create_task(post(app, "/v1/completions", req)) for _ in range(2)]
    for _ in range(200):
        if app.state.admission.in_flight == 2:
            break
        await asyncio.sleep(0.005)
    r = await post(app, "/v1/completions", req)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error" and "in flight" in r.json()["error"]["message"]
    backend.gate.set()
    assert [(await t).status_code for t in first] == [200, 200]
    assert app.state.admission.in_flight == 0 and backend.in_flight == 0
    assert (await post(app, "/v1/completions", req)).status_code == 200


# ---- models, health, metrics ----


@pytest.mark.asyncio
async def test_models_liveness_and_readiness(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    async with client_for(app) as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == [SERVED]
        for path in (names.LIVENESS_PATH, names.READINESS_PATH, "/health"):
            assert (await c.get(path)).status_code == 200, path
        backend.healthy = False  # no worker can serve: not ready, but the process is alive and must not be restarted
        assert (await c.get(names.LIVENESS_PATH)).status_code == 200
        for path in (names.READINESS_PATH, "/health"):
            r = await c.get(path)
            assert r.status_code == 503 and r.json()["status"] == "unavailable", path


@pytest.mark.asyncio
async def test_metrics_after_a_request(tok):
    backend = ScriptedBackend(tok)
    backend.delay_s = 0.002
    app = create_app(backend, tok, SERVED, service_name="svc")
    other = create_app(ScriptedBackend(tok), tok, SERVED, service_name="other")  # own registry: no clash
    await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": True})
    await post(app, "/v1/completions", {"model": "nope", "prompt": "x"})
    async with client_for(app) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    labels = 'pool="router",service="svc"'
    n = len(backend.ids)
    routed = 'pool="router",prefill="disaggregated",service="svc"'
    assert f"tandem_ttft_seconds_count{{{routed}}} 1.0" in text
    assert f"tandem_tpot_seconds_count{{{labels}}} 1.0" in text
    assert f"tandem_inter_token_latency_seconds_count{{{labels}}} {float(n - 1)}" in text
    assert f"tandem_e2e_latency_seconds_count{{{labels}}} 1.0" in text
    assert f'tandem_requests_total{{{routed},status="200"}} 1.0' in text
    # refused before it was routed: counted with prefill="none"
    assert 'tandem_requests_total{pool="router",prefill="none",service="svc",status="404"} 1.0' in text
    assert f"tandem_router_queue_depth{{{labels}}} 0.0" in text
    # what the autoscaler reads: arrivals (the 404 arrived too), prompt and output lengths of the served one
    assert f"tandem_request_arrivals_total{{{labels}}} 2.0" in text
    assert f"tandem_request_prompt_tokens_count{{{labels}}} 1.0" in text
    assert f"tandem_request_output_tokens_count{{{labels}}} 1.0" in text
    assert f"tandem_request_output_tokens_sum{{{labels}}} {float(n)}" in text
    tpot_sum = float(
        next(li for li in text.splitlines() if li.startswith("tandem_tpot_seconds_sum")).split()[-1]
    )
    assert 0.0015 < tpot_sum < 1.0  # about the scripted 2 ms per token
    async with client_for(other) as c:
        assert 'service="other"' in (await c.get("/metrics")).text


@pytest.mark.asyncio
async def test_slo_series_judge_each_completed_request(tok):
    backend = ScriptedBackend(tok)
    backend.delay_s = 0.02  # 20 ms per token: meets a 1 s TTFT target, misses a 5 ms TPOT target
    app = create_app(backend, tok, SERVED, service_name="svc", slo=Slo(ttft_ms=1000, tpot_ms=5, percentile=95))
    await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": True})
    await post(app, "/v1/completions", {"model": "nope", "prompt": "x"})  # a 404 is not judged
    async with client_for(app) as c:
        text = (await c.get("/metrics")).text
    labels = 'pool="router",service="svc"'
    assert f'tandem_slo_target_seconds{{{labels},slo="ttft"}} 1.0' in text
    assert f'tandem_slo_target_seconds{{{labels},slo="tpot"}} 0.005' in text
    assert f'tandem_slo_objective_ratio{{{labels},slo="tpot"}} 0.95' in text
    assert f'tandem_slo_requests_total{{met="true",{labels},slo="ttft"}} 1.0' in text
    assert f'tandem_slo_requests_total{{met="false",{labels},slo="ttft"}} 0.0' in text
    assert f'tandem_slo_requests_total{{met="false",{labels},slo="tpot"}} 1.0' in text
    assert f'tandem_slo_requests_total{{met="true",{labels},slo="tpot"}} 0.0' in text
    assert 'tandem_router_routable_workers{pool="router",role="prefill",service="svc"} 2.0' in text
    backend.healthy = False
    async with client_for(app) as c:
        assert 'tandem_router_routable_workers{pool="router",role="decode",service="svc"} 0.0' in (await c.get("/metrics")).text


def test_slo_outcomes():
    slo = Slo(ttft_ms=500, tpot_ms=50)
    assert slo_outcomes(slo, 0.5, 0.051) == {"ttft": True, "tpot": False}
    assert slo_outcomes(slo, 0.6, None) == {"ttft": False}  # one token: no TPOT to judge


# ---- over real sockets: the official client, disconnects ----


@pytest.fixture(scope="module")
def served(tok):
    """The app under uvicorn on a free loopback port, in a background thread."""
    import uvicorn

    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    assert backend.lifecycle == ["start"]
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", backend
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
    assert backend.lifecycle == ["start", "close"]


def test_openai_client_completions_and_chat(served):
    import openai

    base, backend = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=SERVED, prompt="Once", max_tokens=32, temperature=0)
    assert done.choices[0].text == ANSWER and done.usage.completion_tokens == len(backend.ids)
    stream = client.completions.create(model=SERVED, prompt="Once", stream=True, stop=[" here"])
    assert "".join(c.choices[0].text for c in stream if c.choices) == "Hello world, stop"
    chat = client.chat.completions.create(model=SERVED, messages=CHAT)
    assert chat.choices[0].message.content == ANSWER and chat.choices[0].finish_reason == "stop"
    pieces = client.chat.completions.create(
        model=SERVED, messages=CHAT, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(pieces)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert chunks[-1].usage.completion_tokens == len(backend.ids)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(model=SERVED, messages=CHAT, logit_bias={"7": 5})
    assert [m.id for m in client.models.list()] == [SERVED]


def test_client_disconnect_mid_stream_closes_the_backend_stream(served):
    base, backend = served
    backend.delay_s = 0.05  # about 1.5 s for the whole answer
    try:
        req = {"model": SERVED, "prompt": "x", "stream": True}
        with httpx.Client(timeout=10) as c, c.stream("POST", f"{base}/v1/completions", json=req) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: ")
        rid = backend.calls[-1][0]
        deadline = time.monotonic() + 1.0  # well before the answer would have ended on its own
        while rid not in backend.aborted:
            assert time.monotonic() < deadline, "backend stream was not closed after the client left"
            time.sleep(0.01)
    finally:
        backend.delay_s = 0.0


@pytest.mark.parametrize("stream", [True, False])
def test_client_leaving_before_the_first_token_aborts_the_request(served, stream):
    base, backend = served
    backend.gate = asyncio.Event()  # never set: the workers "queue" the request forever
    try:
        req = {"model": SERVED, "prompt": "x", "stream": stream}
        with httpx.Client(timeout=httpx.Timeout(10, read=0.2)) as c, pytest.raises(httpx.ReadTimeout):
            c.post(f"{base}/v1/completions", json=req)
        rid = backend.calls[-1][0]
        deadline = time.monotonic() + 2.0
        while rid not in backend.aborted:
            assert time.monotonic() < deadline, "backend request was not aborted after the client left"
            time.sleep(0.01)
        metrics = httpx.get(f"{base}/metrics").text
        assert 'status="499"' in metrics
        assert "tandem_router_queue_depth" in metrics and backend.in_flight == 0
    finally:
        backend.gate = None


# ---- the command line ----


def test_router_command_line(capsys):
    from tandem.worker.router.main import build_parser, check_args, main

    args = build_parser().parse_args(
        [
            "--model-dir",
            "m",
            "--served-name",
            "tiny",
            "--prefill",
            "a:1,b:2",
            "--decode",
            "c:3",
            "--max-queued",
            "8",
        ]
    )
    assert (args.mode, args.prefill, args.decode, args.colocated) == (
        "disaggregated",
        ["a:1", "b:2"],
        ["c:3"],
        [],
    )
    assert (args.host, args.port, args.max_queued, args.workers_file) == ("127.0.0.1", 8000, 8, None)
    assert check_args(args) is None
    colocated = build_parser().parse_args(["--model-dir", "m", "--served-name", "t", "--mode", "colocated"])
    assert "--colocated" in check_args(colocated)
    dynamic = build_parser().parse_args(
        ["--model-dir", "m", "--served-name", "t", "--workers-file", "w.json"]
    )
    assert check_args(dynamic) is None and dynamic.workers_file == "w.json"
    assert main(["--model-dir", "m", "--served-name", "t", "--decode", "c:3"]) == 2
    assert "needs --prefill and --decode" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_where_the_prompt_ran_is_a_response_header_and_a_metric_label(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    for route, stream in (("local", True), ("local", False), ("disaggregated", False)):
        backend.route = route
        r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": stream})
        assert r.status_code == 200 and r.headers[names.PREFILL_ROUTE_HEADER] == route
    text = (await client_for(app).get("/metrics")).text
    for route, n in (("local", 2), ("disaggregated", 1)):
        labels = f'pool="router",prefill="{route}",service="default"'
        assert f"tandem_ttft_seconds_count{{{labels}}} {float(n)}" in text
        assert f'tandem_requests_total{{{labels},status="200"}} {float(n)}' in text


@pytest.mark.asyncio
async def test_metrics_and_docs_stay_off_the_api_port_unless_asked(tok):
    hidden = create_app(ScriptedBackend(tok), tok, SERVED, public_metrics=False)
    async with client_for(hidden) as c:
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
            assert (await c.get(path)).status_code == 404, path
        assert (await c.get(names.LIVENESS_PATH)).status_code == 200
    shown = create_app(ScriptedBackend(tok), tok, SERVED, public_metrics=True, docs=True)
    async with client_for(shown) as c:
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert (await c.get(path)).status_code == 200, path


def test_the_rendered_router_keeps_metrics_on_its_metrics_port():
    from tandem.operator import render
    from tandem.spec import InferenceServiceSpec
    from tandem.worker.router.main import build_parser

    spec = InferenceServiceSpec.model_validate({"model": {"source": {"path": "/m"}, "servedName": "m"}})
    args = build_parser().parse_args(render.router_args(spec, "s", "ns")[1:])
    assert args.metrics_port == names.METRICS_PORT and not args.public_metrics and not args.docs
