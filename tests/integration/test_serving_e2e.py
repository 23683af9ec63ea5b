"""The whole serving path as processes on loopback: the openai client against the router, disaggregated
output equal to colocated output, and workers or the router killed with SIGKILL mid-request."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import grpc
import httpx
import openai
import pytest

from tests.integration.stacks import load, running_stack, spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def disagg(tiny_model_dir, tmp_path_factory):
    with running_stack(
        spec("disagg", tiny_model_dir, prefill=2, decode=2, prefillChunkTokens=32),
        tmp_path_factory.mktemp("disagg"),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def colocated(tiny_model_dir, tmp_path_factory):
    with running_stack(spec("colo", tiny_model_dir, mode="colocated"), tmp_path_factory.mktemp("colo")) as s:
        yield s


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _greedy(url: str, prompt: str, n: int = 24) -> tuple[str, int]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], r.json()["usage"]["completion_tokens"]


def _wait_idle(stack, timeout_s: float = 15.0) -> None:
    """Every live worker back to zero blocks in use and nothing running (one that `tandem up` is still
    restarting does not answer yet, and holds nothing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = []
        for p in stack.plans:
            if p.role in ("prefill", "decode") and stack.running[p.name].poll() is None:
                with contextlib.suppress(grpc.RpcError):
                    reports.append(load(p))
        if all(r.free_kv_blocks == r.total_kv_blocks and r.running_sequences == 0 for r in reports):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"blocks still in use: {reports}")
        time.sleep(0.2)


def test_openai_client_streaming_and_not(disagg):
    _, url = disagg
    client = _client(url)
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    full = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0)
    assert full.usage.completion_tokens >= 1 and full.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="x", temperature=-1)


def test_disaggregated_equals_colocated_token_for_token(disagg, colocated):
    long_prompt = " ".join(f"word{i}" for i in range(300))  # spans dozens of 16-token blocks
    shared = "The quick brown fox jumps over the lazy dog. " * 12
    prompts = ["Hello", long_prompt, shared + "First ending.", shared + "Second ending, reusing the prefix."]
    for prompt in prompts:
        assert _greedy(disagg[1], prompt) == _greedy(colocated[1], prompt), prompt[:40]
    _wait_idle(disagg[0])


def _stream_in_thread(url: str, body: dict, events: list, started: threading.Event):
    def run():
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                events.append(("status", r.status_code))
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(("data", line[6:]))
                        started.set()
        except httpx.HTTPError as e:
            events.append(("transport-error", str(e)))
        finally:
            started.set()
            events.append(("end", None))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _busy(stack, role: str, field: str):
    for p in stack.plans:
        if p.role == role and stack.running[p.name].poll() is None:
            if getattr(load(p), field) > 0:
                return p
    return None


def test_kill_decode_mid_stream_gives_an_error_and_frees_survivors(disagg):
    stack, url = disagg
    events: list = []
    started = threading.Event()
    body = {
        "model": "tiny",
        "prompt": "Tell a long story",
        "max_tokens": 3000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t = _stream_in_thread(url, body, events, started)
    assert started.wait(60)
    victim = None
    for _ in range(100):
        victim = _busy(stack, "decode", "running_sequences")
        if victim:
            break
        time.sleep(0.05)
    assert victim is not None, "no decode worker was running the stream"
    victim_proc = stack.running[victim.name]  # the supervisor puts a restarted process in its place
    os.kill(victim_proc.pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive(), "the client hung"
    data = [e[1] for e in events if e[0] == "data"]
    assert any('"error"' in d for d in data) and data[-1] == "[DONE]"
    victim_proc.wait()
    _wait_idle(stack)
    # the survivors still serve
    assert _greedy(url, "still alive?")[1] >= 1


def test_kill_prefill_mid_transfer_retries_elsewhere(disagg):
    stack, url = disagg
    prompt = " ".join(f"word{i}" for i in range(700))  # ~3.2k tokens, prefilled in 32-token chunks
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    events: list = []
    started = threading.Event()
    t = _stream_in_thread(url, body, events, started)
    victim = None
    for _ in range(400):
        victim = _busy(stack, "prefill", "queued_prompt_tokens")
        if victim:
            break
        time.sleep(0.01)
    if victim is None:
        pytest.skip("prefill finished before it could be caught mid-transfer on this machine")
    os.kill(stack.running[victim.name].pid, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive(), "the client hung"
    statuses = [e[1] for e in events if e[0] == "status"]
    data = [e[1] for e in events if e[0] == "data"]
    assert statuses == [200]
    assert data[-1] == "[DONE]"
    assert not any('"error"' in d for d in data), (
        "the request should have been retried on the other prefill worker"
    )
    _wait_idle(stack)


def test_kill_router_mid_stream_frees_worker_blocks(tiny_model_dir, tmp_path):
    with running_stack(spec("router-kill", tiny_model_dir), tmp_path) as (stack, url):
        events: list = []
        started = threading.Event()
        body = {"model": "tiny", "prompt": "Go on", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        t = _stream_in_thread(url, body, events, started)
        assert started.wait(60)
        os.kill(stack.running["router"].pid, signal.SIGKILL)
        t.join(30)
        assert not t.is_alive()
        assert ("end", None) in events
        _wait_idle(stack)


def test_incompatible_workers_are_refused_with_a_clear_error(tiny_model_dir, tmp_path):
    """A prefill worker whose KV layout differs from the decode worker's (block size here) must never
    push: the request fails with a message that names the mismatch."""
    from tandem.operator.local.plan import plan
    from tandem.operator.local.stack import LocalStack, free_port_block
    from tandem.spec import parse_object

    base = free_port_block(12)
    procs = plan(
        parse_object(spec("mismatch", tiny_model_dir)), tmp_path, port=base, first_worker_port=base + 2
    )
    prefill = next(p for p in procs if p.role == "prefill")
    prefill.argv[prefill.argv.index("--block-size") + 1] = "32"
    stack = LocalStack(procs, tmp_path / "logs")
    stack.start()
    try:
        url = f"http://127.0.0.1:{base}"
        stack.wait_ready(url, timeout_s=240)
        r = httpx.post(
            f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=60
        )
        assert r.status_code == 503
        assert "block_size differs" in r.json()["error"]["message"]
    finally:
        stack.stop()
