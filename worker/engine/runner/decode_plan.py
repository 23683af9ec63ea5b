"""The static-shape decode step's plan: the steps it runs, the padded shapes (buckets), its padded inputs."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def buckets(limit: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two from `smallest` below `limit`, then `limit` itself: the padded sizes a dimension of at
    most `limit` takes. (A compiled step starts at 2: size 1 would specialise into a graph of its own.)"""
    if limit < 1 or smallest < 1:
        raise ValueError(
            f"a bucketed size needs a limit and a smallest size of at least 1, got {limit}, {smallest}"
        )
    out = []
    size = smallest
    while size < limit:
        out.append(size)
        size *= 2
    return (*out, limit)


def bucket_for(n: int, sizes: Sequence[int]) -> int:
    """The smallest bucket that holds `n`."""
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} is larger than the largest bucket {sizes[-1]}")


def first_request_shapes(shapes: Sequence[tuple[int, int]], smallest_batch: int) -> list[tuple[int, int]]:
    """The (batch, width) buckets a request alone in the batch can take, in `shapes`' order, the first of them
    with a batch unlike its width where one has (a compiled graph must not take the two sizes to be equal)."""
    mine = [s for s in shapes if s[0] == smallest_batch]
    first = next((s for s in mine if s[0] != s[1]), mine[0])
    return [first, *(s for s in mine if s != first)]


def blocks_for(context_len: int, block_size: int) -> int:
    return -(-context_len // block_size)


def is_pure_decode(
    num_new_tokens: Sequence[int], drafts: Sequence[Sequence[int]], uncomputed: Sequence[int]
) -> bool:
    """Whether a step is pure decode: every sequence runs exactly one new token, with no drafts, and that
    token is its last (`uncomputed` tokens are 1), so each sequence samples exactly one row. A prompt chunk
    longer than one token, or a drafts-verifying step, is not."""
    return bool(num_new_tokens) and all(
        n == 1 and not d and u == 1 for n, d, u in zip(num_new_tokens, drafts, uncomputed, strict=True)
    )


@dataclass(frozen=True)
class DecodeInputs:
    """One pure-decode step padded to a bucket, on the host: rows past `num_seqs` are padding."""

    num_seqs: int
    input_ids: torch.Tensor  # [B] each row's one new token
    positions: torch.Tensor  # [B]
    slot_mapping: torch.Tensor  # [B]
    context_lens: torch.Tensor  # [B] its new token included
    table: torch.Tensor  # [B, W]

    @property
    def shape(self) -> tuple[int, int]:
        """(padded batch, table width in blocks): the bucket this step runs in."""
        b, w = self.table.shape
        return b, w


def padded_decode_inputs(
    tokens: Sequence[int],
    positions: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    shape: tuple[int, int],
    block_size: int,
    scratch_block: int,
) -> DecodeInputs:
    """A decode batch (each sequence's new token, its position, its blocks) padded to `shape`.

    Padding rows write their KV to slot 0 of `scratch_block`, which no sequence owns, and read only that
    block (context length 1, so their softmax has a key); a real row's table is padded with the scratch
    block too, past its context, where the mask hides it.
    """
    n = len(tokens)
    batch, width = shape
    if n > batch:
        raise ValueError(f"{n} sequences do not fit a padded batch of {batch}")
    pad = batch - n
    table = [list(t[: blocks_for(p + 1, block_size)]) for t, p in zip(block_tables, positions, strict=True)]
    if any(len(row) > width for row in table):
        raise ValueError(f"a context needs more than {width} blocks")
    rows = [row + [scratch_block] * (width - len(row)) for row in table] + [[scratch_block] * width] * pad
    slots = [t[p // block_size] * block_size + p % block_size for t, p in zip(table, positions, strict=True)]
    long = functools.partial(torch.tensor, dtype=torch.long)
    return DecodeInputs(
        n,
        long([*tokens, *[0] * pad]),
        long([*positions, *[0] * pad]),
        long([*slots, *[scratch_block * block_size] * pad]),
        long([p + 1 for p in positions] + [1] * pad),
        long(rows).view(batch, width),
    )
