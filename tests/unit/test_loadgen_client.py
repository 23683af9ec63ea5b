"""Request building and SSE chunk parsing for `tandem bench` (no network)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.loadgen.client import build_payload, chunk_text, sse_data, stream_chunks


def test_payloads_stream_and_pin_the_output_length() -> None:
    body = build_payload("completions", "m", "hello there", 17)
    assert body["prompt"] == "hello there" and "messages" not in body
    assert body["max_tokens"] == body["min_tokens"] == 17
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    chat = build_payload("chat", "m", "hi", 3)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in chat
    with pytest.raises(ValueError):
        build_payload("embeddings", "m", "hi", 3)


def test_sse_data_lines() -> None:
    assert sse_data('data: {"a": 1}') == '{"a": 1}'
    assert sse_data("data:[DONE]") == "[DONE]"
    assert sse_data(": keep-alive") is None
    assert sse_data("") is None
    assert sse_data("event: message") is None


def test_stream_chunks_stop_at_done_and_raise_on_an_error_event() -> None:
    lines = [": keep-alive", 'data: {"choices": [{"text": "a"}]}', "", 'data: {"usage": {}}', "data: [DONE]"]
    assert list(stream_chunks([*lines, 'data: {"late": 1}'])) == [{"choices": [{"text": "a"}]}, {"usage": {}}]
    with pytest.raises(RuntimeError, match="context too long"):
        list(stream_chunks(['data: {"error": {"message": "context too long"}}']))


def test_chunk_text_for_both_endpoints() -> None:
    assert chunk_text({"choices": [{"index": 0, "text": "ab"}]}) == "ab"
    assert chunk_text({"choices": [{"delta": {"content": "cd"}}]}) == "cd"
    assert chunk_text({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == ""
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""
    assert chunk_text({"choices": [{"delta": {}, "finish_reason": "length"}]}) == ""


def test_loadgen_does_not_import_torch() -> None:
    code = (
        "import sys, tandem.loadgen.cli, tandem.loadgen.runner, tandem.loadgen.plots;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
