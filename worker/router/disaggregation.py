"""Conditional disaggregation (pure): per request, prefill on the prefill pool and move the KV, or on the
decode worker.

A transfer is worth paying for only when the prompt is long enough that prefill interference on the decode
worker would cost more than the hop. Two rules pick `local` (prefill on the decode worker, no transfer):

- llm-d's: the uncached part of the prompt is at most `local_prefill_max_tokens`. The router does not see
  the decode worker's prefix cache per prompt, so callers pass what they know (the router passes 0: the
  whole prompt counts as uncached, a conservative estimate that sends fewer prompts local than a precise one).
- Dynamo's: the prefill pool is saturated (even its least-loaded routable worker has more than
  `prefill_queue_tokens` prompt tokens queued, counting those the router sent and the worker has not yet
  reported) and the chosen decode worker has room (free KV blocks for the request and no more prompt tokens
  of its own queued than that bound).

Both rules yield to the TPOT SLO when `local_prefill_max_tpot_fraction` is set: a local prefill stalls every
sequence the decode worker is running, so a worker whose streams' recent TPOT is above that fraction of
the SLO prefills nothing locally (the prompt goes to the prefill pool). Under a tight TPOT SLO conditional
then behaves like `always`; under a loose one the rules above run as they are.

Otherwise `disaggregated`. Mode `always` and `never` bypass the rules. The policy is the spec's
`router.disaggregation`.

Before any of that, conditional asks where the request decodes. With one prefill and one decode worker
against two colocated ones, the split loses under a loose TPOT SLO: the decode worker saturates while the
prefill worker idles. With `mixed_decode_ratio` set, a prefill worker runs a whole request itself (both
phases, no transfer: Splitwise's mixed pool) while it has fewer than that fraction of the decode worker's
streams, its queue is within `prefill_queue_tokens`, it has the blocks, and (with the TPOT check on) its own
streams' TPOT has headroom. The counts are the router's own streams, so a quiet decode worker keeps every
request and the prefill pool decodes only the overflow. A prompt that would prefill on the decode worker
anyway (a short one) is placed as a colocated router places it: on the worker with the fewest prompt tokens
queued, then the fewest streams, the decode worker on a tie; a prefill worker counts while it would then
have at most the ratio x the decode worker's streams.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from tandem.spec_router import DisaggregationMode
from tandem.spec_router import DisaggregationSpec as DisaggregationPolicy
from tandem.worker.router.selection import WorkerView, pick_prefill

__all__ = [
    "DisaggregationMode",
    "DisaggregationPolicy",
    "PrefillDecision",
    "PrefillRoute",
    "choose_prefill",
    "pick_mixed",
]


class PrefillRoute(StrEnum):
    """Where one request's prompt runs: the value of the `prefill` metric label and the X-Tandem-Prefill
    header."""

    disaggregated = "disaggregated"
    local = "local"
    mixed = "mixed"  # both phases on a prefill worker


# Why a route was chosen (for logs and tests).
REASON_MODE = "mode"
REASON_SHORT_PROMPT = "short-prompt"
REASON_PREFILL_SATURATED = "prefill-saturated"
REASON_LONG_PROMPT = "long-prompt"
REASON_DECODE_TPOT = "decode-tpot"

TPOT_SMOOTHING = 0.2  # weight of the newest inter-token gap in a worker's recent TPOT


@dataclass(frozen=True)
class PrefillDecision:
    route: PrefillRoute
    reason: str


def queued_tokens(view: WorkerView) -> int:
    """Prompt tokens ahead of a new one on a worker: its last report plus what the router sent since."""
    return view.queued_prompt_tokens + view.inflight_prompt_tokens


def prefill_saturated(prefill_workers: Iterable[WorkerView], bound: int) -> bool:
    """Every routable prefill worker has more than `bound` prompt tokens queued (true when none is
    routable)."""
    queues = [queued_tokens(w) for w in prefill_workers if w.routable]
    return not queues or min(queues) > bound


def decode_has_room(decode: WorkerView, blocks_needed: int, queue_bound: int) -> bool:
    """The decode worker can hold the request's blocks (unknown totals count as room) and is not itself
    backed up with prompts."""
    blocks_ok = decode.total_kv_blocks == 0 or decode.free_kv_blocks >= blocks_needed
    return blocks_ok and queued_tokens(decode) <= queue_bound


def observe_tpot(recent_s: float, gap_s: float) -> float:
    """A worker's recent TPOT after one more inter-token gap (exponentially smoothed; 0 is no history)."""
    return gap_s if recent_s <= 0 else recent_s + TPOT_SMOOTHING * (gap_s - recent_s)


