"""Self-speculative drafts (LayerSkip-style early exit): the target's first layers, then its final norm and LM
head.

Why the target's own layers and not a separate draft checkpoint: in a disaggregated deployment the decode
worker receives the prompt's KV from the prefill worker. A separate draft model would have no KV for the
prompt there (it would need its own prefill on the decode side, and its own cache), while the KV of the
target's first N layers is already in the transferred cache. A draft step writes its KV for layers
0..N-1 into the slots that the verify pass then overwrites with the same values, so drafting takes no KV
memory of its own: the slots are the verify's, taken just before drafting instead of at scheduling.

Each draft step runs one token per drafting sequence, batched across them: first the sequence's last
token, then each draft so far. The drafts are argmax picks, so they are deterministic and the engine's
verification (comparison when greedy, rejection sampling under temperature) holds as for any proposer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tandem.worker.engine.runner.step_inputs import HostStaging, one_token_inputs

if TYPE_CHECKING:
    from tandem.worker.engine.core.sequence import Sequence as EngineSequence
    from tandem.worker.engine.models.protocol import CausalLM, PagedKv
    from tandem.worker.engine.runner.engine import Engine

# (token ids [B], their sequences, their positions) -> the draft's next token of each, [B] on the device
DraftStep = Callable[[torch.Tensor, list["EngineSequence"], list[int]], torch.Tensor]
# (sequence, tokens) -> how many of its next tokens now have KV slots
Reserve = Callable[["EngineSequence", int], int]


def drafts_that_fit(wanted: int, reserved: int) -> int:
    """Drafts to run when `reserved` slots were found for the last token and `wanted` drafts: the verify
    needs one slot more than there are drafts."""
    return max(0, min(wanted, reserved - 1))


def still_drafting(num_drafts: Sequence[int], rows: Sequence[int], step: int) -> list[int]:
    """Which of `rows` (indices into `num_drafts`) still draft at draft step `step`, as places in `rows`."""
    return [at for at, i in enumerate(rows) if num_drafts[i] > step]


@dataclass
class DraftModelProposer:
    """Drafts `num_tokens[i]` tokens for each sequence by running `step` autoregressively, batched."""

    step: DraftStep
    reserve: Reserve

    def propose(self, seqs: Sequence[EngineSequence], num_tokens: Sequence[int]) -> list[list[int]]:
        ks = [drafts_that_fit(k, self.reserve(s, k + 1)) for s, k in zip(seqs, num_tokens, strict=True)]
        rows = [i for i, k in enumerate(ks) if k > 0]
        if not rows:
            return [[] for _ in seqs]
        ids = torch.tensor([seqs[i].token_ids[-1] for i in rows], dtype=torch.long)
        picked: list[tuple[list[int], torch.Tensor]] = []  # per draft step: its rows and their drafts
        for j in range(max(ks)):
            if j:
                keep = still_drafting(ks, rows, j)
                if len(keep) < len(rows):
                    rows = [rows[at] for at in keep]
                    ids = ids.index_select(0, torch.tensor(keep, device=ids.device))
            ids = self.step(ids, [seqs[i] for i in rows], [seqs[i].num_tokens - 1 + j for i in rows])
            picked.append((rows, ids))
        tokens = torch.cat([t for _, t in picked]).tolist()  # one wait for the device, after every step
        drafts: list[list[int]] = [[] for _ in seqs]
        at = 0
        for step_rows, _ in picked:
            for i in step_rows:
                drafts[i].append(tokens[at])
                at += 1
        return drafts


class EarlyExitStep:
    """One draft step: the target's first `layers` layers over one token per sequence, writing their KV in
    the paged cache, then the final norm and LM head; the argmax of each row."""

    def __init__(
        self, model: CausalLM, kv: PagedKv, layers: int, block_size: int, backend: str, staging: HostStaging
    ):
        if not 1 <= layers < model.config.num_layers:
            raise ValueError(f"a draft of {layers} layers is no strict prefix of {model.config.num_layers}")
        self.model, self.kv, self.layers = model, kv, layers
        self.block_size, self.backend, self.staging = block_size, backend, staging
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, seqs: list[EngineSequence], positions: list[int]) -> torch.Tensor:
        pos, batch = one_token_inputs(seqs, positions, self.block_size, self.backend, self.staging)
        ids = ids.to(self.device, non_blocking=True)
        hidden = self.model(ids, pos, self.kv.k, self.kv.v, batch, num_layers=self.layers)
        return self.model.logits(hidden).argmax(-1)


def early_exit_proposer(engine: Engine, layers: int) -> DraftModelProposer:
    """The draft method's proposer for `engine`: its model's first `layers` layers over its own KV cache."""
    assert engine.config.speculative is not None
    engine.config.speculative.check_model(engine.model.config.num_layers)
    step = EarlyExitStep(
        engine.model, engine.kv, layers, engine.config.block_size, engine.config.attention, engine.staging
    )
    return DraftModelProposer(step, engine.scheduler.reserve)
