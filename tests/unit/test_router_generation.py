"""The router's HTTP app against a scripted backend: completion and chat shapes, logprobs, stop strings."""

from __future__ import annotations

import pytest

from tandem.worker.router.app import create_app
from tandem.worker.router.streaming import StopStringFilter, find_stop, holdback_length
from tests.unit.router_harness import ANSWER, CHAT, SERVED, ScriptedBackend, post, sse_events

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
    kept = StopStringFilter(["<end>"], include_stop=True)  # the stop string is kept, nothing after it
    assert [kept.feed(p) for p in ["hi <", "e", "nd> more"]] == ["hi ", "", "<end>"] and kept.stopped


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
    assert not any("127.0.0.1:700" in v for v in r.headers.values()), (
        r.headers
    )  # worker addresses stay inside
    assert params.max_tokens == 16 and params.temperature == 0.0 and params.greedy


@pytest.mark.asyncio
async def test_completion_accepts_token_ids_and_passes_sampling_fields(tok):
    backend = ScriptedBackend(tok, finish="length")
    app = create_app(backend, tok, SERVED)
    req = {
        "model": SERVED,
        "prompt": [5, 6, 7],
        "max_tokens": 40,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 3,
        "stop": "zzz",
        "stop_token_ids": [9],
        "ignore_eos": True,
        "min_tokens": 2,
        "user": "u",
    }
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
    assert not any("127.0.0.1:700" in v for v in r.headers.values()), (
        r.headers
    )  # worker addresses stay inside
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
    assert ids == tok.encode(
        tok.apply_chat_template(CHAT, add_generation_prompt=True), add_special_tokens=False
    )
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