def decode_tpot_has_headroom(decode: WorkerView, tpot_slo_s: float, fraction: float) -> bool:
    """A local prefill would not push the decode worker's running streams past the TPOT SLO: no check
    (fraction or SLO 0), no stream of the router's on it, or their recent TPOT within the fraction."""
    if fraction <= 0 or tpot_slo_s <= 0 or decode.inflight_requests == 0:
        return True
    return decode.recent_tpot_s <= fraction * tpot_slo_s


def choose_prefill(
    policy: DisaggregationPolicy,
    prompt_tokens: int,
    prefill_workers: Iterable[WorkerView],
    decode: WorkerView,
    blocks_needed: int,
    cached_tokens: int = 0,
    tpot_slo_s: float = 0.0,
) -> PrefillDecision:
    """Where this request's prompt runs; `cached_tokens` is the caller's estimate of the decode worker's
    prefix-cache hit for it, `tpot_slo_s` the service's TPOT target."""
    if policy.mode is DisaggregationMode.always:
        return PrefillDecision(PrefillRoute.disaggregated, REASON_MODE)
    if policy.mode is DisaggregationMode.never:
        return PrefillDecision(PrefillRoute.local, REASON_MODE)
    if not decode_tpot_has_headroom(decode, tpot_slo_s, policy.local_prefill_max_tpot_fraction):
        return PrefillDecision(PrefillRoute.disaggregated, REASON_DECODE_TPOT)
    if prompt_tokens - min(cached_tokens, prompt_tokens) <= policy.local_prefill_max_tokens:
        return PrefillDecision(PrefillRoute.local, REASON_SHORT_PROMPT)
    bound = policy.prefill_queue_tokens
    if prefill_saturated(prefill_workers, bound) and decode_has_room(decode, blocks_needed, bound):
        return PrefillDecision(PrefillRoute.local, REASON_PREFILL_SATURATED)
    return PrefillDecision(PrefillRoute.disaggregated, REASON_LONG_PROMPT)


def pick_mixed(
    policy: DisaggregationPolicy,
    prefill_workers: Iterable[WorkerView],
    decode: WorkerView,
    blocks_needed: int,
    tpot_slo_s: float = 0.0,
    route: PrefillRoute = PrefillRoute.disaggregated,
) -> WorkerView | None:
    """The prefill worker that runs this whole request itself, or None (the decode worker keeps it). `route`
    is where its prompt would run otherwise (choose_prefill's answer). A prompt bound for the prefill pool
    anyway goes to the one with the fewest of the router's streams among those under `mixed_decode_ratio` x
    the decode worker's, with room in their queue and blocks for the request. A prompt bound for the decode
    worker is placed as on colocated workers: the fewest prompt tokens queued, then the fewest streams, among
    the decode worker (which wins a tie) and the prefill workers that would stay within the ratio."""
    ratio = policy.mixed_decode_ratio
    if policy.mode is not DisaggregationMode.conditional or ratio <= 0:
        return None
    fraction = policy.local_prefill_max_tpot_fraction
    bound = policy.prefill_queue_tokens
    local = route is PrefillRoute.local
    streams_after = decode.inflight_requests + 1 if local else decode.inflight_requests
    candidates = [
        p
        for p in prefill_workers
        if p.routable
        and p.inflight_requests + 1 <= ratio * streams_after
        and queued_tokens(p) <= bound
        and (p.total_kv_blocks == 0 or p.free_kv_blocks >= blocks_needed)
        and decode_tpot_has_headroom(p, tpot_slo_s, fraction)
    ]
    if not local:
        return min(
            candidates,
            key=lambda p: (p.inflight_requests, queued_tokens(p), p.last_picked, p.address),
            default=None,
        )
    best = pick_prefill(candidates)  # as a colocated router would pick among them
    if best is None or (queued_tokens(best), best.inflight_requests) >= (
        queued_tokens(decode),
        decode.inflight_requests,
    ):
        return None
    return best
