"""The field audit: which request fields (OpenAI's and vLLM's extensions) the router implements, which it
accepts with no effect, and a 400 naming any other field a request sets to something but its no-op value,
so that nothing a client asks for is silently ignored. docs/openai-compatibility.md is this table in prose."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.worker.router.openai_errors import ApiError

if TYPE_CHECKING:
    from tandem.worker.router.openai_schema import ChatCompletionRequest, CompletionRequest, SamplingRequest

IMPLEMENTED, NO_OP, REFUSED = "implemented", "accepted, no effect", "refused (400)"

# Fields this server does not do, accepted at these values only (their no-op ones); anything else is a 400.
# A dotted name is a field of a nested object.
REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    # OpenAI's
    "logit_bias": (None, {}),
    "suffix": (None, ""),
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
    # vLLM's
    "use_beam_search": (False,),
    "length_penalty": (1.0,),
    "spaces_between_special_tokens": (True,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "guided_whitespace_pattern": (None,),
    "priority": (0,),
    "logits_processors": (None,),
    "kv_transfer_params": (None,),
    "vllm_xargs": (None,),
    "chat_template": (None,),
    "mm_processor_kwargs": (None,),
    "structural_tag": (None,),
    "prompt_embeds": (None,),
    "structured_outputs.structural_tag": (None,),
    "structured_outputs.whitespace_pattern": (None,),
    "structured_outputs.disable_any_whitespace": (False,),
    "structured_outputs.disable_additional_properties": (False,),
}
# Fields accepted whatever their value, because they change nothing in the answer
NO_EFFECT = {
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "parallel_tool_calls",
    "guided_decoding_backend",
    "include_reasoning",
    "structured_outputs.disable_fallback",
    "structured_outputs.backend",
}
REFUSED_ELSEWHERE = {"best_of"}  # refused unless equal to n (check_completion)
NESTED = ("stream_options", "structured_outputs")


def outcome(field: str) -> str:
    """What this server does with `field` (a dotted name for a nested one)."""
    if field in REFUSED_UNLESS or field in REFUSED_ELSEWHERE:
        return REFUSED
    return NO_OP if field in NO_EFFECT else IMPLEMENTED


def _value(req: Any, dotted: str) -> tuple[bool, Any]:
    """(whether the request sets the field at all: its model has it, and a nested one's parent is set; its
    value)."""
    obj = req
    for part in dotted.split("."):
        if obj is None:
            return False, None
        if part not in type(obj).model_fields:
            return False, None
        obj = getattr(obj, part)
    return True, obj


def check_refused(req: Any) -> None:
    for name, allowed in REFUSED_UNLESS.items():
        has, value = _value(req, name)
        if has and value not in allowed:
            raise ApiError(400, f"{name} is not supported by this server", param=name)


def check_sampling(req: SamplingRequest) -> None:
    """The fields completions and chat completions share."""
    check_refused(req)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
    if req.min_tokens and req.max_tokens is not None and req.min_tokens > req.max_tokens:
        raise ApiError(400, f"min_tokens ({req.min_tokens}) exceeds max_tokens", param="min_tokens")
    rf = req.response_format
    if rf is not None and (rf.type == "json_schema") != (rf.json_schema is not None):
        raise ApiError(
            400,
            "response_format: json_schema is required with (and only with) type json_schema",
            param="response_format",
        )
    if req.prompt_logprobs is not None and req.stream:
        raise ApiError(400, "prompt_logprobs are not available when stream is true", param="prompt_logprobs")
    constraints = req.constraints()
    if len(constraints) > 1:
        first, second = constraints[0][0], constraints[1][0]
        raise ApiError(400, f"{second} cannot be combined with {first}: one output constraint", param=second)
    if constraints and req.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with structured output", param="ignore_eos")


def check_completion(req: CompletionRequest) -> None:
    check_sampling(req)
    if req.echo and req.logprobs is not None and req.stream:
        raise ApiError(400, "echo with logprobs is not available when stream is true", param="echo")
    if req.best_of not in (None, req.n):
        raise ApiError(400, "best_of is not supported (leave it unset, or equal to n)", param="best_of")
    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str | list):
        if len(req.prompt) != 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")


def check_chat(req: ChatCompletionRequest) -> None:
    check_sampling(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if req.tool_choice is not None and not req.tools and req.tool_choice != "none":
        raise ApiError(400, "tool_choice needs tools", param="tool_choice")
    if req.forces_tool_call() and req.constraints():
        param = req.constraints()[0][0]
        raise ApiError(400, f"{param} cannot be combined with a forced tool call", param=param)
    if req.echo and req.logprobs:
        raise ApiError(
            400,
            "echo with logprobs is only for completions (the prompt's logprobs: prompt_logprobs)",
            param="echo",
        )
    if req.echo and req.tools and req.tool_choice != "none":
        raise ApiError(400, "echo cannot be combined with tool calls", param="echo")
    if req.forces_tool_call() and req.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with structured output", param="ignore_eos")
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(
            400, "continue_final_message needs add_generation_prompt: false", param="continue_final_message"
        )
