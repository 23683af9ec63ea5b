"""Conditional disaggregation through `tandem up`: a short prompt is prefilled on the decode worker, a long
one on the prefill pool, as the X-Tandem-Prefill header, the router's metrics and the workers' own prefill
counters show; while the decode worker streams, the next request runs whole on the prefill worker; greedy text
is the same whichever way a prompt ran, and a decode worker killed under a local prefill ends the stream with
an error."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tandem import names
from tests.integration.stacks import metric, running_stack, spec
from tests.integration.test_serving_e2e import _busy, _stream_in_thread, _wait_idle

pytestmark = pytest.mark.slow

THRESHOLD = 32
SHORT = "Hello there, how are you?"
LONG = " ".join(f"word{i}" for i in range(200))
FRESH = " ".join(f"item{i}" for i in range(200))  # a long prompt no worker has cached


def _with_router(obj: dict, disaggregation: dict) -> dict:
    obj["spec"]["router"] = {"disaggregation": disaggregation}
    return obj


@pytest.fixture(scope="module")
def conditional(tiny_model_dir, tmp_path_factory):
    obj = _with_router(
        spec("cond", tiny_model_dir, prefillChunkTokens=32),
        {
            "mode": "conditional",
            "localPrefillMaxTokens": THRESHOLD,
            "prefillQueueTokens": 100_000,
            "mixedDecodeRatio": 1.0,
        },  # a request sent one at a time never finds the decode worker busy
    )
    with running_stack(obj, tmp_path_factory.mktemp("cond")) as s:
        yield s


@pytest.fixture(scope="module")
def never(tiny_model_dir, tmp_path_factory):
    """Every prompt prefilled on its decode worker: no prefill pool at all."""
    obj = _with_router(spec("never", tiny_model_dir, prefill=0, prefillChunkTokens=32), {"mode": "never"})
    with running_stack(obj, tmp_path_factory.mktemp("never")) as s:
        yield s


def _greedy(url: str, prompt: str) -> tuple[str, int, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return (
        r.json()["choices"][0]["text"],
        r.json()["usage"]["prompt_tokens"],
        r.headers[names.PREFILL_ROUTE_HEADER],
    )


def _worker_metrics_url(stack, role: str) -> str:
    p = next(p for p in stack.plans if p.role == role)
    return f"http://{p.address.rsplit(':', 1)[0]}:{p.metrics_port}"


def _prefilled(stack, role: str) -> float:
    return metric(_worker_metrics_url(stack, role), names.PREFILL_TOKENS_TOTAL)


def _until(check, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_short_prompts_run_on_the_decode_worker_and_long_ones_disaggregated(conditional, never):
    stack, url = conditional
    before = _prefilled(stack, "prefill")
    short_text, short_len, short_route = _greedy(url, SHORT)
    assert short_len <= THRESHOLD and short_route == "local"
    time.sleep(0.3)  # the engine counts a step's tokens after it; let the prefill worker show it did none
    assert _prefilled(stack, "prefill") == before, "a local prompt reached the prefill worker"
    long_text, long_len, long_route = _greedy(url, LONG)
    assert long_len > THRESHOLD and long_route == "disaggregated"
    _until(
        lambda: _prefilled(stack, "prefill") >= before + long_len,
        "the long prompt was not prefilled remotely",
    )
    for route in ("local", "disaggregated"):
        assert metric(url, names.TTFT_SECONDS + "_count", prefill=route) == 1
        assert metric(url, names.REQUESTS_TOTAL, prefill=route, status="200") == 1
    # the same prompts with every prefill on the decode worker: the same greedy text
    assert _greedy(never[1], SHORT) == (short_text, short_len, "local")
    assert _greedy(never[1], LONG) == (long_text, long_len, "local")
    _wait_idle(stack)
    _wait_idle(never[0])


def test_a_busy_decode_worker_s_next_request_runs_whole_on_the_prefill_worker(conditional, never):
    stack, url = conditional
    body = {
        "model": "tiny",
        "prompt": SHORT,
        "max_tokens": 3000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, timeout=60
    ) as first:  # occupies the decode worker
        assert first.headers[names.PREFILL_ROUTE_HEADER] == "local"
        lines = first.iter_lines()  # held: a dropped iterator would close the response
        next(lines)
        prefilled = _prefilled(stack, "prefill")
        text, prompt_len, route = _greedy(url, FRESH)
        assert route == "mixed"
        assert _busy(stack, "decode", "running_sequences") is not None, "the first stream ended early"
    # the client left the first stream: the router aborts it on the decode worker
    assert metric(url, names.REQUESTS_TOTAL, prefill="mixed", status="200") == 1
    _until(
        lambda: _prefilled(stack, "prefill") >= prefilled + prompt_len,
        "the prefill worker did not run the prompt",
    )
    assert _greedy(never[1], FRESH) == (
        text,
        prompt_len,
        "local",
    )  # the same text, prefilled and decoded anywhere
    _wait_idle(stack)


def test_a_decode_worker_killed_under_a_local_prefill_ends_the_stream_with_an_error(conditional):
    stack, url = conditional
    events: list = []
    started = threading.Event()
    body = {
        "model": "tiny",
        "prompt": SHORT,
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
    victim_proc = stack.running[victim.name]
    os.kill(victim_proc.pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive(), "the client hung"
    data = [e[1] for e in events if e[0] == "data"]
    assert any('"error"' in d for d in data) and data[-1] == "[DONE]"
    assert metric(url, names.REQUESTS_TOTAL, prefill="local", status="503") == 1
    victim_proc.wait()
