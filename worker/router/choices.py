"""A request's `n` choices: their generations run side by side and are joined into one answer or one SSE
stream; a chat choice is read as text or, when the request has tools, as tool calls (structured.py).

Every choice is a generation of its own on the workers (choice i samples with seed + i when the request
has a seed). The request's clock (TTFT, TPOT) times choice 0. A chat choice that may be a tool call is held
back while it still may be one (all of it when the call is forced), then sent as `tool_calls` with
`finish_reason: tool_calls`, or as content once it cannot be a call.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tandem.worker.api.params import SamplingParams
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.backend import Backend, Timing
from tandem.worker.router.generation import Generation
from tandem.worker.router.metrics import RequestClock
from tandem.worker.router.streaming import TextDelta, TokenLogprob
from tandem.worker.router.structured import ToolCall, may_be_tool_call, parse_tool_calls

Chunk = dict[str, Any]


def choice_params(params: SamplingParams, choice: int) -> SamplingParams:
    """Choice `choice`'s parameters: its own seed (the request's plus its index) when the request has one."""
    if choice == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + choice) % 2**64)


class Generations:
    """The `n` generations of one request, driven together; to the HTTP layer it is one (start, close,
    timing, token counts)."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        clock: RequestClock,
        n: int,
    ) -> None:
        self.tokenizer, self.prompt_ids = tokenizer, list(prompt_ids)
        self.each = [
            Generation(
                backend,
                tokenizer,
                request_id if i == 0 else f"{request_id}-{i}",
                prompt_ids,
                choice_params(params, i),
                clock if i == 0 else None,
            )
            for i in range(n)
        ]

    @property
    def timing(self) -> Timing:
        return self.each[0].timing

    @property
    def prompt_tokens(self) -> int:
        return self.each[0].prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(g.completion_tokens for g in self.each)

    async def start(self) -> None:
        await asyncio.gather(*(g.start() for g in self.each))

    async def close(self) -> None:
        for g in self.each:
            await g.close()

    def usage(self) -> dict[str, int]:
        return oa.usage(self.prompt_tokens, self.completion_tokens)


async def deltas_by_choice(gens: Generations) -> AsyncIterator[tuple[int, TextDelta]]:
    """Every choice's deltas, tagged with its index, as they come."""
    if len(gens.each) == 1:
        async for d in gens.each[0].deltas():
            yield 0, d
        return
    iters = [g.deltas() for g in gens.each]
    pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iters)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    delta = fut.result()
                except StopAsyncIteration:
                    continue
                yield i, delta
                pending[asyncio.ensure_future(anext(iters[i]))] = i
    finally:
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for it in iters:
            await it.aclose()


async def collect(gens: Generations) -> list[TextDelta]:
    """Each choice's deltas joined into one."""
    whole = [TextDelta("") for _ in gens.each]
    async for i, d in deltas_by_choice(gens):
        whole[i].text += d.text
        whole[i].logprobs += d.logprobs
        whole[i].finish_reason = d.finish_reason or whole[i].finish_reason
    return whole


@dataclasses.dataclass
class ToolReading:
    """How a chat request's choices are read: `tools` set when they may be tool calls, `forced` when they must
    be."""

    tools: list[dict[str, Any]] | None
    forced: bool

    @classmethod
    def of(cls, req: oa.ChatCompletionRequest) -> ToolReading:
        if req.tool_choice == "none":
            return cls(None, False)
        return cls(req.tool_dicts(), req.forces_tool_call())

    def calls(self, text: str, finish_reason: str | None) -> list[ToolCall] | None:
        """The tool calls a finished choice made (None: its text is content)."""
        if not self.tools or finish_reason != "stop":
            return None
        return parse_tool_calls(text, self.tools)


def chat_finish_reason(reason: str | None, calls: list[ToolCall] | None) -> str | None:
    return "tool_calls" if calls else reason


def echoed(req: oa.SamplingRequest, gens: Generations) -> str:
    """The text `echo` puts before each choice's: completions the prompt (as the workers saw it); chat, as
    vLLM, the last message when it is the assistant's (the answer continues it)."""
    if not req.echo:
        return ""
    if isinstance(req, oa.ChatCompletionRequest):
        last = req.messages[-1]
        return last.for_template()["content"] if last.role == "assistant" else ""
    prompt = req.single_prompt() if isinstance(req, oa.CompletionRequest) else None
    if isinstance(prompt, str) and req.truncate_prompt_tokens is None:
        return prompt
    return gens.tokenizer.decode(gens.prompt_ids)


def answer_completion(
    whole: list[TextDelta], gens: Generations, req: oa.CompletionRequest, rid: str, model: str
) -> Chunk:
    echo = echoed(req, gens)
    choices = []
    for i, (d, gen) in enumerate(zip(whole, gens.each, strict=True)):
        entries = (gen.prompt_entries() if req.echo else []) + d.logprobs  # echo: the prompt's scores first
        lp = oa.completion_logprobs(entries, 0) if req.wants_logprobs() else None
        extra = {} if req.prompt_logprobs is None else {"prompt_logprobs": gen.prompt_logprobs_field()}
        choices.append(oa.completion_choice(echo + d.text, d.finish_reason, lp, i, **extra))
    return oa.completion_object(rid, oa.now_s(), model, choices, gens.usage(), chunk=False)


