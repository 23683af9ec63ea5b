"""Conditional disaggregation: short prompts and a saturated prefill pool go local, long prompts to the
prefill pool, no prompt goes local onto a decode worker whose streams are near the TPOT SLO, and a busy decode
worker's overflow runs whole on an idle prefill worker."""

from tandem.worker.router.disaggregation import (
    REASON_DECODE_TPOT,
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
    decode_tpot_has_headroom,
    observe_tpot,
    pick_mixed,
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


SLO_AWARE = POLICY.model_copy(update={"local_prefill_max_tpot_fraction": 0.8})
TPOT_SLO_S = 0.050


def _decode(recent_tpot_s: float, streams: int = 3) -> WorkerView:
    return WorkerView(
        "d", free_kv_blocks=100, total_kv_blocks=100, recent_tpot_s=recent_tpot_s, inflight_requests=streams
    )


def test_a_decode_worker_near_the_tpot_slo_takes_no_local_prefill():
    """Both local rules yield: a short prompt and a saturated pool's long one go to the prefill pool."""
    near = _decode(0.041)  # above 0.8 x 50 ms
    assert choose_prefill(SLO_AWARE, 10, IDLE_PREFILL, near, 1, tpot_slo_s=TPOT_SLO_S) == PrefillDecision(
        DISAGG, REASON_DECODE_TPOT
    )
    assert choose_prefill(SLO_AWARE, 500, BUSY_PREFILL, near, 40, tpot_slo_s=TPOT_SLO_S).route is DISAGG
    within = _decode(0.039)
    assert choose_prefill(SLO_AWARE, 10, IDLE_PREFILL, within, 1, tpot_slo_s=TPOT_SLO_S).route is LOCAL
    assert choose_prefill(SLO_AWARE, 500, BUSY_PREFILL, within, 40, tpot_slo_s=TPOT_SLO_S) == PrefillDecision(
        LOCAL, REASON_PREFILL_SATURATED
    )


def test_the_tpot_check_needs_streams_to_protect_a_fraction_and_an_slo():
    assert decode_tpot_has_headroom(_decode(0.5, streams=0), TPOT_SLO_S, 0.8)  # nobody to stall
    assert decode_tpot_has_headroom(_decode(0.5), TPOT_SLO_S, 0.0)  # the check is off (the default)
    assert decode_tpot_has_headroom(_decode(0.5), 0.0, 0.8)  # no SLO known
    assert not decode_tpot_has_headroom(_decode(0.5), TPOT_SLO_S, 1.0)
    assert choose_prefill(POLICY, 10, IDLE_PREFILL, _decode(0.5), 1, tpot_slo_s=TPOT_SLO_S).route is LOCAL
    never = SLO_AWARE.model_copy(update={"mode": DisaggregationMode.never})
    assert choose_prefill(never, 10, IDLE_PREFILL, _decode(0.5), 1, tpot_slo_s=TPOT_SLO_S).route is LOCAL


def test_recent_tpot_follows_the_gaps_and_forgets_an_old_stall():
    assert observe_tpot(0.0, 0.030) == 0.030  # the first gap is the estimate
    recent = 0.030
    recent = observe_tpot(recent, 0.330)  # one step stalled by a 300 ms prefill
    assert 0.030 < recent < 0.330
    for _ in range(30):
        recent = observe_tpot(recent, 0.030)
    assert abs(recent - 0.030) < 0.001


MIXED = POLICY.model_copy(update={"mixed_decode_ratio": 0.5})


def _prefill(address: str = "p", streams: int = 0, queued: int = 0, free: int = 100) -> WorkerView:
    return WorkerView(
        address,
        queued_prompt_tokens=queued,
        inflight_requests=streams,
        free_kv_blocks=free,
        total_kv_blocks=100,
    )


def test_a_prefill_worker_takes_whole_requests_only_while_the_decode_worker_has_twice_its_streams():
    assert (
        pick_mixed(MIXED, [_prefill()], _decode(0.02, streams=1), 5) is None
    )  # a quiet decode worker keeps it
    assert pick_mixed(MIXED, [_prefill()], _decode(0.02, streams=2), 5).address == "p"
    assert pick_mixed(MIXED, [_prefill(streams=1)], _decode(0.02, streams=3), 5) is None
    assert pick_mixed(MIXED, [_prefill(streams=1)], _decode(0.02, streams=4), 5).address == "p"
    # of two that qualify, the one with fewer streams, then the shorter queue
    two = [_prefill("p1", streams=1), _prefill("p2", queued=100), _prefill("p3")]
    assert pick_mixed(MIXED, two, _decode(0.02, streams=8), 5).address == "p3"


def test_a_prefill_worker_without_room_or_past_its_tpot_takes_no_whole_request():
    busy = _decode(0.02, streams=8)
    assert pick_mixed(MIXED, [_prefill(queued=1001)], busy, 5) is None  # its queue is past prefillQueueTokens
    assert pick_mixed(MIXED, [_prefill(free=4)], busy, 5) is None  # no blocks for the request
    assert pick_mixed(MIXED, [WorkerView("p", draining=True)], busy, 5) is None
    slow = WorkerView("p", inflight_requests=1, recent_tpot_s=0.045)
    aware = MIXED.model_copy(update={"local_prefill_max_tpot_fraction": 0.8})
    assert pick_mixed(aware, [slow], busy, 5, tpot_slo_s=TPOT_SLO_S) is None
    assert pick_mixed(MIXED, [slow], busy, 5, tpot_slo_s=TPOT_SLO_S) is slow  # the TPOT check is off


def test_a_prompt_bound_for_the_decode_worker_goes_mixed_only_to_a_queue_no_longer_than_its_own():
    busy = _decode(0.02, streams=8)
    backed_up = _prefill(queued=400)  # a long prompt ahead: a short prompt would wait behind it
    assert pick_mixed(MIXED, [backed_up], busy, 5, route=LOCAL) is None
    assert pick_mixed(MIXED, [backed_up], busy, 5, route=DISAGG) is backed_up  # its prompt waits there anyway
    assert pick_mixed(MIXED, [_prefill()], busy, 5, route=LOCAL).address == "p"
    queued_decode = WorkerView("d", queued_prompt_tokens=500, inflight_requests=8)
    assert pick_mixed(MIXED, [backed_up], queued_decode, 5, route=LOCAL) is backed_up


def test_a_prompt_bound_for_the_decode_worker_is_placed_as_on_colocated_workers():
    even = MIXED.model_copy(update={"mixed_decode_ratio": 1.0})
    idle = WorkerView("d")
    assert pick_mixed(even, [_prefill()], idle, 5, route=LOCAL) is None  # a tie: the decode worker keeps it
    one = WorkerView("d", inflight_requests=1)
    assert pick_mixed(even, [_prefill()], one, 5, route=LOCAL).address == "p"  # fewer streams
    assert pick_mixed(MIXED, [_prefill()], one, 5, route=LOCAL).address == "p"  # 1 of 2 streams once it lands
    assert pick_mixed(MIXED, [_prefill()], one, 5, route=DISAGG) is None  # a long prompt: below 0.5 x 1 only
    queued = WorkerView("d", queued_prompt_tokens=300, inflight_requests=1)
    assert (
        pick_mixed(even, [_prefill(streams=1, queued=100)], queued, 5, route=LOCAL).address == "p"
    )  # shorter queue
    assert (
        pick_mixed(even, [_prefill(streams=2)], queued, 5, route=LOCAL) is None
    )  # past the ratio, however idle
    assert (
        pick_mixed(
            MIXED,
            [_prefill(streams=1)],
            WorkerView("d", queued_prompt_tokens=300, inflight_requests=2),
            5,
            route=LOCAL,
        )
        is None
    )  # at 0.5 it may hold half the decode worker's streams once this one lands
    # short prompts that never finish alternate, as a colocated router would place them
    decode, prefill = WorkerView("d"), _prefill()
    for _ in range(6):
        chosen = pick_mixed(even, [prefill], decode, 5, route=LOCAL) or decode
        chosen.inflight_requests += 1
    assert (decode.inflight_requests, prefill.inflight_requests) == (3, 3)


def test_only_conditional_mode_with_a_ratio_mixes():
    busy = _decode(0.02, streams=8)
    assert DisaggregationPolicy().mixed_decode_ratio == 0
    assert pick_mixed(POLICY, [_prefill()], busy, 5) is None
    for mode in (DisaggregationMode.always, DisaggregationMode.never):
        assert pick_mixed(MIXED.model_copy(update={"mode": mode}), [_prefill()], busy, 5) is None
