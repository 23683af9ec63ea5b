"""vLLM's extensions to the OpenAI request bodies (vLLM's ChatCompletionRequest / CompletionRequest extra
parameters), declared so that what clients of a vLLM server send is read, range-checked and then either
honoured, accepted as a no-op or refused naming the field (openai_fields.py; docs/openai-compatibility.md)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from tandem.worker.api.params import MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS, UINT32_MAX

MAX_REQUEST_ID = 256
MAX_CHOICES_LISTED = 256  # guided_choice: the strings the output must be one of
TokenIdValue = Annotated[int, Field(ge=0, le=UINT32_MAX)]


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one constraint on the output (the newer form of the guided_* fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES_LISTED)
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # refused (openai_fields.py)
    disable_fallback: bool = False  # one backend, no fallback: no effect
    disable_any_whitespace: bool = False  # refused when true
    disable_additional_properties: bool = False  # refused when true
    whitespace_pattern: str | None = None  # refused
    backend: str | None = None  # one backend (llguidance) serves every request: no effect


class VllmSamplingExtensions(BaseModel):
    """The extra fields vLLM reads on both endpoints."""

    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=MAX_REPETITION_PENALTY)
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search's alone
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    allowed_token_ids: list[TokenIdValue] | None = None
    bad_words: list[str] | None = None
    add_special_tokens: bool | None = None  # unset: the endpoint's default (completions true, chat false)
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES_LISTED)
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: int = 0
    request_id: str | None = Field(
        None, min_length=1, max_length=MAX_REQUEST_ID, pattern=r"^[A-Za-z0-9._:-]+$"
    )
    logits_processors: Any = None
    return_tokens_as_token_ids: bool | None = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None


class VllmChatExtensions(BaseModel):
    """The extra fields vLLM reads on /v1/chat/completions alone."""

    echo: bool = False  # chat's echo: the answer repeats the last message when the roles match
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: Any = None
    include_reasoning: bool = True
    structural_tag: str | None = None


class VllmCompletionExtensions(BaseModel):
    """The extra fields vLLM reads on /v1/completions alone."""

    prompt_embeds: Any = None
