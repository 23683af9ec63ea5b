"""The router's HTTP app on bad requests and backend failures: statuses, reasons, SSE error events, 429."""

from __future__ import annotations

import asyncio

import pytest

from tandem.worker.api.params import InvalidRequest
from tandem.worker.router.app import create_app
from tandem.worker.router.backend import BackendError
from tests.unit.router_harness import CHAT, SERVED, ScriptedBackend, client_for, post, sse_events

# ---- errors ----


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/completions", {"model": SERVED}, "prompt", "prompt: Field required"),
        (
            "/v1/completions",
            {"model": SERVED, "prompt": "x", "temperature": -1},
            "temperature",
            "temperature",
        ),
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
        "message": "no healthy decode worker",
        "type": "server_error",
        "param": None,
        "code": None,
    }
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
    assert (
        'tandem_requests_total{pool="router",prefill="disaggregated",service="default",status="503"} 2.0'
        in metrics
    )


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
