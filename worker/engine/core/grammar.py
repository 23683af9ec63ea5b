"""Constrained decoding: which tokens a sequence may sample next (its grammar, its min_tokens), as a mask on
its logits.

A request's grammar (llguidance's serialized form, made by the router from `response_format` or
`tool_choice`) becomes one llguidance matcher per sequence, advanced by every token the sequence emits,
whichever worker sampled it: a decode worker replays the prefill worker's first token into its own matcher
before it samples the second, so the constraint holds across the KV handoff. `min_tokens` is a mask too:
the first `min_tokens` tokens are never an EOS or stop token id. Constrained sequences decode without
speculative drafts (`TokenConstraint.active`), so each step samples one masked row per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import llguidance
import llguidance.numpy as llnp  # not llguidance.torch: it imports torch._dynamo (seconds of a start)
import numpy as np
import torch

from tandem.worker.api.params import InvalidRequest, SamplingParams

GRAMMAR_TOKENIZER_FILE = "tokenizer.json"


class GrammarVocab:
    """The model's vocabulary as llguidance sees it (built once per engine, on first use)."""

    def __init__(self, tokenizer_file: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.tokenizer_file, self.vocab_size, self.eos_token_ids = (
            str(tokenizer_file),
            vocab_size,
            eos_token_ids,
        )
        self._tokenizer: llguidance.LLTokenizer | None = None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            eos = list(self.eos_token_ids) or None
            self._tokenizer = llguidance.LLTokenizer(
                self.tokenizer_file, n_vocab=self.vocab_size, eos_token=eos
            )
        return self._tokenizer

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for `grammar`; raises InvalidRequest when llguidance refuses the grammar."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"grammar refused: {matcher.get_error()}")
        return matcher


@dataclass
class TokenConstraint:
    """One sequence's constraint: its grammar's matcher (if any) and the tokens banned until `min_tokens`."""

    matcher: llguidance.LLMatcher | None
    min_tokens: int
    banned_early: tuple[int, ...]  # EOS and stop token ids
    emitted: int = 0

    @property
    def active(self) -> bool:
        """The next token is constrained (and so the sequence samples it without drafts)."""
        return self.matcher is not None or self.emitted < self.min_tokens

    def accept(self, token: int) -> None:
        """The sequence emitted `token` (a rejected one leaves the matcher in its error state: EOS only)."""
        self.emitted += 1
        if self.matcher is not None and not self.matcher.is_stopped():
            self.matcher.consume_token(token)


def constraint_for(
    params: SamplingParams, vocab: GrammarVocab | None, eos_token_ids: tuple[int, ...]
) -> TokenConstraint | None:
    """The constraint a request's parameters ask for, or None when they ask for none."""
    if not params.grammar and params.min_tokens == 0:
        return None
    matcher = None
    if params.grammar:
        if vocab is None:
            raise InvalidRequest("this worker cannot constrain output to a grammar (no tokenizer.json)")
        matcher = vocab.matcher(params.grammar)
    banned = tuple(dict.fromkeys((*eos_token_ids, *params.stop_token_ids)))
    return TokenConstraint(matcher, params.min_tokens, banned)


def allowed_tokens(
    constraints: list[TokenConstraint],
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    device: torch.device | None = None,
) -> torch.Tensor:
    """[M, V] bool on `device` (the host by default): True where each constraint lets the token through. The
    matchers fill a packed bitmask on the host; it crosses in one copy and is unpacked where the logits
    are."""
    masks = np.full(llnp.get_bitmask_shape(len(constraints), vocab_size), -1, dtype=np.int32)  # all allowed
    words = torch.from_numpy(masks)  # the same host memory: the matchers write their masks into it
    for i, c in enumerate(constraints):
        if c.matcher is None:
            continue
        if c.matcher.is_error() or c.matcher.is_stopped():
            words[i] = 0  # a finished grammar (or one that broke) only lets the sequence end
            for t in eos_token_ids:
                words[i, t // 32] |= _bit(t % 32)
        else:
            llnp.fill_next_token_bitmask(c.matcher, masks, i)
    early = [(i, t) for i, c in enumerate(constraints) if c.emitted < c.min_tokens for t in c.banned_early]
    if device is not None and torch.device(device).type == "cuda":
        words = words.pin_memory()  # so the copy below overlaps the host
    words = words.to(device or "cpu", non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    allowed = ((words[:, :, None] >> shifts) & 1).bool().reshape(len(constraints), -1)[:, :vocab_size]
    if early:  # min_tokens: EOS and stop ids banned until then, every row's at once
        rows, ids = torch.tensor(early, dtype=torch.long).to(words.device, non_blocking=True).unbind(1)
        allowed.index_put_((rows, ids), torch.zeros((), dtype=torch.bool, device=words.device))
    return allowed


def _bit(i: int) -> int:
    """Bit `i` of an int32 mask word, as the signed value torch stores (bit 31 is the sign)."""
    return -(2**31) if i == 31 else 1 << i


def constrain_logits(
    logits: torch.Tensor, constraints: list[TokenConstraint | None], eos_token_ids: tuple[int, ...]
) -> torch.Tensor:
    """`logits` [N, V] with the tokens each row's constraint forbids at -inf (rows without one unchanged)."""
    rows = [i for i, c in enumerate(constraints) if c is not None and c.active]
    if not rows:
        return logits
    chosen = [constraints[i] for i in rows]
    allowed = allowed_tokens(chosen, logits.shape[-1], eos_token_ids, logits.device)  # type: ignore[arg-type]
    index = torch.tensor(rows).to(logits.device, non_blocking=True)
    masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, index, masked)


def top_logprobs(logits: torch.Tensor, counts: list[int]) -> list[list[tuple[int, float]]]:
    """Each row's `counts[i]` most likely tokens and their log-probabilities (empty where 0)."""
    out: list[list[tuple[int, float]]] = [[] for _ in counts]
    rows = [i for i, k in enumerate(counts) if k > 0]
    if not rows:
        return out
    k = max(counts[i] for i in rows)
    index = torch.tensor(rows).to(logits.device, non_blocking=True)
    values, ids = torch.log_softmax(logits.index_select(0, index), dim=-1).topk(k, dim=-1)
    # one read of the device: ids and values side by side in float64 (token ids are exact in it)
    both = torch.stack((ids.double(), values.double())).tolist()
    for row, toks, vals in zip(rows, both[0], both[1], strict=True):
        pairs = zip(toks[: counts[row]], vals[: counts[row]], strict=True)
        out[row] = [(int(t), v) for t, v in pairs if math.isfinite(v)]  # a forbidden token is no alternative
    return out
