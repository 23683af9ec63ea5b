"""Which worker gets the next request: pure functions over what the router knows of each worker."""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass


@dataclass
class WorkerView:
    """The router's picture of one worker (from its last load report plus the router's own in-flight
    count)."""

    address: str
    healthy: bool = True
    draining: bool = False
    queued_prompt_tokens: int = 0
    running_sequences: int = 0
    free_kv_blocks: int = 0
    total_kv_blocks: int = 0
    inflight_requests: int = 0
    inflight_prompt_tokens: int = 0
    recent_tpot_s: float = 0.0  # smoothed gap between tokens of the router's streams on this worker
    last_picked: float = 0.0  # when the router last chose it: equally loaded workers take turns
    warming: bool = False  # joined, its KV channels to the other pool not yet tried (pairing.py)

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining and not self.warming


def pick_prefill(workers: Iterable[WorkerView], exclude: Set[str] = frozenset()) -> WorkerView | None:
    """The prefill (or colocated) worker with the fewest prompt tokens ahead of this one, then the fewest of
    the router's streams on it (a prompt prefilled there stalls each of them for its whole prefill); ties go
    to the one picked longest ago."""
    candidates = [w for w in workers if w.routable and w.address not in exclude]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda w: (
            w.queued_prompt_tokens + w.inflight_prompt_tokens,
            w.inflight_requests,
            w.last_picked,
            w.address,
        ),
    )


def pick_decode(
    workers: Iterable[WorkerView], blocks_needed: int, exclude: Set[str] = frozenset()
) -> WorkerView | None:
    """The decode worker with room for the prompt's blocks and the fewest running sequences; ties go to
    the one with more free blocks, then to the one picked longest ago."""
    candidates = [w for w in workers if w.routable and w.address not in exclude]
    roomy = [w for w in candidates if w.free_kv_blocks >= blocks_needed or w.total_kv_blocks == 0]
    pool = roomy or candidates
    if not pool:
        return None
    return min(
        pool,
        key=lambda w: (
            w.running_sequences + w.inflight_requests,
            -w.free_kv_blocks,
            w.last_picked,
            w.address,
        ),
    )
