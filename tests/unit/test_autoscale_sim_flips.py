"""Role flips in the simulator: the flipped worker leaves its role at once, drains, serves the new role after
the flip time, is billed throughout; and tandem's policy with flips borrows and returns on a burst."""

import pytest

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool, Replicas
from tandem.operator.autoscale.sim.flipping import simulate_with_flips
from tandem.operator.autoscale.sim.replay import Scenario, run
from tandem.operator.autoscale.sim.simulator import Control, SimConfig, Snapshot
from tandem.slo import Slo
from tandem.trace import TraceRequest
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token; decode step 10 ms + 0.5 ms per running sequence
CONFIG = SimConfig(
    PROFILE,
    interval_s=1.0,
    window_s=10.0,
    scrape_s=1.0,
    cold_start_s=30.0,
    flip_s=2.0,
    initial={Pool.prefill: 1, Pool.decode: 2},
)
# Two long generations (one per decode worker, about 10.5 s each), then 3 prompts of 400 ms a second for
# 20 s: 1.2 s of work a second, more than one prefill worker serves (the router places a prompt on arrival).
LONG = [TraceRequest(0.0, 100, 1000), TraceRequest(0.01, 100, 1000)]
BURST = [TraceRequest(5.0 + i / 3, 4000, 2) for i in range(60)]


def flip_once(at_s: float, seen: list[tuple[float, Replicas, Replicas]]):
    def control(snap: Snapshot) -> Control:
        seen.append(
            (snap.at_s, snap.observations[Pool.prefill].replicas, snap.observations[Pool.decode].replicas)
        )
        flips = ((Pool.decode, Pool.prefill, 1),) if snap.at_s == at_s else ()
        return Control({}, flips)

    return control


def first_tokens(result) -> list[float]:
    return sorted(r.first_token_s for r in result.requests[len(LONG) :])


def test_a_flipped_decode_worker_drains_then_serves_prefill_after_the_flip_time():
    seen: list[tuple[float, Replicas, Replicas]] = []
    flipped = simulate_with_flips(LONG + BURST, CONFIG, flip_once(1.0, seen))
    plain = simulate_with_flips(LONG + BURST, CONFIG, lambda snap: {})
    assert flipped.flips == [(1.0, Pool.decode, Pool.prefill, 1)]
    # its running generation finishes where it started (about 10.5 s; the burst's 1-token decodes join the
    # batch), none fails
    assert [r.finish_s for r in flipped.requests[:2]] == pytest.approx(
        [r.finish_s for r in plain.requests[:2]], abs=0.05
    )
    assert not any(r.failed for r in flipped.requests)
    drained_s = max(r.finish_s for r in flipped.requests[:2])
    # while it drains it counts as prefill capacity on its way, and no longer as decode
    during = [(p, d) for t, p, d in seen if 1.0 < t < drained_s]
    assert during and all(p == Replicas(1, 1, 0) and d == Replicas(1, 0, 0) for p, d in during)
    after = [(p, d) for t, p, d in seen if t > drained_s + CONFIG.flip_s]
    assert after[0] == (Replicas(2, 0, 0), Replicas(1, 0, 0))
    # the burst is served by one prefill worker until drain + flip time, then by two
    ready_s = drained_s + CONFIG.flip_s
    f, p = first_tokens(flipped), first_tokens(plain)
    assert [t for t in f if t < ready_s] == [t for t in p if t < ready_s]
    service_s = PROFILE.prefill_ms(4000) / 1000
    assert p[-1] == pytest.approx(5.0 + 60 * service_s, abs=0.5)  # one worker, always busy from 5 s
    assert f[-1] < p[-1] - 2.0, (f[-1], p[-1])
    # billed as the same three workers the whole time
    assert flipped.gpu_seconds == pytest.approx(3 * flipped.duration_s)


def test_a_flipped_prefill_worker_hands_its_queued_prompts_to_the_rest_of_its_pool():
    config = SimConfig(
        PROFILE,
        interval_s=1.0,
        window_s=10.0,
        scrape_s=1.0,
        cold_start_s=30.0,
        flip_s=2.0,
        initial={Pool.prefill: 2, Pool.decode: 1},
    )
    burst = [TraceRequest(0.5 + i * 0.001, 4000, 2) for i in range(20)]

    def control(snap: Snapshot) -> Control:
        return Control({}, ((Pool.prefill, Pool.decode, 1),) if snap.at_s == 1.0 else ())

    result = simulate_with_flips(burst, config, control)
    assert not any(r.failed for r in result.requests)
    assert all(r.finish_s is not None for r in result.requests)
    # 20 prompts of 400 ms: 2 workers for 0.5 s, then one: about 8 s minus what the second did before the flip
    last = max(r.first_token_s for r in result.requests)
    assert 7.0 < last < 8.1


def test_tandem_with_flips_borrows_on_a_breach_returns_and_counts_flips_per_hour():
    """Long generations for 3 minutes grow decode while prefill has slack: decode borrows a prefill worker,
    and the loan comes back once its own new pod is Ready. At 200 s a prefill burst: the scrape's arrival
    slices show it within one scrape, and prefill scales for the burst's rate instead of borrowing."""
    import random

    rng = random.Random(3)
    trace, t = [], 0.0
    while t < 600:
        t += rng.expovariate(4.0)
        burst = 200 <= t < 260
        trace.append(TraceRequest(t, 3000 if burst else 500, 400 if t < 180 else 20))
        if burst:
            trace += [TraceRequest(t + rng.random() * 0.2, 3000, 20) for _ in range(3)]
    trace.sort(key=lambda r: r.arrival_s)
    limits = {Pool.prefill: PoolLimits(1, 8), Pool.decode: PoolLimits(1, 8)}
    sc = Scenario(PROFILE, Slo(ttft_ms=500, tpot_ms=30, percentile=90), limits, cold_start_s=60.0)
    on, s_on = run("tandem-flips", trace, sc)
    off, s_off = run("tandem", trace, sc)
    assert s_off["flips"] == 0
    kinds = [(t, src, dst) for t, src, dst, _ in on.flips]
    out_decode = [t for t, src, dst in kinds if (src, dst) == (Pool.prefill, Pool.decode)]
    out_prefill = [t for t, src, dst in kinds if (src, dst) == (Pool.decode, Pool.prefill)]
    assert len(out_decode) == len(out_prefill) == 1
    assert (
        out_decode[0] < out_prefill[0] < 180
    )  # decode borrows while generations are long; back before the burst
    assert (
        max(p for at, p, _ in on.timeline if 200 <= at <= 260) == 8
    )  # prefill scales to its bound for the burst
    assert s_on["flips"] == len(kinds) == 2
    assert s_on["flips_per_hour"] == pytest.approx(2 / s_on["simulated_hours"], rel=0.01)
    assert s_on["failed"] == 0
    assert s_on["slo_attainment"] > s_off["slo_attainment"] + 0.02
    assert s_on["gpu_hours"] == pytest.approx(s_off["gpu_hours"], rel=0.02)
