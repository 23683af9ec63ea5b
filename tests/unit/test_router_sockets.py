"""The router under uvicorn on a real loopback socket: the official OpenAI client, and clients that leave."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from tandem.worker.router.app import create_app
from tests.unit.router_harness import ANSWER, CHAT, SERVED, ScriptedBackend

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
