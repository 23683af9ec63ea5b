"""N-gram prompt lookup: drafts copied from where the text's last few tokens occurred before (no extra model).

When the sequence ends with an n-gram that appeared earlier in the prompt or the output, the tokens that
followed that earlier occurrence are a good guess for what comes next (quoting, code edits, summaries,
and any text that repeats itself). The longest n-gram wins, and among its occurrences the most recent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.worker.engine.sequence import Sequence as EngineSequence


def ngram_draft(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix n-gram of `tokens`.

    The copy may run into the suffix itself and on into what it has copied (as an LZ77 match does), so a
    text that repeats with a period shorter than `k` still gets `k` drafts.
    """
    size = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = list(tokens[size - n :])
        first = suffix[0]
        for start in range(size - n - 1, -1, -1):  # latest occurrence first, never the suffix itself
            if tokens[start] == first and list(tokens[start : start + n]) == suffix:
                source = list(tokens[start + n :])
                draft: list[int] = []
                for i in range(k):
                    draft.append(source[i] if i < len(source) else draft[i - len(source)])
                return draft
    return []


@dataclass(frozen=True)
class NgramProposer:
    """Drafts from each sequence's own tokens (prompt and output so far)."""

    min_n: int = 1
    max_n: int = 3

    def propose(self, seqs: Sequence[EngineSequence], num_tokens: Sequence[int]) -> list[list[int]]:
        return [ngram_draft(s.token_ids, k, self.min_n, self.max_n) for s, k in zip(seqs, num_tokens, strict=True)]
