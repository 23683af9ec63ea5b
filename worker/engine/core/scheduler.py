"""Continuous batching: which sequences run this step and how many tokens each, under a token budget.

Running sequences go first (decodes and unfinished prompt chunks, oldest first), then waiting prompts are
admitted while blocks, the token budget and the running-sequence cap allow. A prompt longer than the chunk
size is prefilled over several steps. A decoding sequence handed draft tokens runs them with its last token,
as a short chunk, within the same budget. When a running sequence needs a block and none is free, the newest
running sequence is preempted: its blocks are freed and it is recomputed later.

With `max_prefill_tokens_with_decodes` set, a step that carries decodes carries at most that many prompt
tokens beside them (stall-free batching, as Sarathi-Serve does it): a prompt that arrives at a busy decode
or colocated worker is prefilled a slice per step, so it adds a bounded amount to every running sequence's
TPOT instead of stalling the batch for its whole prefill. A step without decodes uses the full budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from tandem.worker.engine.core.block_manager import BlockManager, OutOfBlocks, block_hash
from tandem.worker.engine.core.sequence import SeqStatus, Sequence


@dataclass
class SchedulerConfig:
    max_running_sequences: int = 64
    max_batch_tokens: int = 2048
    prefill_chunk_tokens: int = 512
    max_prefill_tokens_with_decodes: int | None = None  # None: prompt tokens share the whole budget

    def __post_init__(self) -> None:
        if self.max_prefill_tokens_with_decodes is not None and self.max_prefill_tokens_with_decodes < 1:
            raise ValueError(
                "max_prefill_tokens_with_decodes must be at least 1, got "
                f"{self.max_prefill_tokens_with_decodes}"
            )


@dataclass
class SchedulerOutput:
    """The explicit message from scheduler to model runner for one step."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # drafts included
    drafts: list[list[int]] = field(
        default_factory=list
    )  # per sequence: draft tokens to verify (most are [])
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config, self.blocks = config, blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Admit a sequence whose prompt KV is already in its blocks (the decode side of a transfer)."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------------
    def schedule(self, drafts: Mapping[Sequence, list[int]] | None = None) -> SchedulerOutput:
        """This step's batch; a decoding sequence in `drafts` also runs its draft tokens (cut to the
        budget)."""
        out = SchedulerOutput()
        budget = self.config.max_batch_tokens
        prompt_budget = self._prompt_budget()
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget, self.config.prefill_chunk_tokens)
            if seq.in_prefill:
                n = min(n, prompt_budget)
                prompt_budget -= n
            draft = drafts.get(seq, []) if drafts and n == seq.num_uncomputed == 1 else []
            draft = draft[: min(budget, self.config.prefill_chunk_tokens, self._room(seq)) - 1]
            n += len(draft)
            if n == 0 or not self._grow(seq, seq.num_computed + n, out):
                continue
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            out.drafts.append(draft)
            budget -= n
        while self.waiting and budget > 0 and prompt_budget > 0 and not out.preempted:
            if len(self.running) >= self.config.max_running_sequences:
                break
            seq = self.waiting[0]
            try:
                seq.block_table, cached = self.blocks.allocate_prompt(
                    seq.token_ids, cache_salt=seq.params.cache_salt, reuse=seq.params.prompt_logprobs is None
                )  # a prompt scored for its logprobs runs whole
            except OutOfBlocks:
                break
            self.waiting.popleft()
            seq.num_computed = cached
            seq.block_hashes = [
                self.blocks.block_hashes[b] for b in seq.block_table[: cached // self.blocks.block_size]
            ]  # type: ignore[misc]
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed, budget, self.config.prefill_chunk_tokens, prompt_budget)
            prompt_budget -= n
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            out.drafts.append([])
            budget -= n
        return out

    def _prompt_budget(self) -> int:
        """Prompt tokens this step may carry: capped when any running sequence decodes, else the whole
        budget."""
        cap = self.config.max_prefill_tokens_with_decodes
        if cap is not None and any(not s.in_prefill for s in self.running if s.status is SeqStatus.RUNNING):
            return cap
        return self.config.max_batch_tokens

    def _room(self, seq: Sequence) -> int:
        """Tokens `seq` can compute this step in its blocks and the free ones: drafts never preempt anyone."""
        return (len(seq.block_table) + self.blocks.num_free) * self.blocks.block_size - seq.num_computed

    def reserve(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks for the next `num_tokens` of `seq` from the free pool, as a draft's verify would take them
        (never preempting anyone); returns how many of those tokens fit. The draft model writes its KV there
        before the step is scheduled; `release_unused` gives back what the verify did not keep (a sequence
        whose drafts the step's token budget cut keeps the blocks until it grows into them or ends)."""
        n = max(0, min(num_tokens, self._room(seq)))
        need = self.blocks.blocks_needed(seq.num_computed + n) - len(seq.block_table)
        if need > 0:
            seq.block_table += self.blocks.allocate(need)
        return n

    def _grow(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Make room in `seq`'s block table for `num_tokens`, preempting newer sequences if needed."""
        need = self.blocks.blocks_needed(num_tokens) - len(seq.block_table)
        while need > self.blocks.num_free:
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        if need > 0:
            seq.block_table += self.blocks.allocate(need)
        return True

    def release_unused(self, seq: Sequence) -> None:
        """Give back the blocks past the computed tokens (those a rejected draft took), as if never taken."""
        keep = self.blocks.blocks_needed(seq.num_computed)
        if len(seq.block_table) > keep:
            self.blocks.release(seq.block_table[keep:])
            del seq.block_table[keep:]

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    # --- after the model ran -------------------------------------------------------------------
    def advance(self, seq: Sequence, num_new: int) -> None:
        """Account for `num_new` tokens now in the cache and publish newly full blocks for prefix reuse."""
        seq.num_computed += num_new
        self.publish_full_blocks(seq)

    def publish_full_blocks(self, seq: Sequence) -> None:
        if not seq.shared:
            return
        bs = self.blocks.block_size
        tokens = seq.token_ids
        while (len(seq.block_hashes) + 1) * bs <= seq.num_computed:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else self.blocks.root(seq.params.cache_salt)
            block_tokens = tokens[i * bs : (i + 1) * bs]
            h = block_hash(parent, block_tokens)
            seq.block_hashes.append(h)
            self.blocks.register(seq.block_table[i], h, parent, block_tokens)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def _free(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []
