"""The contract between the router's HTTP layer and whatever produces tokens (worker pools over gRPC)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from tandem.worker.api.params import PromptLogprobs, SamplingParams


@dataclass
class TokenOut:
    token_id: int
    logprob: float
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last token
    top_logprobs: list[tuple[int, float]] = field(
        default_factory=list
    )  # the likeliest tokens here, best first
    prompt_logprobs: PromptLogprobs | None = None  # on the first token, when the params ask


@dataclass
class Timing:
    """Filled in by the backend as the request moves; the HTTP layer reads it for metrics."""

    prefill_worker: str = ""
    prefill: str = ""  # where the prompt ran: disaggregated | local | colocated ("" before it was routed)
    decode_worker: str = ""
    retries: int = 0
    kv_bytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)


COLD_START_S = "cold_start_s"  # Timing.extra key: seconds the request waited for a pool to wake from zero


class BackendError(Exception):
    """A request the backend could not serve; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 503, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.retry_after_s = status, retry_after_s


class Backend(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, timing: Timing
    ) -> AsyncIterator[TokenOut]:
        """Tokens as they are produced. Raises BackendError (before or during the stream).

        Closing the iterator early (client went away) aborts the request on the workers.
        """
        ...

    def ready(self) -> bool:
        """At least one healthy worker of every pool the mode needs."""
        ...

    def queue_depth(self) -> int:
        """Requests admitted by the router and not yet finished."""
        ...

    def routable_workers(self) -> dict[str, int]:
        """Workers the router can route to now, by pool (prefill, decode, colocated)."""
        ...
