"""The OpenAI wire format the router speaks: the request models, each field range-checked.

Which fields are implemented and which are refused is the field audit (openai_fields.py); the error shape
(openai_errors.py) and the response shapes (openai_responses.py) are re-exported here, so that callers name
the wire format by one module.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.worker.api.params import MAX_CACHE_SALT, MAX_TOP_LOGPROBS, UINT32_MAX, UINT64_MAX, SamplingParams
from tandem.worker.router import openai_fields
from tandem.worker.router.openai_errors import ApiError as ApiError
from tandem.worker.router.openai_errors import describe_validation_error as describe_validation_error
from tandem.worker.router.openai_errors import error_body as error_body
from tandem.worker.router.openai_responses import chat_choice as chat_choice
from tandem.worker.router.openai_responses import chat_delta_choice as chat_delta_choice
from tandem.worker.router.openai_responses import chat_logprobs as chat_logprobs
from tandem.worker.router.openai_responses import chat_message as chat_message
from tandem.worker.router.openai_responses import chat_object as chat_object
from tandem.worker.router.openai_responses import completion_choice as completion_choice
from tandem.worker.router.openai_responses import completion_logprobs as completion_logprobs
from tandem.worker.router.openai_responses import completion_object as completion_object
from tandem.worker.router.openai_responses import new_id as new_id
from tandem.worker.router.openai_responses import now_s as now_s
from tandem.worker.router.openai_responses import usage as usage
from tandem.worker.router.openai_vllm import (
    VllmChatExtensions,
    VllmCompletionExtensions,
    VllmSamplingExtensions,
)

MAX_LOGPROBS = MAX_TOP_LOGPROBS  # the most alternatives OpenAI's API lets a client ask for
MAX_CHOICES = 16  # n: answers per request, each a generation of its own
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seeds OpenAI clients (and vLLM) accept
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)  # every field a request may carry is declared
# vLLM's guided decoding fields, each one kind of constraint on the output
GUIDED_FIELDS = (
    ("guided_json", "json"),
    ("guided_regex", "regex"),
    ("guided_choice", "choice"),
    ("guided_grammar", "grammar"),
)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None  # unset: off, unless continuous_usage_stats asks for usage (as vLLM)
    # vLLM's extension: every chunk carries the usage so far, not only the last
    continuous_usage_stats: bool = False

    @property
    def usage_wanted(self) -> bool:
        return bool(self.include_usage) or (self.include_usage is None and self.continuous_usage_stats)


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the grammar enforces the schema either way


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class SamplingRequest(VllmSamplingExtensions):
    """Fields shared by completions and chat completions (OpenAI's, and vLLM's extensions), each range-checked
    here so that nothing a client sends fails later on the wire. Every field is implemented, accepted as a
    no-op, or refused with a 400 naming it (`check_supported`) when set to anything but its no-op value; an
    unknown field is a 400 too."""

    model_config = STRICT

    model: str
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=UINT32_MAX)  # -1 or 0: off
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=UINT32_MAX)  # vLLM's extension: no EOS or stop token id before it
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the operator's logs: no effect on the answer
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extension: prefix-cache blocks are shared only between requests with the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)
    response_format: ResponseFormat | None = None  # chat's, and vLLM's on completions

    def check_supported(self) -> None:
        """A 400 naming the first field set to something this server does not do (openai_fields.py)."""
        openai_fields.check_sampling(self)

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        bad = [t for t in self.stop_token_ids or [] if t >= vocab_size]
        if bad:
            raise ApiError(
                400,
                f"stop_token_ids outside the vocabulary of {vocab_size}: {bad[:5]}",
                param="stop_token_ids",
            )

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.usage_wanted)

    @property
    def continuous_usage(self) -> bool:
        """Every streamed chunk carries the usage so far (vLLM's semantics: only with usage wanted at all)."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    def alternatives(self) -> int:
        """How many most likely tokens to report beside each one (top_logprobs)."""
        raise NotImplementedError

    def constraints(self) -> list[tuple[str, str, Any]]:
        """(field, kind, value) of each constraint on the output the request sets (at most one is allowed)."""
        found = [(f, k, getattr(self, f)) for f, k in GUIDED_FIELDS if getattr(self, f) is not None]
        so = self.structured_outputs
        if so is not None:
            for kind in ("json", "regex", "choice", "grammar", "json_object"):
                value = getattr(so, "json_" if kind == "json" else kind)
                if value not in (None, False):
                    found.append((f"structured_outputs.{kind}", kind, value))
        rf = self.response_format
        if rf is not None and rf.type != "text":
            found.append(("response_format", "response_format", rf.model_dump(by_alias=True)))
        return found

    def grammar(self) -> str | None:
        """The llguidance grammar the output must match (None: free text)."""
        from tandem.worker.router import structured  # llguidance only for requests that ask for structure

        found = self.constraints()
        return structured.constraint_grammar(*found[0]) if found else None

    def response_id(self, own: str) -> str:
        """The answer's id: the router's own (`kind-hex`), or, as vLLM, `kind-<request_id>` from the
        client's."""
        return own if self.request_id is None else f"{own.split('-', 1)[0]}-{self.request_id}"

    def truncated(self, prompt_ids: list[int]) -> list[int]:
        """vLLM's truncate_prompt_tokens: only the prompt's last tokens are kept."""
        k = self.truncate_prompt_tokens
        return prompt_ids if k is None or len(prompt_ids) <= k else prompt_ids[-k:]

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Engine parameters; raises InvalidRequest for values the engine refuses."""
        top_k = self.top_k if self.top_k is not None and self.top_k > 0 else 0
        seed = None if self.seed is None else self.seed & UINT64_MAX  # negative seeds as two's complement
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=top_k,
            seed=seed,
            stop=self.stop_strings(),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=self.wants_logprobs(),
            cache_salt=self.cache_salt,
            grammar=self.grammar(),
            min_tokens=self.min_tokens,
            top_logprobs=self.alternatives(),
            min_p=self.min_p or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            return_tokens_as_token_ids=bool(self.return_tokens_as_token_ids),
            prompt_logprobs=self.prompt_alternatives(),
        )

    def prompt_alternatives(self) -> int | None:
        """How many alternatives beside each prompt token's logprob (None: the prompt is not scored)."""
        return self.prompt_logprobs


class CompletionRequest(SamplingRequest, VllmCompletionExtensions):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        openai_fields.check_completion(self)

    def prompt_alternatives(self) -> int | None:
        """vLLM: echo with logprobs scores the prompt too, with as many alternatives."""
        if self.prompt_logprobs is None and self.echo and self.logprobs is not None:
            return self.logprobs
        return self.prompt_logprobs

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def alternatives(self) -> int:
        return self.logprobs or 0

    def single_prompt(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list):
            return self.prompt[0]  # type: ignore[return-value]
        return self.prompt  # type: ignore[return-value]


class ContentPart(BaseModel):
    model_config = STRICT
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class FunctionCall(BaseModel):
    model_config = STRICT
    name: str
    arguments: str


class MessageToolCall(BaseModel):
    model_config = STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT
    role: str  # the chat template decides which roles it knows
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer names the call it answers
    refusal: str | None = None
    audio: Any = None
    function_call: Any = None

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template sees it (transformers' shape): role, plain-text content, and the
        name, tool calls and tool call id when set."""
        for field_name in ("audio", "function_call"):
            if getattr(self, field_name) is not None:
                raise ApiError(400, f"messages: {field_name} is not supported", param="messages")
        if self.content is None or isinstance(self.content, str):
            content = self.content or ""
        elif any(p.type != "text" or p.text is None for p in self.content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        else:
            content = "".join(p.text or "" for p in self.content)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the grammar enforces the schema either way


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest, VllmChatExtensions):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # at most one call is made: true (may) and false (one) both hold
    metadata: dict[str, str] | None = None  # an operator's tags: no effect on the answer
    safety_identifier: str | None = None  # as `user`
    prompt_cache_key: str | None = None  # prefixes are cached by their tokens whatever the key
    # not implemented: refused unless at their no-op values (openai_fields.REFUSED_UNLESS)
    store: bool | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None

    def check_supported(self) -> None:
        openai_fields.check_chat(self)

    def forces_tool_call(self) -> bool:
        return bool(self.tools) and self.tool_choice not in (None, "auto", "none")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def alternatives(self) -> int:
        return self.top_logprobs or 0

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates and the tool-call grammar take them (OpenAI's JSON shape)."""
        return None if not self.tools else [t.model_dump(exclude_none=True) for t in self.tools]

    def tool_choice_value(self) -> str | dict[str, Any] | None:
        tc = self.tool_choice
        return tc.model_dump() if isinstance(tc, NamedToolChoice) else tc

    def grammar(self) -> str | None:
        from tandem.worker.router import structured  # llguidance only for requests that ask for structure

        if self.forces_tool_call():
            return structured.tool_choice_grammar(self.tool_dicts(), self.tool_choice_value())
        return super().grammar()

    def template_options(self) -> dict[str, Any]:
        """What vLLM's chat extensions hand the chat template."""
        return {
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "documents": self.documents,
            "extra": self.chat_template_kwargs or {},
        }
