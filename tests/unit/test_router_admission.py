"""The router refuses before it spends: a prompt too long by its bytes alone for the served context is a 400
and a full queue a 429 without the template or tokeniser running; every 429 and 503 says when to retry; and
its HTTP server caps connections (503 with Retry-After) and closes connections that send no headers in time,
over real sockets on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.admission import max_token_bytes, min_prompt_tokens
from tandem.worker.router.app import create_app
from tandem.worker.router.backend import BackendError
from tandem.worker.router.http_server import ServerLimits, over_capacity, uvicorn_config
from tests.unit.router_harness import SERVED, ScriptedBackend, post


@pytest.fixture
def tok(tiny_model_dir) -> Tokenizer:
    """A real tokenizer that counts what it is asked to encode."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    tok.calls = 0  # type: ignore[attr-defined]
    encode, encode_chat = tok.encode, tok.encode_chat

    def counted(fn):
        def run(*a, **kw):
            tok.calls += 1  # type: ignore[attr-defined]
            return fn(*a, **kw)

        return run

    tok.encode, tok.encode_chat = counted(encode), counted(encode_chat)  # type: ignore[method-assign]
    return tok


def test_fewest_tokens_a_prompt_can_take(tok):
    token_bytes = max_token_bytes(tok.backend.get_vocab(with_added_tokens=True))
    assert token_bytes >= max(
        len(tok.decode([i], skip_special_tokens=False).encode()) for i in range(tok.vocab_size)
    )
    text = "hello world, " * 400
    req = oa.CompletionRequest(model=SERVED, prompt=text)
    assert min_prompt_tokens(req, token_bytes) <= len(
        tok.encode(text)
    )  # a lower bound, never above the truth
    assert min_prompt_tokens(oa.CompletionRequest(model=SERVED, prompt=[1, 2, 3]), token_bytes) == 3
    chat = oa.ChatCompletionRequest(model=SERVED, messages=[{"role": "user", "content": text}])
    assert min_prompt_tokens(chat, token_bytes) <= len(
        tok.encode_chat([m.for_template() for m in chat.messages])
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_prompt_too_long_by_its_bytes_is_refused_without_tokenising(tok, path):
    app = create_app(ScriptedBackend(tok), tok, SERVED, max_model_len=512)
    tok.calls = 0  # the scripted backend tokenised its answer
    text = "word " * 200_000  # 1 MB of text: tens of thousands of tokens
    body = (
        {"model": SERVED, "prompt": text}
        if "chat" not in path
        else {"model": SERVED, "messages": [{"role": "user", "content": text}]}
    )
    r = await post(app, path, body)
    assert r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"]
    assert tok.calls == 0
    ok = await post(
        app,
        path,
        {**body, "prompt": "hi"}
        if "chat" not in path
        else {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert ok.status_code == 200 and tok.calls >= 1  # a prompt that fits is tokenised


@pytest.mark.asyncio
async def test_a_full_queue_refuses_before_tokenising(tok):
    backend = ScriptedBackend(tok)
    backend.gate = asyncio.Event()
    app = create_app(backend, tok, SERVED, max_queued_requests=1)
    first = asyncio.create_task(post(app, "/v1/completions", {"model": SERVED, "prompt": "x"}))
    while not backend.calls:  # the first request is past its tokenising and waits in the backend
        await asyncio.sleep(0.005)
    calls = tok.calls
    r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "a long prompt " * 1000})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert tok.calls == calls, "the refused request was tokenised"
    backend.gate.set()
    assert (await first).status_code == 200


@pytest.mark.asyncio
async def test_every_503_carries_retry_after(tok):
    backend = ScriptedBackend(tok)
    backend.error_first = BackendError("request failed on 3 attempts", status=503)  # names no delay itself
    r = await post(create_app(backend, tok, SERVED), "/v1/completions", {"model": SERVED, "prompt": "x"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_over_capacity():
    assert not over_capacity(3, 3) and over_capacity(4, 3)


@pytest.fixture
def bounded(tok):
    """The app under uvicorn with a cap of 3 connections and a 1 s header deadline, on a loopback port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    limits = ServerLimits(max_connections=3, header_timeout_s=1.0, keep_alive_s=30)
    config = uvicorn_config(create_app(ScriptedBackend(tok), tok, SERVED), "127.0.0.1", 0, limits, "warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def _closed_by_peer(conn: socket.socket, within_s: float) -> bool:
    conn.settimeout(within_s)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_past_the_cap_get_503_with_retry_after(bounded):
    port = bounded
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # idle, but open
    try:
        time.sleep(0.2)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "too_many_connections"
    finally:
        for c in held:
            c.close()
    time.sleep(0.2)
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200


def test_a_connection_that_sends_no_headers_in_time_is_closed(bounded):
    port = bounded
    silent = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    try:
        assert _closed_by_peer(silent, within_s=5) and _closed_by_peer(slow, within_s=5)
    finally:
        silent.close()
        slow.close()
    with httpx.Client(timeout=5) as client:  # a kept-alive connection between requests is not cut short
        assert client.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
        time.sleep(0.3)
        assert client.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
