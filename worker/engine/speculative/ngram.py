"""N-gram prompt lookup: drafts copied from where the text's last few tokens occurred before (no extra model).

When the sequence ends with an n-gram that appeared earlier in the prompt or the output, the tokens that
followed that earlier occurrence are a good guess for what comes next (quoting, code edits, summaries,
and any text that repeats itself). The longest n-gram wins, and among its occurrences the most recent.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.worker.engine.core.sequence import Sequence as EngineSequence


def latest_occurrence(tokens: list[int], ngram: list[int], end: int) -> int:
    """The last start before `end` where `ngram` occurs in `tokens` (-1: none); the scan runs in C."""
    first, n, found, i = ngram[0], len(ngram), -1, -1
    while True:
        try:
            i = tokens.index(first, i + 1, end)
        except ValueError:
            return found
        if tokens[i : i + n] == ngram:
            found = i


def ngram_draft(tokens: list[int], k: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix n-gram of `tokens`.

    The copy may run into the suffix itself and on into what it has copied (as an LZ77 match does), so a
    text that repeats with a period shorter than `k` still gets `k` drafts.
    """
    size = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        start = latest_occurrence(tokens, tokens[size - n :], size - n)
        if start >= 0:
            return copy_after(tokens, start + n, k)
    return []


def copy_after(tokens: list[int], start: int, k: int) -> list[int]:
    """`k` tokens copied from `start` on, running on into the copy itself past the end (as LZ77 does)."""
    source = tokens[start : start + k]
    draft: list[int] = []
    for i in range(k):
        draft.append(source[i] if i < len(source) else draft[i - len(source)])
    return draft


class NgramIndex:
    """The latest start of every n-gram of one growing token list that some token already follows, kept
    up to date as tokens are appended, so a lookup costs a few dict reads instead of a scan."""

    def __init__(self, min_n: int, max_n: int):
        self.sizes = range(min_n, max_n + 1)
        self.latest: dict[tuple[int, ...], int] = {}
        self.seen = 0  # tokens indexed

    def draft(self, tokens: list[int], k: int) -> list[int]:
        """The same drafts as `ngram_draft(tokens, k, ...)`; `tokens` must extend what was indexed before."""
        size = len(tokens)
        for j in range(max(self.seen, 1), size):  # token j now follows the n-grams that end just before it
            for n in self.sizes:
                if j >= n:
                    self.latest[tuple(tokens[j - n : j])] = j - n
        self.seen = size
        if k <= 0:
            return []
        for n in reversed(self.sizes):
            if n < size:
                start = self.latest.get(tuple(tokens[size - n :]))
                if start is not None:
                    return copy_after(tokens, start + n, k)
        return []


@dataclass
class NgramProposer:
    """Drafts from each sequence's own tokens (prompt and output so far), one index per live sequence."""

    min_n: int = 1
    max_n: int = 3
    _indexes: weakref.WeakKeyDictionary[EngineSequence, NgramIndex] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )

    def propose(self, seqs: Sequence[EngineSequence], num_tokens: Sequence[int]) -> list[list[int]]:
        out = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            index = self._indexes.get(seq)
            if index is None:
                index = self._indexes[seq] = NgramIndex(self.min_n, self.max_n)
            out.append(index.draft(seq.token_ids, k))
        return out
