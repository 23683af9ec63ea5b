"""A client that leaves frees everything it held on both pools within a second: KV blocks, reservations,
staged transfers and token queues, whether it leaves right after sending (a burst, during the reservation),
while its prompt is prefilled and its KV pushed, or while its answer is decoded. Real router and workers on
loopback."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tandem import names
from tests.integration.stacks import load, running_stack, spec

pytestmark = pytest.mark.slow

FREED_WITHIN_S = 1.0  # what the issue asks of every case, from the disconnect to zero on both pools
LONG_PROMPT = " ".join(f"word{i}" for i in range(600))  # ~2.7k tokens, prefilled 16 at a time


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    obj = spec("leaves", tiny_model_dir, prefillChunkTokens=16)
    with running_stack(obj, tmp_path_factory.mktemp("leaves")) as (running, url):
        yield running, url


def _send(url: str, body: dict) -> socket.socket:
    """POST a streaming request on a bare socket, so the test decides when the connection drops."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def _gauge(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def _held(running) -> dict[str, tuple[float, float, int]]:
    """Per worker: KV blocks in use, requests held, and (decode) blocks reserved for transfers."""
    out = {}
    for p in running.plans:
        if p.role == "router":
            continue
        host = p.address.rsplit(":", 1)[0]
        text = httpx.get(f"http://{host}:{p.metrics_port}/metrics", timeout=5).text
        reserved = load(p).reserved_kv_blocks if p.role == "decode" else 0
        out[p.role] = (_gauge(text, names.KV_BLOCKS_USED), _gauge(text, names.WORKER_HELD_REQUESTS), reserved)
    return out


def _freed_after(running, since: float, limit_s: float = 10.0) -> float:
    """Seconds from `since` until both pools hold nothing (fails past `limit_s`)."""
    while True:
        held = _held(running)
        if all(v == (0, 0, 0) for v in held.values()):
            return time.monotonic() - since
        assert time.monotonic() - since < limit_s, f"still held {limit_s:g} s after the client left: {held}"
        time.sleep(0.02)


def _wait(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_burst_of_clients_leaving_right_after_sending_holds_nothing(stack):
    running, url = stack
    socks = []
    for i in range(24):
        socks.append(
            _send(
                url,
                {
                    "model": "tiny",
                    "prompt": f"{i} " + LONG_PROMPT[: 200 * (1 + i % 4)],
                    "max_tokens": 32,
                    "stream": True,
                },
            )
        )
        time.sleep(0.005 * (i % 5))
        socks.pop(0).close() if len(socks) > 2 else None
    for s in socks:
        s.close()
    gone = time.monotonic()
    assert _freed_after(running, gone) < FREED_WITHIN_S


def test_a_client_leaving_mid_transfer_frees_both_pools(stack):
    running, url = stack
    decode = next(p for p in running.plans if p.role == "decode")
    prefill = next(p for p in running.plans if p.role == "prefill")
    host = prefill.address.rsplit(":", 1)[0]

    def prefilled() -> float:
        text = httpx.get(f"http://{host}:{prefill.metrics_port}/metrics", timeout=5).text
        return _gauge(text, names.PREFILL_TOKENS_TOTAL)

    before = prefilled()
    sock = _send(url, {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 32, "stream": True})
    # chunks computed (and their layers pushed) while the reservation waits for the rest
    _wait(
        lambda: load(decode).reserved_kv_blocks > 0 and prefilled() > before + 32, "the transfer never began"
    )
    sock.close()
    gone = time.monotonic()
    assert _freed_after(running, gone) < FREED_WITHIN_S


def test_a_client_leaving_mid_decode_frees_both_pools(stack):
    running, url = stack
    sock = _send(
        url,
        {"model": "tiny", "prompt": "hello there", "max_tokens": 3000, "ignore_eos": True, "stream": True},
    )
    received = b""
    while received.count(b"data: ") < 5:  # tokens are streaming: the sequence is in the decode batch
        chunk = sock.recv(65536)
        assert chunk, f"the stream ended early: {received[-300:]!r}"
        received += chunk
    assert b'"error"' not in received
    sock.close()
    gone = time.monotonic()
    assert _freed_after(running, gone) < FREED_WITHIN_S
    ok = httpx.post(
        f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=60
    )
    assert ok.status_code == 200
