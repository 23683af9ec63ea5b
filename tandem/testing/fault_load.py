"""Streaming clients for fault tests: completions back to back, each answer sorted by how it ended, so a
test can say which requests a fault may fail and how (an error event, a refusal) and which it must not."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

OUTPUT_TOKENS = 16


@dataclass(frozen=True)
class Answer:
    start: float  # time.monotonic() when it was sent
    took_s: float
    kind: str  # ok | error_event | refused | cut | timeout
    tokens: int  # streamed before it ended
    detail: str = ""


@dataclass
class FaultLoad:
    """`clients` threads streaming completions to `url` until close(); each gives up after `deadline_s`."""

    url: str
    clients: int = 3
    deadline_s: float = 30.0
    model: str = "tiny"
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)
        ]
        for t in self._threads:
            t.start()

    def __enter__(self) -> FaultLoad:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> list[Answer]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.deadline_s + 10)
        return self.answers

    def kinds(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for a in self.answers:
                out[a.kind] = out.get(a.kind, 0) + 1
            return out

    def ok_since(self, since: float) -> bool:
        """A request sent at `since` (time.monotonic()) or later streamed every token."""
        with self._lock:
            return any(a.kind == "ok" and a.start >= since for a in self.answers)

    def _run(self, client: int) -> None:
        n = 0
        timeout = httpx.Timeout(self.deadline_s, connect=5)
        with httpx.Client(timeout=timeout, trust_env=False) as http:
            while not self._stop.is_set():
                n += 1
                answer = self.one(http, f"client {client} request {n} " + "word " * (n % 5 * 20))
                with self._lock:
                    self.answers.append(answer)
                if answer.kind != "ok":
                    time.sleep(0.1)

    def one(self, http: httpx.Client, prompt: str) -> Answer:
        return stream_one(http, self.url, self.model, prompt, OUTPUT_TOKENS, self.deadline_s)


def stream_one(
    http: httpx.Client, url: str, model: str, prompt: str, max_tokens: int, deadline_s: float
) -> Answer:
    """One streamed completion, sorted: ok (every token and [DONE]), error_event, refused (an HTTP error
    answer or no connection), cut (ended early without an error), timeout (past `deadline_s`)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    tokens, done, error = 0, False, ""
    deadline = start + deadline_s

    def answer(kind: str, detail: str = "") -> Answer:
        return Answer(start, time.monotonic() - start, kind, tokens, detail)

    try:
        with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return answer("refused", f"HTTP {resp.status_code}: {resp.read().decode()[:200]}")
            for line in resp.iter_lines():
                if time.monotonic() > deadline:
                    return answer("timeout", "past the deadline while streaming")
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        error = str(chunk["error"].get("message", chunk["error"]))[:200]
                    tokens += sum(1 for c in chunk.get("choices") or [] if c.get("text") is not None)
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
    except httpx.TimeoutException as e:
        return answer("timeout", type(e).__name__)
    except httpx.ConnectError as e:
        return answer("refused", f"connect: {e}")
    except httpx.HTTPError as e:
        return answer("cut", f"{type(e).__name__}: {e}")
    if error:
        return answer("error_event", error)
    if done and tokens == max_tokens:
        return answer("ok")
    return answer("cut", f"ended without an error: done={done} tokens={tokens}")
