"""What every proposer offers the engine: drafts for a batch of decoding sequences, and how to choose one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tandem.worker.engine.core.sequence import Sequence as EngineSequence

METHODS = ("ngram", "draft")


class Proposer(Protocol):
    def propose(self, seqs: Sequence[EngineSequence], num_tokens: Sequence[int]) -> list[list[int]]:
        """At most `num_tokens[i]` draft tokens to follow each sequence's tokens (fewer, or none, is fine)."""
        ...


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding in an engine: `num_tokens` drafts per sequence per step from `method`."""

    method: str = "ngram"
    num_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 3
    draft_layers: int | None = None  # draft: the target's first this many layers (early exit), then its head

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.num_tokens < 1:
            raise ValueError(f"speculative num_tokens must be at least 1, got {self.num_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("speculative n-gram sizes need 1 <= ngram_min <= ngram_max")
        if (self.method == "draft") != (self.draft_layers is not None):
            raise ValueError("speculative draft_layers is needed by the draft method and only by it")
        if self.draft_layers is not None and self.draft_layers < 1:
            raise ValueError(f"speculative draft_layers must be at least 1, got {self.draft_layers}")

    def check_model(self, num_layers: int) -> None:
        """Refuse a draft that is not a strict prefix of a model with `num_layers` layers."""
        if self.draft_layers is not None and not self.draft_layers < num_layers:
            raise ValueError(
                f"speculative draftModel.layers is {self.draft_layers}, but the model has {num_layers} "
                f"layers: the draft runs the first N of them, so N must be between 1 and {num_layers - 1}"
            )


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of a method that needs no model (the draft method's runs the target: see
    draft_model.py)."""
    if config.method == "ngram":
        from tandem.worker.engine.speculative.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max)
    raise ValueError(f"speculative method {config.method!r} has no proposer")
