"""`spec.router`: the OpenAI-compatible router in front of the pools: where it prefills each prompt, and the
requests it holds while a pool wakes."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tandem.spec_base import Spec
from tandem.spec_pods import OVERLAY, PodTemplateOverlay, RouterResources


class DisaggregationMode(StrEnum):
    """Where a disaggregated service prefills each prompt: always on the prefill pool, never (on its decode
    worker), or conditionally (short prompts, or a saturated prefill pool, on the decode worker)."""

    always = "always"
    conditional = "conditional"
    never = "never"


class DisaggregationSpec(Spec):
    mode: DisaggregationMode = DisaggregationMode.always
    """always: every prompt on the prefill pool, its KV moved to a decode worker; never: every prompt on its
    decode worker; conditional: short prompts, or any prompt while the prefill pool is saturated, on the
    decode worker."""
    local_prefill_max_tokens: int = Field(default=512, ge=0)
    """conditional: prompts of at most this many tokens the decode worker has not cached are prefilled there
    (the router counts the whole prompt as uncached)."""
    prefill_queue_tokens: int = Field(default=4096, ge=0)
    """conditional: once every prefill worker has more prompt tokens than this queued, a decode worker with
    free KV blocks (and no more queued prompt tokens itself) prefills."""
    local_prefill_max_tpot_fraction: float = Field(default=0.0, ge=0, le=1)
    """conditional: a decode worker whose streams' recent TPOT is above this fraction of slo.tpotMs takes no
    local prefill (it would stall every running sequence), so the prompt goes to the prefill pool; 0 turns
    the check off."""
    mixed_decode_ratio: float = Field(default=0.0, ge=0, le=1)
    """conditional: a prefill worker runs whole requests itself (both phases, no KV transfer) while it has
    fewer than this fraction of the chosen decode worker's streams and no more than prefillQueueTokens
    queued, so an idle prefill pool takes decode work off a busy decode pool (Splitwise's mixed pool); 0
    turns it off."""


class WakeQueueSpec(Spec):
    """Requests the router holds while a pool they need has no worker (scaled to zero, or its first worker
    still starting), instead of refusing them: at most `maxRequests` at once, each for at most
    `timeoutSeconds`; past either, 503 with Retry-After. `maxRequests: 0` refuses at once."""

    max_requests: int = Field(default=64, ge=0)
    """Requests held at once; more get 503 with Retry-After (0: refuse at once)."""
    timeout_seconds: int = Field(default=300, gt=0)
    """Longest a request is held before 503 with Retry-After; a request answered after a hold says how long in
    X-Tandem-Cold-Start-Ms."""


class RouterSpec(Spec):
    replicas: int = Field(default=1, ge=1)
    """Router pods (each talks to every worker)."""
    resources: RouterResources = Field(default_factory=RouterResources)
    """What each router pod requests."""
    max_queued_requests: int = Field(default=256, gt=0)
    """Requests a router holds waiting for a worker before it answers 429."""
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    """Where a disaggregated service prefills each prompt. Each request's choice is the prefill label of
    tandem_ttft_seconds and tandem_requests_total, and the X-Tandem-Prefill response header."""
    wake_queue: WakeQueueSpec = Field(default_factory=WakeQueueSpec)
    """Requests the router holds while a pool they need has no worker (scaled to zero, or its first worker
    still starting), instead of refusing them; past either bound, 503 with Retry-After. Held requests are
    the tandem_router_held_requests metric the autoscaler wakes a pool on."""
    pod_template: PodTemplateOverlay | None = Field(default=None, description=OVERLAY)
