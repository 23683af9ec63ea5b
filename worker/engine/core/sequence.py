"""One request as the engine sees it: its tokens, how many are already in the KV cache, its blocks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from tandem.worker.api.params import SamplingParams

if TYPE_CHECKING:
    from tandem.worker.engine.core.grammar import TokenConstraint


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(
        default_factory=list
    )  # hashes of the leading full blocks, once computed
    shared: bool = True  # its full blocks join the prefix cache (not KV that arrived unauthenticated)
    num_computed: int = 0  # tokens whose KV is in the cache
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    generator: torch.Generator | None = None
    num_preemptions: int = 0
    constraint: TokenConstraint | None = None  # grammar and min_tokens: advanced by every emitted token
    # params.prompt_logprobs: prompt position p (>= 1) -> (its token's logprob, its rank, the likeliest there)
    prompt_scores: dict[int, tuple[float, int, list[tuple[int, float]]]] = field(default_factory=dict)
    _tokens: list[int] = field(init=False, repr=False)  # prompt + output, grown in place

    def __post_init__(self) -> None:
        if self.params.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        self._tokens = self.prompt_ids + self.output_ids

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output tokens (the sequence's own list: read it, do not change it)."""
        return self._tokens

    def tokens_between(self, start: int, end: int) -> list[int]:
        return self._tokens[start:end]

    def append_output(self, token: int, logprob: float) -> None:
        self.output_ids.append(token)
        self.output_logprobs.append(logprob)
        self._tokens.append(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)
