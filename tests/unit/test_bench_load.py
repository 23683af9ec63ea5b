"""bench.load's pure parts: what each HTTP answer counts as (a 200 stream without a finish reason is a silent
truncation), and when throughput counts as recovered."""

from __future__ import annotations

from bench.load import dechunk, outcome, recovery_s


def _chunked(*events: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body


def test_outcomes():
    token = b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n'
    done = b"data: [DONE]\n\n"
    assert dechunk(_chunked(token, done).partition(b"\r\n\r\n")[2]) == token + done
    assert (
        outcome(_chunked(token, b'data: {"choices":[{"text":"","finish_reason":"stop"}]}\n\n', done)) == "ok"
    )
    assert outcome(_chunked(token, b'data: {"error":{"message":"x"}}\n\n', done)) == "error-event"
    assert outcome(_chunked(token, done)) == "truncated"  # ended without a reason: what must never happen
    assert outcome(_chunked(token)) == "truncated"
    assert outcome(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\n\r\n{}") == "429"
    assert outcome(b"HTTP/1.1 503 Service Unavailable\r\n\r\n{}") == "503 without Retry-After"
    assert outcome(b"HTTP/1.1 500 Internal Server Error\r\n\r\n{}") == "other (500)"
    assert outcome(b"") == "other (no answer)"


def test_recovery_is_the_first_window_at_nine_tenths_of_the_baseline():
    slow = [10.0 + i for i in range(5)]  # 1 req/s for 5 s
    fast = [15.0 + i * 0.1 for i in range(40)]  # then 10 req/s
    got = recovery_s(slow + fast, start=10.0, baseline_rps=10.0)
    assert got is not None and 6.5 <= got <= 7.0
    assert recovery_s(slow, start=10.0, baseline_rps=10.0) is None
