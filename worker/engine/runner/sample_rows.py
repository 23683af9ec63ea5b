"""Which logits rows each sampling sequence owns in a step, and which of them the batched sampler draws.

Pure index bookkeeping for the engine's update: a step's logits hold, for each sequence that samples, one
row for its next token and one more per draft (step_inputs' order). Every row is drawn by the batched
sampler except a sampled (temperature > 0) sequence's rows when it has drafts: rejection sampling verifies
those, sequence by sequence, so each emitted token keeps the model's distribution.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SampleRows:
    """Where each sampling sequence's rows sit in the step's logits."""

    firsts: tuple[int, ...]  # each sequence's first row
    sizes: tuple[int, ...]  # its rows: one, plus one per draft
    drawn: tuple[int, ...]  # sequences the batched sampler draws, in order
    num_rows: int  # rows in the step's logits

    @property
    def drawn_rows(self) -> list[int]:
        """The drawn sequences' rows, in order (every row when nothing is left to rejection sampling)."""
        return [self.firsts[i] + j for i in self.drawn for j in range(self.sizes[i])]

    def rows_of(self, i: int) -> slice:
        return slice(self.firsts[i], self.firsts[i] + self.sizes[i])


def sample_rows(num_drafts: Sequence[int], greedy: Sequence[bool]) -> SampleRows:
    """The row layout for sequences with `num_drafts[i]` drafts each, greedy or not."""
    sizes = tuple(k + 1 for k in num_drafts)
    firsts = tuple(itertools.accumulate(sizes, initial=0))[:-1]
    drawn = tuple(i for i, (k, g) in enumerate(zip(num_drafts, greedy, strict=True)) if g or not k)
    return SampleRows(firsts, sizes, drawn, sum(sizes))


def per_drawn(layout: SampleRows, values: Sequence[T]) -> dict[int, list[T]]:
    """`values`, one per drawn row, split into each drawn sequence's list (keyed by its place in the step)."""
    out: dict[int, list[T]] = {}
    at = 0
    for i in layout.drawn:
        out[i] = list(values[at : at + layout.sizes[i]])
        at += layout.sizes[i]
    return out
