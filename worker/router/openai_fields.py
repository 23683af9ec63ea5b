"""The field audit: which OpenAI request fields the router implements, and a 400 naming any other field a
request sets to something but its no-op value, so that nothing a client asks for is silently ignored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.worker.router.openai_errors import ApiError

if TYPE_CHECKING:
    from tandem.worker.router.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingRequest

# Chat fields with no effect on the answer, accepted at these values only (anything else is a 400)
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "functions": (None,),
    "function_call": (None,),
}


def check_sampling(req: SamplingRequest) -> None:
    """The fields completions and chat completions share."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise ApiError(400, f"{name} is not supported (use 0)", param=name)
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
    if req.min_tokens and req.max_tokens is not None and req.min_tokens > req.max_tokens:
        raise ApiError(400, f"min_tokens ({req.min_tokens}) exceeds max_tokens", param="min_tokens")


def check_completion(req: CompletionRequest) -> None:
    check_sampling(req)
    if req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if req.best_of not in (None, req.n):
        raise ApiError(400, "best_of is not supported (leave it unset, or equal to n)", param="best_of")
    if req.suffix:
        raise ApiError(400, "suffix (insertion) is not supported", param="suffix")
    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str | list):
        if len(req.prompt) != 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")


def check_chat(req: ChatCompletionRequest) -> None:
    check_sampling(req)
    for name, allowed in NO_OP_VALUES.items():
        if getattr(req, name) not in allowed:
            raise ApiError(400, f"{name} is not supported", param=name)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    rf = req.response_format
    if rf is not None and (rf.type == "json_schema") != (rf.json_schema is not None):
        raise ApiError(400, "response_format: json_schema is required with (and only with) type json_schema",
                       param="response_format")  # fmt: skip
    if req.tool_choice is not None and not req.tools and req.tool_choice != "none":
        raise ApiError(400, "tool_choice needs tools", param="tool_choice")
    if req.forces_tool_call() and rf is not None and rf.type != "text":
        raise ApiError(400, "response_format cannot be combined with a forced tool call", param="response_format")
    if req.grammar_wanted() and req.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with structured output", param="ignore_eos")
