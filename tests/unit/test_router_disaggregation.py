"""Conditional disaggregation: short prompts and a saturated prefill pool go local, long prompts to the prefill pool."""

from tandem.worker.router.disaggregation import (
    REASON_LONG_PROMPT,
    REASON_MODE,
    REASON_PREFILL_SATURATED,
    REASON_SHORT_PROMPT,
    DisaggregationMode,
    DisaggregationPolicy,
    PrefillDecision,
    PrefillRoute,
    choose_prefill,
    decode_has_room,
    prefill_saturated,
)
from tandem.worker.router.selection import WorkerView

LOCAL, DISAGG = PrefillRoute.local, PrefillRoute.disaggregated
POLICY = DisaggregationPolicy(
    mode=DisaggregationMode.conditional, local_prefill_max_tokens=64, prefill_queue_tokens=1000
)
ROOMY = WorkerView("d", free_kv_blocks=100, total_kv_blocks=100)
IDLE_PREFILL = [WorkerView("p", queued_prompt_tokens=0)]
BUSY_PREFILL = [
    WorkerView("p1", queued_prompt_tokens=800, inflight_prompt_tokens=300),
    WorkerView("p2", queued_prompt_tokens=5000),
]


def test_prompt_at_or_under_the_threshold_is_prefilled_on_the_decode_worker():
    assert choose_prefill(POLICY, 64, IDLE_PREFILL, ROOMY, 5) == PrefillDecision(LOCAL, REASON_SHORT_PROMPT)
    assert choose_prefill(POLICY, 65, IDLE_PREFILL, ROOMY, 5) == PrefillDecision(DISAGG, REASON_LONG_PROMPT)


def test_only_the_uncached_part_of_the_prompt_counts():
    assert choose_prefill(POLICY, 200, IDLE_PREFILL, ROOMY, 13, cached_tokens=144).route is LOCAL
    assert choose_prefill(POLICY, 200, IDLE_PREFILL, ROOMY, 13, cached_tokens=128).route is DISAGG
    assert (
        choose_prefill(POLICY, 10, IDLE_PREFILL, ROOMY, 1, cached_tokens=999).route is LOCAL
    )  # over-estimate


def test_a_saturated_prefill_pool_sends_long_prompts_local_when_the_decode_worker_has_room():
    assert prefill_saturated(BUSY_PREFILL, 1000)  # the least-loaded one has 1100 queued, counting in-flight
    assert choose_prefill(POLICY, 500, BUSY_PREFILL, ROOMY, 40) == PrefillDecision(
        LOCAL, REASON_PREFILL_SATURATED
    )
    # one prefill worker under the bound is enough to keep disaggregating
    some_room = [*BUSY_PREFILL, WorkerView("p3", queued_prompt_tokens=1000)]
    assert choose_prefill(POLICY, 500, some_room, ROOMY, 40).route is DISAGG


def test_a_saturated_prefill_pool_still_disaggregates_when_the_decode_worker_has_no_room():
    full = WorkerView("d", free_kv_blocks=10, total_kv_blocks=100)
    assert not decode_has_room(full, 40, 1000)
    assert choose_prefill(POLICY, 500, BUSY_PREFILL, full, 40).route is DISAGG
    backed_up = WorkerView(
        "d", free_kv_blocks=100, total_kv_blocks=100, queued_prompt_tokens=900, inflight_prompt_tokens=200
    )
    assert choose_prefill(POLICY, 500, BUSY_PREFILL, backed_up, 40).route is DISAGG


def test_unhealthy_or_draining_prefill_workers_do_not_count_as_room():
    gone = [WorkerView("p", healthy=False), WorkerView("q", draining=True)]
    assert prefill_saturated(gone, 1000) and prefill_saturated([], 1000)
    assert choose_prefill(POLICY, 500, gone, ROOMY, 40).route is LOCAL
    unknown_size = WorkerView("d")  # not yet polled: no totals, room is assumed
    assert decode_has_room(unknown_size, 40, 1000)


def test_modes_always_and_never_ignore_the_rules():
    always = POLICY.model_copy(update={"mode": DisaggregationMode.always})
    never = POLICY.model_copy(update={"mode": DisaggregationMode.never})
    assert choose_prefill(always, 1, BUSY_PREFILL, ROOMY, 1) == PrefillDecision(DISAGG, REASON_MODE)
    assert choose_prefill(never, 10_000, IDLE_PREFILL, ROOMY, 700) == PrefillDecision(LOCAL, REASON_MODE)
    assert DisaggregationPolicy().mode is DisaggregationMode.always  # the default keeps today's behaviour
