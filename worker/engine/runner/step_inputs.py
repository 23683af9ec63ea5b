"""One step's model inputs from the scheduler's output, built with tensor ops and copied to the device once.

Token ids are sliced from each sequence without concatenating its prompt and output; positions and the
slot mapping come from vectorised ops over the step's page tables (no per-token Python loop). On CUDA
the host tensors go through pinned buffers with non-blocking copies; a step ends by reading its
sampled ids back, which synchronises, so the buffers are free again by the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.worker.engine.core.scheduler import SchedulerOutput
from tandem.worker.engine.core.sequence import Sequence
from tandem.worker.engine.layers.attention import AttentionBatch, block_table_tensor


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    batch: AttentionBatch
    sample_rows: (
        torch.Tensor
    )  # [N] flat tokens whose logits are sampled: a sequence's last new token, or with
    # drafts its last token and every draft (in order)
    num_sampled: int


class HostStaging:
    """Pinned host buffers, one per input name, grown as needed, for non-blocking copies to `device`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[str, torch.Tensor] = {}
        self._copied: dict[str, torch.cuda.Event] = {}  # the last copy out of each buffer

    def to_device(self, name: str, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        if not self.pinned:
            return host.to(self.device)
        flat = host.reshape(-1)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < flat.numel() or buf.dtype != flat.dtype:
            buf = self._buffers[name] = torch.empty(max(flat.numel(), 256) * 2, dtype=flat.dtype).pin_memory()
        pending = self._copied.get(name)
        if pending is not None:
            pending.synchronize()  # a step without sampling never synchronised: wait for its copy
        staged = buf[: flat.numel()]
        staged.copy_(flat)
        out = staged.to(self.device, non_blocking=True).view(host.shape)
        event = self._copied[name] = torch.cuda.Event()
        event.record()
        return out


def token_positions(cached: torch.Tensor, query_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index [T], position [T]) of each new token; sequences lie back to back in T."""
    seq = torch.repeat_interleave(torch.arange(len(query_lens)), query_lens)
    first = torch.cumsum(query_lens, 0) - query_lens  # flat index of each sequence's first new token
    return seq, cached[seq] + torch.arange(len(seq)) - first[seq]


def slot_mapping(
    table: torch.Tensor, seq: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Flat cache slot (block * block_size + offset) of each new token, from the [S, W] page table."""
    return table[seq, positions // block_size] * block_size + positions % block_size


def build_step_inputs(
    sched: SchedulerOutput, block_size: int, backend: str, staging: HostStaging
) -> StepInputs:
    ids: list[int] = []
    cached: list[int] = []
    sample_rows: list[int] = []
    for seq, n, draft in zip(sched.seqs, sched.num_new_tokens, sched.drafts, strict=True):
        start, own = seq.num_computed, n - len(draft)
        ids += seq.tokens_between(start, start + own)
        ids += draft
        cached.append(start)
        if start + own == seq.num_tokens:
            sample_rows += range(len(ids) - len(draft) - 1, len(ids))
    query_lens = list(sched.num_new_tokens)
    context_lens = [c + n for c, n in zip(cached, query_lens, strict=True)]
    tables = [s.block_table for s in sched.seqs]
    table = block_table_tensor(tables, context_lens, block_size)
    seq_index, positions = token_positions(torch.tensor(cached), torch.tensor(query_lens))
    slots = slot_mapping(table, seq_index, positions, block_size)
    put = staging.to_device
    batch = AttentionBatch(
        query_lens, context_lens, tables, put("slots", slots), block_size, backend, table=put("table", table)
    )
    return StepInputs(
        put("ids", torch.tensor(ids, dtype=torch.long)),
        put("positions", positions),
        batch,
        put("sample_rows", torch.tensor(sample_rows, dtype=torch.long)),
        len(sample_rows),
    )


def one_token_inputs(
    seqs: list[Sequence], positions: list[int], block_size: int, backend: str, staging: HostStaging
) -> tuple[torch.Tensor, AttentionBatch]:
    """(positions [B], attention batch) for one new token per sequence at `positions` (a draft model's
    step: the token ids are already on the device); each context ends at its token."""
    context_lens = [p + 1 for p in positions]
    tables = [s.block_table for s in seqs]
    table = block_table_tensor(tables, context_lens, block_size)
    pos = torch.tensor(positions, dtype=torch.long)
    slots = slot_mapping(table, torch.arange(len(seqs)), pos, block_size)
    put = staging.to_device
    batch = AttentionBatch(
        [1] * len(seqs),
        context_lens,
        tables,
        put("draft_slots", slots),
        block_size,
        backend,
        table=put("draft_table", table),
    )
    return put("draft_positions", pos), batch
