"""Pure text-stream decisions for the router: stop-string truncation with hold-back, and SSE framing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SSE_DONE = "data: [DONE]\n\n"


@dataclass
class TokenLogprob:
    token: str
    logprob: float | None  # None: a prompt's first token, which nothing predicts
    top: list[TokenLogprob] = field(default_factory=list)  # the likeliest tokens at this position, best first


@dataclass
class TextDelta:
    """Text released to the client, the logprobs of the tokens behind it, and the end reason if it ended."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object, as OpenAI frames its stream."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None when none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def holdback_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    That suffix may still grow into a stop string, so it must not be sent yet.
    """
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class StopStringFilter:
    """Feeds decoded text pieces; releases only text that can no longer become part of a stop string.

    Once a stop string appears, everything from its start (or, with `include_stop`, its end) on is dropped and
    `stopped` turns true.
    """

    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        """`include_stop`: the stop string that ended the text is kept at its end (vLLM's
        include_stop_str_in_output)."""
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add text; return what may be sent now."""
        if self.stopped:
            return ""
        text = self.pending + piece
        cut = find_stop(text, self.stops)
        if cut is not None:
            self.pending, self.stopped = "", True
            if self.include_stop:
                return text[: cut + max(len(s) for s in self.stops if text.startswith(s, cut))]
            return text[:cut]
        keep = holdback_length(text, self.stops)
        self.pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self, tail: str = "") -> str:
        """The stream ended: release the held-back text (plus a final `tail`), cut at a stop string."""
        released = self.feed(tail)
        if self.stopped:
            return released
        released, self.pending = released + self.pending, ""
        return released
