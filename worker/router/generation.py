"""A request through the backend: tokens in, releasable text out (detokenized, cut at stop strings, timed)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from tandem.worker.api.params import PromptLogprobs, SamplingParams
from tandem.worker.hf.tokenizer import StreamDecoder, Tokenizer
from tandem.worker.router.backend import Backend, BackendError, Timing, TokenOut
from tandem.worker.router.metrics import RequestClock
from tandem.worker.router.streaming import StopStringFilter, TextDelta, TokenLogprob


def default_finish_reason(completion_tokens: int, max_tokens: int) -> str:
    """Why a token stream that ended without saying so ended."""
    return "length" if completion_tokens >= max_tokens else "stop"


class Generation:
    """Drives `backend.generate` for one request. `start()` waits for the first token (errors before it
    raise there), `deltas()` yields the text to send, `close()` aborts the rest on the workers."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        clock: RequestClock | None,
    ) -> None:
        """`clock` times the request (None: another generation of the same request does)."""
        self.tokenizer, self.params, self.clock = tokenizer, params, clock
        self.prompt_tokens = len(prompt_ids)
        self.prompt_ids = list(prompt_ids)
        self.prompt_logprobs: PromptLogprobs | None = None  # from the first token, when the params ask
        self.completion_tokens = 0
        self.timing = Timing()
        if clock is not None:
            clock.route_of = lambda: self.timing.prefill
        self._tokens: AsyncIterator[TokenOut] = backend.generate(
            request_id, list(prompt_ids), params, self.timing
        )
        self._first: TokenOut | None = None
        self._started = False
        self._decoder = StreamDecoder(tokenizer, prompt_ids, params.skip_special_tokens)
        self._stops = StopStringFilter(params.stop, params.include_stop_str_in_output)

    async def start(self) -> None:
        if not self._started:
            self._first = await anext(self._tokens, None)
            self._started = True

    async def close(self) -> None:
        """Close the backend iterator (aborting the request on the workers), even while being cancelled."""
        aclose = getattr(self._tokens, "aclose", None)
        if aclose is None:
            return
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await aclose()

    def token_text(self, token_id: int) -> str:
        """A token as logprobs name it."""
        if self.params.return_tokens_as_token_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _logprob(self, token: TokenOut) -> TokenLogprob:
        top = [TokenLogprob(self.token_text(t), lp) for t, lp in token.top_logprobs]
        return TokenLogprob(self.token_text(token.token_id), token.logprob, top)

    def prompt_entries(self) -> list[TokenLogprob]:
        """The prompt's tokens with their logprobs (the first has none: nothing comes before it)."""
        scores = self.prompt_logprobs or []
        entries = [TokenLogprob(self.token_text(self.prompt_ids[0]), None)] if self.prompt_ids else []
        for token_id, (lp, _, top) in zip(self.prompt_ids[1:], scores, strict=False):
            entries.append(
                TokenLogprob(
                    self.token_text(token_id), lp, [TokenLogprob(self.token_text(t), v) for t, v in top]
                )
            )
        return entries

    def prompt_logprobs_field(self) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's `prompt_logprobs`: per prompt token (the first: null) its id's logprob, rank and decoded
        text, and the likeliest tokens there, ranked."""
        out: list[dict[str, dict[str, Any]] | None] = [None] if self.prompt_ids else []
        for token_id, (lp, rank, top) in zip(self.prompt_ids[1:], self.prompt_logprobs or [], strict=False):
            ranked = {
                str(t): {"logprob": v, "rank": i, "decoded_token": self.token_text(t)}
                for i, (t, v) in enumerate(top, 1)
            }
            ranked[str(token_id)] = {"logprob": lp, "rank": rank, "decoded_token": self.token_text(token_id)}
            out.append(ranked)
        return out

    async def deltas(self) -> AsyncIterator[TextDelta]:
        """Text as it becomes safe to send; the last delta carries the finish reason."""
        await self.start()
        token, held = self._first, []
        if token is not None:
            self.prompt_logprobs = token.prompt_logprobs
        while token is not None:
            self.completion_tokens += 1
            if self.clock is not None:
                self.clock.on_token()
            if self.params.logprobs:
                held.append(self._logprob(token))
            piece = self._decoder.push(token.token_id)
            if token.finish_reason not in (None, "stop", "length"):  # an abort or error is never an answer
                raise BackendError(f"the request ended on the worker with {token.finish_reason}", status=503)
            if token.finish_reason is not None:
                text = self._stops.finish(piece + self._decoder.flush())
                reason = "stop" if self._stops.stopped else token.finish_reason
                yield TextDelta(text, held, reason)
                return
            text = self._stops.feed(piece)
            if self._stops.stopped:
                await self.close()  # the engine may not know the stop string ended the answer
                yield TextDelta(text, held, "stop")
                return
            if text:
                yield TextDelta(text, held)
                held = []
            token = await anext(self._tokens, None)
        text = self._stops.finish(self._decoder.flush())
        reason = (
            "stop"
            if self._stops.stopped
            else default_finish_reason(self.completion_tokens, self.params.max_tokens)
        )
        yield TextDelta(text, held, reason)