def answer_chat(
    whole: list[TextDelta], gens: Generations, req: oa.ChatCompletionRequest, rid: str, model: str
) -> Chunk:
    reading, echo = ToolReading.of(req), echoed(req, gens)
    choices = []
    for i, d in enumerate(whole):
        calls = reading.calls(d.text, d.finish_reason)
        lp = oa.chat_logprobs(d.logprobs) if req.wants_logprobs() and not calls else None
        tool_calls = [c.as_openai() for c in calls] if calls else None
        content = None if calls else echo + d.text
        choices.append(oa.chat_choice(content, chat_finish_reason(d.finish_reason, calls), lp, i, tool_calls))
    body = oa.chat_object(rid, oa.now_s(), model, choices, gens.usage(), chunk=False)
    if req.prompt_logprobs is not None:  # vLLM: the prompt's, once for the request
        body["prompt_logprobs"] = gens.each[0].prompt_logprobs_field()
    return body


async def completion_chunks(
    gens: Generations, req: oa.CompletionRequest, rid: str, created: int, model: str
) -> AsyncIterator[Chunk]:
    def chunk(choices: list[dict], usage: dict | None = None) -> dict:
        if usage is None and req.continuous_usage:
            usage = gens.usage()  # the counts so far, on every chunk
        return oa.completion_object(
            rid, created, model, choices, usage, chunk=True, usage_field=req.include_usage
        )

    offsets = [0] * len(gens.each)
    if echo := echoed(req, gens):
        for i in range(len(gens.each)):
            yield chunk([oa.completion_choice(echo, None, None, i)])
    async for i, d in deltas_by_choice(gens):
        lp = oa.completion_logprobs(d.logprobs, offsets[i]) if req.wants_logprobs() else None
        offsets[i] += sum(len(e.token) for e in d.logprobs)
        if d.text or d.finish_reason is None:
            yield chunk([oa.completion_choice(d.text, None, lp, i)])
            lp = None
        if d.finish_reason is not None:
            yield chunk([oa.completion_choice("", d.finish_reason, lp, i)])
    if req.include_usage:
        yield chunk([], gens.usage())


@dataclasses.dataclass
class HeldText:
    """A chat choice's text held back while it may still be a tool call."""

    holding: bool
    text: str = ""
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)

    def take(self) -> TextDelta:
        out = TextDelta(self.text, self.logprobs)
        self.text, self.logprobs = "", []
        return out


async def chat_chunks(
    gens: Generations, req: oa.ChatCompletionRequest, rid: str, created: int, model: str
) -> AsyncIterator[Chunk]:
    def chunk(choices: list[dict], usage: dict | None = None) -> dict:
        if usage is None and req.continuous_usage:
            usage = gens.usage()  # the counts so far, on every chunk
        return oa.chat_object(rid, created, model, choices, usage, chunk=True, usage_field=req.include_usage)

    def content(i: int, d: TextDelta) -> Chunk:
        lp = oa.chat_logprobs(d.logprobs) if req.wants_logprobs() else None
        return chunk([oa.chat_delta_choice({"content": d.text}, None, lp, i)])

    reading = ToolReading.of(req)
    held = [HeldText(holding=reading.tools is not None) for _ in gens.each]
    echo = echoed(req, gens)
    for i in range(len(gens.each)):
        yield chunk([oa.chat_delta_choice({"role": "assistant", "content": ""}, None, None, i)])
        if echo:
            yield chunk([oa.chat_delta_choice({"content": echo}, None, None, i)])
    async for i, d in deltas_by_choice(gens):
        h = held[i]
        if h.holding:
            h.text += d.text
            h.logprobs += d.logprobs
            if reading.forced or may_be_tool_call(h.text):
                if d.finish_reason is None:
                    continue
                calls = reading.calls(h.text, d.finish_reason)
                if calls:
                    delta = {"tool_calls": [c.as_openai(index=j) for j, c in enumerate(calls)]}
                    yield chunk([oa.chat_delta_choice(delta, None, None, i)])
                    yield chunk([oa.chat_delta_choice({}, "tool_calls", None, i)])
                    continue
            h.holding = False
            d = _released(h, d)
        if d.text or d.finish_reason is None:
            yield content(i, d)
            d = TextDelta("", [], d.finish_reason)
        if d.finish_reason is not None:
            lp = oa.chat_logprobs(d.logprobs) if req.wants_logprobs() and d.logprobs else None
            yield chunk([oa.chat_delta_choice({}, d.finish_reason, lp, i)])
    if req.include_usage:
        yield chunk([], gens.usage())


def _released(h: HeldText, d: TextDelta) -> TextDelta:
    """What a choice sends once it stops holding back: everything held, ending as `d` ends."""
    taken = h.take()
    return TextDelta(taken.text, taken.logprobs, d.finish_reason)
