"""vLLM's request extensions through the router's app: what benchmarks and frameworks send to "a vLLM
endpoint" gets the outcome docs/openai-compatibility.md gives it."""

from __future__ import annotations

import pytest

from tandem.worker.router.app import create_app
from tests.unit.router_harness import ANSWER, CHAT, SERVED, ScriptedBackend, post, sse_events

ENDPOINTS = {
    "/v1/completions": {"model": SERVED, "prompt": "Hi"},
    "/v1/chat/completions": {"model": SERVED, "messages": CHAT},
}


@pytest.mark.asyncio
@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_continuous_usage_stats_puts_the_running_usage_on_every_chunk(tok, path):
    """guidellm's stream options: every chunk carries the counts so far, and the usage chunk ends it."""
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    options = {"include_usage": True, "continuous_usage_stats": True}
    r = await post(app, path, {**ENDPOINTS[path], "stream": True, "stream_options": options})
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks, last = events[:-2], events[-2]
    prompt_tokens = last["usage"]["prompt_tokens"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(backend.ids)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == len(backend.ids) and len(set(counts)) > 3
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert all(c["usage"]["total_tokens"] == prompt_tokens + c["usage"]["completion_tokens"] for c in chunks)
    text_key = "text" if path == "/v1/completions" else "content"
    texts = [c["choices"][0].get(text_key) or c["choices"][0].get("delta", {}).get(text_key) or "" for c in chunks]
    assert "".join(texts) == ANSWER


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("options", "usage_chunks"),
    [
        ({"continuous_usage_stats": True}, "all"),  # vLLM: include_usage unset counts as on here
        ({"include_usage": False, "continuous_usage_stats": True}, "none"),
        ({"include_usage": True, "continuous_usage_stats": False}, "last"),
    ],
)
async def test_continuous_usage_stats_follows_include_usage_as_vllm_does(tok, options, usage_chunks):
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    body = {**ENDPOINTS["/v1/completions"], "stream": True, "stream_options": options}
    events = sse_events((await post(app, "/v1/completions", body)).text)[:-1]
    with_usage = [e.get("usage") is not None for e in events]
    assert with_usage == {"all": [True] * len(events), "none": [False] * len(events),
                          "last": [False] * (len(events) - 1) + [True]}[usage_chunks]  # fmt: skip
