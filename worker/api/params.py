"""A request's sampling parameters and their validation: torch-free, shared by the router and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

UINT32_MAX = 2**32 - 1  # the wire's bound on token ids, top_k and max_tokens (tandem.v1.SamplingParams)
UINT64_MAX = 2**64 - 1  # the wire's bound on seeds
MAX_CACHE_SALT = 1024
MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI's API bounds them
MAX_REPETITION_PENALTY = 10.0  # far past any useful value (vLLM only asks > 0); bounds what a float may do


# A prompt's logprobs, per position but the first: (its token's logprob, that token's rank, the likeliest)
PromptLogprobs = list[tuple[float, int, list[tuple[int, float]]]]


class InvalidRequest(ValueError):
    """A request the engine refuses, with a message fit for a 400 response."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    # Prefix-cache isolation (an OpenAI API extension, as in vLLM): requests share cached KV blocks only
    # when their salts are equal; None shares with every other unsalted request.
    cache_salt: str | None = None
    # Constrained decoding (worker/engine/core/grammar.py): an llguidance grammar the output must match, and
    # how many tokens come before an EOS or stop token id may end the output.
    grammar: str | None = None
    min_tokens: int = 0
    top_logprobs: int = 0  # the most likely alternatives reported beside each token (needs logprobs)
    # vLLM's sampling knobs (their semantics): min_p drops tokens below min_p x the likeliest one's
    # probability; repetition_penalty divides (or, when negative, multiplies) the logits of every token the
    # prompt or output holds; presence and frequency penalties subtract from the logits of output tokens.
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # The prompt's own logprobs, each position's with this many alternatives (None: not computed). A prompt
    # that asks runs whole, past the prefix cache, on the worker that answers (no KV transfer).
    prompt_logprobs: int | None = None
    # The router's alone (the text it sends, never on the wire), as `stop`
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False  # logprobs name each token "token_id:<id>"

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= UINT32_MAX:
            raise InvalidRequest(
                f"max_tokens must be an integer in [1, {UINT32_MAX}], got {self.max_tokens!r}"
            )
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.top_k <= UINT32_MAX:
            raise InvalidRequest(f"top_k must be in [0, {UINT32_MAX}] (0 disables it), got {self.top_k!r}")
        if self.seed is not None and not 0 <= self.seed <= UINT64_MAX:
            raise InvalidRequest(f"seed must be in [0, {UINT64_MAX}], got {self.seed!r}")
        if any(not 0 <= t <= UINT32_MAX for t in self.stop_token_ids):
            raise InvalidRequest(f"stop_token_ids must be in [0, {UINT32_MAX}]")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty")
        if self.cache_salt is not None and not 0 < len(self.cache_salt) <= MAX_CACHE_SALT:
            raise InvalidRequest(
                f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT} characters"
            )
        if not 0 <= self.min_tokens <= UINT32_MAX:
            raise InvalidRequest(f"min_tokens must be in [0, {UINT32_MAX}], got {self.min_tokens!r}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs!r}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise InvalidRequest(
                f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}], got "
                f"{self.repetition_penalty!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if self.grammar is not None and self.ignore_eos:
            raise InvalidRequest("a grammar ends the output with EOS: ignore_eos cannot be set with it")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Some penalty changes the logits by the tokens seen so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
