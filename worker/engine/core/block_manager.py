"""Which KV block belongs to whom: a free pool, reference counts, and prefix caching by block hash.

Pure bookkeeping with no tensors, so the accounting rules (nothing leaks, shared prefixes are counted
once) are tested on their own. Only full blocks are hashed; a freed block keeps its hash until it is
reused, so a later request with the same prefix can pick it up again.

Prompts may be raw token ids from anyone, so a hash alone never decides a hit: block hashes are SHA-256,
chained from a root seeded per model and per `cache_salt` (requests with different salts never share a
block), and a hit is taken only when the cached block's tokens and parent hash equal the prompt's.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BlockHash = bytes


class OutOfBlocks(RuntimeError):
    """The pool cannot hold what was asked for."""


def root_hash(seed: bytes, cache_salt: str | None = None) -> BlockHash:
    """The parent of a prompt's first block: the model's seed and the request's salt (None = no salt)."""
    salt = b"\x00" if cache_salt is None else b"\x01" + cache_salt.encode()
    return hashlib.sha256(b"tandem-prefix-v1\x00" + len(seed).to_bytes(4, "little") + seed + salt).digest()


def block_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """SHA-256 of a full block, chained to the hash of the block before it."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def prefix_hashes(token_ids: Sequence[int], block_size: int, root: BlockHash) -> list[BlockHash]:
    """Chained hashes of every full block of `token_ids`."""
    hashes: list[BlockHash] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, seed: bytes = b""
    ):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed  # per model: blocks of another model's cache could never match
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        # what a cached block holds, checked on every hit: (parent hash, its tokens)
        self.block_contents: list[tuple[BlockHash, tuple[int, ...]] | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}  # hash -> block id
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        # prompt tokens of every allocated prompt, and those of them found in the prefix cache (metrics)
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0

    # --- queries -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def root(self, cache_salt: str | None = None) -> BlockHash:
        return root_hash(self.seed, cache_salt)

    def cached_prefix(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """Block ids already holding the longest cached run of full blocks of `token_ids` (same salt).

        At least one token is always left to compute, so the caller still gets logits.
        """
        if not self.enable_prefix_caching:
            return []
        blocks: list[int] = []
        parent = self.root(cache_salt)
        bs = self.block_size
        for i, h in enumerate(prefix_hashes(token_ids[: max(0, len(token_ids) - 1)], bs, parent)):
            block = self.cached.get(h)
            if block is None or self.block_hashes[block] != h:
                break
            if self.block_contents[block] != (parent, tuple(token_ids[i * bs : (i + 1) * bs])):
                break  # a hash collision: the block holds other tokens (or another chain)
            blocks.append(block)
            parent = h
        return blocks

    # --- changes -------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise OutOfBlocks(f"need {n} KV blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            old = self.block_hashes[block]
            if old is not None and self.cached.get(old) == block:
                del self.cached[old]
            self.block_hashes[block] = None
            self.block_contents[block] = None
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def share(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (which may currently sit in the free pool)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free[block]
            self.ref_counts[block] += 1

    def allocate_prompt(
        self,
        token_ids: Sequence[int],
        extra_tokens: int = 0,
        cache_salt: str | None = None,
        reuse: bool = True,
    ) -> tuple[list[int], int]:
        """Blocks for a prompt (+ room for `extra_tokens`), reusing cached prefix blocks of the same salt
        (unless not `reuse`: a prompt whose every position must run).

        Returns (block table, number of tokens already in the cache).
        """
        cached = self.cached_prefix(token_ids, cache_salt) if reuse else []
        need = self.blocks_needed(len(token_ids) + extra_tokens) - len(cached)
        if need > self.num_free - sum(1 for b in cached if self.ref_counts[b] == 0):
            raise OutOfBlocks(f"need {need} KV blocks, {self.num_free} free")
        self.share(cached)
        table = cached + self.allocate(need)
        self.prefix_queried_tokens += len(token_ids)
        self.prefix_hit_tokens += len(cached) * self.block_size
        return table, len(cached) * self.block_size

    def register(self, block: int, h: BlockHash, parent: BlockHash, tokens: Sequence[int]) -> None:
        """Publish that `block` now holds `tokens`, the full block with hash `h` after `parent`."""
        if self.enable_prefix_caching and self.block_hashes[block] is None and h not in self.cached:
            self.block_hashes[block] = h
            self.block_contents[block] = (parent, tuple(tokens))
            self.cached[h] = block

    def release(self, blocks: Sequence[int]) -> None:
        for block in reversed(blocks):  # tail first, so the prefix stays cached longest
            self.ref_counts[block] -= 1
            if self.ref_counts[block] < 0:
                raise AssertionError(f"block {block} released twice")
            if self.ref_counts[block] == 0:
                self.free[block] = None
