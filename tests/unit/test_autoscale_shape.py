"""The shape rule as a table: collapse at the trough, split under a tight TPOT, colocated under a loose one,
and hysteresis, dwell and the cost of a change keeping the shape; the colocated capacity model checked by
hand."""

import math
from dataclasses import dataclass, field, replace

import pytest

from tandem.operator.autoscale.core.capacity import DecodeLoad, PrefillLoad, prefill_ttft_ms
from tandem.operator.autoscale.core.colocated import (
    colocated_need,
    colocated_step_ms,
    colocated_tpot_ms,
    colocated_ttft_ms,
    prefill_share,
)
from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.shape import (
    MAX_COLOCATED_FACTOR,
    Learned,
    Shape,
    ShapeAction,
    ShapeConfig,
    ShapeLoad,
    decide_shape,
    learn_colocated,
    peak_load,
)
from tandem.operator.autoscale.core.sizing import size_pool
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tests.unit.autoscale_fixtures import linear_profile

H200 = shipped_profile("h200-llama-3.1-8b-fp8")  # NVIDIA's measured H200 profile: idle step about 4.6 ms
LONG = ShapeLoad(
    rate_rps=10, prompt_tokens_mean=4000, output_tokens_mean=200, prompt_tokens_p90=6000, tpot_ms=9.0
)
IDLE_STEP_MS = H200.decode_step_ms(1, LONG.prompt_tokens_mean + LONG.output_tokens_mean / 2)


def tpot_x_idle(factor: float) -> Slo:
    """TTFT 2 s and a TPOT of `factor` times the idle decode step at the long prompts' context."""
    return Slo(ttft_ms=2000, tpot_ms=factor * IDLE_STEP_MS, percentile=90)


@dataclass(frozen=True)
class Case:
    name: str
    load: ShapeLoad
    current: Shape
    slo: Slo
    want: ShapeAction
    want_target: Shape
    want_reason: str  # a fragment of the reason
    since_change_s: float = 3600.0
    config: dict[str, float] = field(default_factory=dict)


CASES = [
    Case(
        "quiet load collapses a split to one colocated worker",
        ShapeLoad(
            rate_rps=0.4, prompt_tokens_mean=1000, output_tokens_mean=200, prompt_tokens_p90=1500, tpot_ms=6.0
        ),
        Shape(prefill=1, decode=1),
        Slo(ttft_ms=2000, tpot_ms=50),
        ShapeAction.collapse,
        Shape(colocated=1),
        "Collapsed: 0.4 req/s fits 1 colocated worker at TPOT p90 5 ms <= 50 ms; "
        "the split needs 1P+1D at 2 GPUs",
    ),
    Case(
        "tight TPOT (1.5x idle) under long prompts splits",
        LONG,
        Shape(colocated=6),
        tpot_x_idle(1.5),
        ShapeAction.split,
        Shape(prefill=1, decode=2),
        "Split: TPOT p90 9 ms > 7 ms under prefill interference; "
        "1P+2D serves it at 3 GPUs, 15 colocated would need 15",
    ),
    Case(
        "loose TPOT (8x idle) keeps colocated workers: the split saves nothing",
        LONG,
        Shape(colocated=2),
        tpot_x_idle(8),
        ShapeAction.keep,
        Shape(colocated=2),
        "Kept 2 colocated: it needs 2 colocated at 2 GPUs; 1P+1D at 2 GPUs saves less than 10%",
    ),
    Case(
        "loose TPOT (8x idle) collapses a split that colocated workers serve on fewer GPUs",
        replace(LONG, prompt_tokens_mean=2000, prompt_tokens_p90=3000),
        Shape(prefill=1, decode=1),
        tpot_x_idle(8),
        ShapeAction.collapse,
        Shape(colocated=1),
        "Collapsed: 10 req/s fits 1 colocated worker",
    ),
    Case(
        "inside the hysteresis band (3P+8D against 12 colocated) keeps",
        ShapeLoad(
            rate_rps=38,
            prompt_tokens_mean=2500,
            output_tokens_mean=1000,
            prompt_tokens_p90=3500,
            tpot_ms=12.0,
        ),
        Shape(colocated=12),
        tpot_x_idle(3),
        ShapeAction.keep,
        Shape(colocated=12),
        "Kept 12 colocated: it needs 12 colocated at 12 GPUs; 3P+8D at 11 GPUs saves less than 10%",
    ),
    Case(
        "the same load with no band splits",
        ShapeLoad(
            rate_rps=38,
            prompt_tokens_mean=2500,
            output_tokens_mean=1000,
            prompt_tokens_p90=3500,
            tpot_ms=12.0,
        ),
        Shape(colocated=12),
        tpot_x_idle(3),
        ShapeAction.split,
        Shape(prefill=3, decode=8),
        "Split: 38 req/s; 3P+8D serves it at 11 GPUs, 12 colocated would need 12",
        config={"band": 0.0},
    ),
    Case(
        "a change just made keeps the shape for the dwell",
        LONG,
        Shape(colocated=6),
        tpot_x_idle(1.5),
        ShapeAction.keep,
        Shape(colocated=6),
        "Kept 6 colocated: would split (TPOT p90 9 ms > 7 ms",
        since_change_s=30.0,
    ),
    Case(
        "a change whose cost the saving does not repay keeps",
        ShapeLoad(
            rate_rps=0.4, prompt_tokens_mean=1000, output_tokens_mean=200, prompt_tokens_p90=1500, tpot_ms=6.0
        ),
        Shape(prefill=1, decode=1),
        Slo(ttft_ms=2000, tpot_ms=50),
        ShapeAction.keep,
        Shape(prefill=1, decode=1),
        "but the change costs 6 GPU-s (2 workers drain 1.2 s + flip 2 s) and saves 5 GPU-s in 5 s",
        config={"horizon_s": 5.0},
    ),
    Case(
        "a TPOT below the idle step: no shape meets it, so nothing moves",
        LONG,
        Shape(prefill=1, decode=2),
        tpot_x_idle(0.9),
        ShapeAction.keep,
        Shape(prefill=1, decode=2),
        "Kept 1P+2D: no split meets the SLO; no count of colocated workers meets the SLO",
    ),
    Case(
        "prompts too long for colocated workers' TTFT: a split is kept however large",
        ShapeLoad(
            rate_rps=1, prompt_tokens_mean=7000, output_tokens_mean=100, prompt_tokens_p90=7000, tpot_ms=5.0
        ),
        Shape(prefill=1, decode=1),
        Slo(
            ttft_ms=177, tpot_ms=50
        ),  # 0.8 x 177 = 142 ms: a 139 ms prompt fits, with a 4.7 ms decode step not
        ShapeAction.keep,
        Shape(prefill=1, decode=1),
        "Kept 1P+1D: it needs 2P+1D at 3 GPUs; no count of colocated workers meets the SLO",
    ),
    Case(
        "the same prompts on colocated workers split: no count of them meets the TTFT",
        ShapeLoad(
            rate_rps=1, prompt_tokens_mean=7000, output_tokens_mean=100, prompt_tokens_p90=7000, tpot_ms=5.0
        ),
        Shape(colocated=2),
        Slo(ttft_ms=177, tpot_ms=50),
        ShapeAction.split,
        Shape(prefill=2, decode=1),
        "Split: 1 req/s; 2P+1D serves it at 3 GPUs, no count of colocated workers meets the SLO",
    ),
    Case(
        "a quiet service already colocated stays so",
        ShapeLoad(rate_rps=0.4, prompt_tokens_mean=1000, output_tokens_mean=200, tpot_ms=5.0),
        Shape(colocated=1),
        Slo(ttft_ms=2000, tpot_ms=50),
        ShapeAction.keep,
        Shape(colocated=1),
        "Kept 1 colocated",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shape_rule(case: Case):
    cfg = ShapeConfig(slo=case.slo, profile=H200, **case.config)  # type: ignore[arg-type]
    d = decide_shape(case.load, case.current, case.since_change_s, cfg)
    assert (d.action, d.target) == (case.want, case.want_target), d.reason
    assert case.want_reason in d.reason
    assert d.current == case.current


def test_hysteresis_holds_either_way_at_the_crossover():
    """Where neither shape saves the band, both directions keep: the service cannot flap."""
    load = CASES[4].load
    cfg = ShapeConfig(slo=tpot_x_idle(3), profile=H200)
    assert decide_shape(load, Shape(colocated=11), 3600, cfg).action == ShapeAction.keep
    assert decide_shape(load, Shape(prefill=3, decode=7), 3600, cfg).action == ShapeAction.keep


def test_config_from_the_policy_carries_its_slo_margin_and_flip_time():
    slo = Slo(ttft_ms=2000, tpot_ms=40)
    cfg = ShapeConfig.from_policy(
        PolicyConfig(slo=slo, profile=H200, limits={}, margin=0.7, flip_s=5.0), dwell_s=60.0
    )
    assert (cfg.slo, cfg.margin, cfg.flip_s, cfg.dwell_s) == (slo, 0.7, 5.0, 60.0)


def test_the_load_comes_from_the_policys_observations():
    def obs(pool: Pool, **kw: float) -> PoolObservation:
        return PoolObservation(pool=pool, at_s=0.0, window_s=60.0, replicas=Replicas(1), **kw)  # type: ignore[arg-type]

    split = {
        Pool.prefill: obs(
            Pool.prefill, arrival_rate_rps=3.0, prompt_tokens_mean=900, prompt_tokens_p90=1500, ttft_ms=120
        ),
        Pool.decode: obs(
            Pool.decode, arrival_rate_rps=3.0, prompt_tokens_mean=900, output_tokens_mean=150, tpot_ms=6.0
        ),
    }
    assert ShapeLoad.observed(split) == ShapeLoad(3.0, 900, 150, 1500, 0.0, 120, 6.0)
    colocated = {
        Pool.colocated: obs(
            Pool.colocated,
            arrival_rate_rps=0.4,
            prompt_tokens_mean=1000,
            output_tokens_mean=200,
            tpot_ms=math.nan,
        )
    }
    assert ShapeLoad.observed(colocated) == ShapeLoad(0.4, 1000, 200)  # NaN counts as missing
    assert ShapeLoad.observed({Pool.prefill: split[Pool.prefill]}) is None
    assert ShapeLoad.observed({**split, Pool.decode: obs(Pool.decode, arrival_rate_rps=3.0)}) is None


def test_a_shape_is_colocated_or_split_not_both():
    with pytest.raises(ValueError, match="not both"):
        Shape(colocated=1, decode=1)
    assert (str(Shape(prefill=2, decode=3)), str(Shape(colocated=4))) == ("2P+3D", "4 colocated")


# --- the colocated capacity model, by hand on round numbers (prefill 0.1 ms/token, step 10 + 0.5 b ms) ---


def test_colocated_step_is_the_decode_step_stretched_by_the_prefill_share():
    p = linear_profile()
    prefill = PrefillLoad(rate_rps=2.0, prompt_tokens_mean=1000, prompt_tokens_p=1000)  # u = 2 x 100 ms = 0.2
    decode = DecodeLoad(rate_rps=2.0, prompt_tokens_mean=1000, output_tokens_mean=100)
    # step = (10 + 0.5 b) / 0.8 with b = 2 x 100 x step / 1000 = 0.2 step  ->  0.7 step = 10
    assert colocated_step_ms(p, 1, prefill, decode) == pytest.approx(10 / 0.7, rel=1e-4)
    assert colocated_step_ms(p, 2, prefill, decode) < colocated_step_ms(p, 1, prefill, decode)
    saturated = replace(prefill, rate_rps=10.0)  # 10 x 100 ms: prefill alone fills every step
    assert colocated_step_ms(p, 1, saturated, replace(decode, rate_rps=10.0)) == math.inf
    assert colocated_tpot_ms(p, 1, saturated, replace(decode, rate_rps=10.0)) == math.inf


@pytest.mark.parametrize(
    "rate,batched",
    [
        (2.0, False),  # 0.5 prompts a second a worker: less than one a step, each pays its own 25 ms
        (200.0, True),  # 50 a second a worker: the prompts of a step share its 20 ms fixed cost
        (400.0, True),
    ],
)
def test_colocated_prompts_in_one_step_share_its_fixed_cost(rate, batched):
    """Prefill 20 ms + 0.01 ms/token at a chunk of 8192, a 10 ms decode step, 4 workers: b = rate/4 x (10 +
    S(b x 500)) ms prompts a step, each costing S(b x 500) / b."""
    p = linear_profile(prefill_ms_per_token=0.01, prefill_fixed_ms=20.0, chunk_tokens=8192)
    load = PrefillLoad(rate_rps=rate, prompt_tokens_mean=500, prompt_tokens_p=500)
    alone = rate * p.prefill_ms(500) / 1000
    u = prefill_share(p, 4, load, 10.0)
    if not batched:
        assert u == pytest.approx(alone / 4)
        return
    lo, hi = 1.0, 8192 / 500
    for _ in range(60):
        b = (lo + hi) / 2
        lo, hi = (b, hi) if rate / 4 / 1000 * (10.0 + 20.0 + 0.01 * 500 * b) > b else (lo, b)
    assert u == pytest.approx(rate / 4 / 1000 * (20.0 + 0.01 * 500 * b) / b, rel=1e-6)
    assert u < alone / 4
    no_fixed_cost = linear_profile(prefill_ms_per_token=0.01, chunk_tokens=8192)
    assert prefill_share(no_fixed_cost, 4, load, 10.0) == pytest.approx(rate / 4 * 0.01 * 500 / 1000)


def test_colocated_tpot_p90_is_the_plain_step_without_prompts_and_pays_for_them_with_short_outputs():
    p = linear_profile()
    decode = DecodeLoad(rate_rps=2.0, prompt_tokens_mean=1000, output_tokens_mean=100)
    idle = PrefillLoad(rate_rps=0.0, prompt_tokens_mean=1000, prompt_tokens_p=1000)
    assert colocated_tpot_ms(p, 1, idle, decode) == pytest.approx(colocated_step_ms(p, 1, idle, decode))
    prefill = PrefillLoad(rate_rps=2.0, prompt_tokens_mean=1000, prompt_tokens_p=1500)
    long, short = replace(decode, output_tokens_mean=2000), replace(decode, output_tokens_mean=4)
    plain = 10.0  # the step at a batch near 1, without prompts
    # a long generation meets many 100 ms prompts: its TPOT is near the mean step, its spread averaged out
    assert colocated_tpot_ms(p, 4, prefill, long) == pytest.approx(
        colocated_step_ms(p, 4, prefill, long), rel=0.25
    )
    # a three-step generation that meets one 100 ms prompt pays about a third of it per token
    assert colocated_tpot_ms(p, 1, prefill, short) > plain + 100 / 4
    assert colocated_tpot_ms(p, 1, prefill, short) > 2 * colocated_step_ms(p, 1, prefill, short)
    assert colocated_tpot_ms(p, 4, prefill, short) < colocated_tpot_ms(p, 1, prefill, short)


def test_colocated_ttft_adds_a_decode_step_per_chunk_to_the_prefill_queue():
    p = linear_profile()  # chunk 512: a 1000-token prompt rides two steps
    prefill = PrefillLoad(rate_rps=2.0, prompt_tokens_mean=1000, prompt_tokens_p=1000)
    decode = DecodeLoad(rate_rps=2.0, prompt_tokens_mean=1000, output_tokens_mean=100)
    step = colocated_step_ms(p, 4, prefill, decode)
    batch = 2.0 / 4 * 100 * step / 1000
    want = prefill_ttft_ms(p, 4, prefill, 90) + 2 * p.decode_step_ms(batch, 1050)
    assert colocated_ttft_ms(p, 4, prefill, decode, 90) == pytest.approx(want)


@pytest.mark.parametrize("rate", [0.5, 5.0, 30.0])
def test_colocated_need_is_the_fewest_workers_meeting_both_targets(rate):
    p = linear_profile()
    slo = Slo(ttft_ms=500, tpot_ms=30)
    prefill = PrefillLoad(rate_rps=rate, prompt_tokens_mean=1000, prompt_tokens_p=1500)
    decode = DecodeLoad(rate_rps=rate, prompt_tokens_mean=1000, output_tokens_mean=100)

    def fits(n: int) -> bool:
        return (
            colocated_tpot_ms(p, n, prefill, decode, 90) <= 24
            and colocated_ttft_ms(p, n, prefill, decode, 90) <= 400
        )

    need = colocated_need(p, prefill, decode, slo, 0.8)
    assert fits(need.replicas)
    assert need.replicas == 1 or not fits(need.replicas - 1)


def test_colocated_need_says_when_no_count_meets_the_slo():
    p = linear_profile()  # the idle step alone is 10.5 ms
    need = colocated_need(
        p, PrefillLoad(1.0, 100, 100), DecodeLoad(1.0, 100, 10), Slo(ttft_ms=500, tpot_ms=10), 0.8
    )
    assert need.latency_ms == math.inf


def test_the_rule_sizes_for_the_busiest_window_of_the_dwell():
    """A quiet minute between bursts does not collapse the service; a surge is seen at once; a burst ages
    out."""
    busy = ShapeLoad(rate_rps=2.0, prompt_tokens_mean=2000, output_tokens_mean=30, burst_rate_rps=14.0)
    quiet = ShapeLoad(rate_rps=0.3, prompt_tokens_mean=2000, output_tokens_mean=30)
    peak, recent = peak_load((), busy, now_s=0.0, span_s=600.0)
    assert peak == busy
    peak, recent = peak_load(recent, quiet, now_s=60.0, span_s=600.0)
    assert peak == busy and len(recent) == 2
    peak, recent = peak_load(recent, quiet, now_s=650.0, span_s=600.0)
    assert peak == quiet and [t for t, _ in recent] == [60.0, 650.0]
    surge = replace(busy, rate_rps=20.0)
    assert peak_load(recent, surge, now_s=655.0, span_s=600.0)[0] == surge


SHORT_OUTPUTS = ShapeLoad(
    rate_rps=4,
    prompt_tokens_mean=2000,
    output_tokens_mean=28,
    prompt_tokens_p90=5000,
    ttft_ms=300,
    tpot_ms=20,
)


def test_colocated_workers_that_breach_teach_the_rule_to_size_them_for_more_load():
    """Bursts of long prompts stall short generations: 4 colocated workers breach TPOT where the model says
    one meets it. The rule learns the ratio, sizes colocated workers for that much more load (a split that it
    would collapse stays split), and the lesson fades over the horizon."""
    cfg = ShapeConfig(slo=Slo(ttft_ms=2000, tpot_ms=50), profile=H200)
    split = Shape(prefill=1, decode=1)
    assert decide_shape(SHORT_OUTPUTS, split, 3600, cfg).action == ShapeAction.collapse
    breached = replace(SHORT_OUTPUTS, tpot_ms=157)
    learned = learn_colocated(Learned(), breached, Shape(colocated=4), cfg, now_s=1000)
    assert learned.factor == pytest.approx(4.0) and learned.at_s == 1000
    kept = decide_shape(SHORT_OUTPUTS, split, 3600, cfg, learned.factor)
    assert kept.action == ShapeAction.keep, kept.reason
    later = learn_colocated(learned, SHORT_OUTPUTS, split, cfg, now_s=1000 + cfg.horizon_s)
    assert later.factor == pytest.approx(
        1 + 3 / math.e
    )  # a split service learns nothing new; the excess fades
    assert learn_colocated(learned, breached, Shape(colocated=40), cfg, 1000).factor == MAX_COLOCATED_FACTOR
    # meeting the SLO, or breaching on no more workers than the model asked for, teaches nothing
    assert learn_colocated(Learned(), SHORT_OUTPUTS, Shape(colocated=4), cfg, 1000).factor == 1.0
    assert learn_colocated(Learned(), breached, Shape(colocated=1), cfg, 1000).factor == 1.0


def test_a_shape_that_breaches_on_more_workers_than_the_model_asks_costs_the_workers_it_runs():
    """The model says one colocated worker serves the load; eight run and still breach: the split (2 GPUs)
    is cheaper than what the colocated shape really costs, so the rule splits."""
    cfg = ShapeConfig(slo=Slo(ttft_ms=2000, tpot_ms=50), profile=H200)
    breached = replace(SHORT_OUTPUTS, tpot_ms=157)
    d = decide_shape(breached, Shape(colocated=8), 3600, cfg)
    assert (d.action, d.target) == (ShapeAction.split, Shape(prefill=1, decode=1)), d.reason
    assert decide_shape(SHORT_OUTPUTS, Shape(colocated=8), 3600, cfg).action == ShapeAction.keep


def test_the_policy_sizes_colocated_workers_as_the_shape_rule_does_prompts_at_the_burst_decode_at_the_mean():
    """A burst inside the window: the colocated pool's prompts are sized at the burst's rate (a queue has no
    time to scale) and its decode batch at the window's mean, as the shape rule's `_loads` does."""
    slo = Slo(ttft_ms=2000, tpot_ms=50)
    cfg = PolicyConfig(slo=slo, profile=H200, limits={})
    obs = PoolObservation(
        pool=Pool.colocated,
        at_s=0.0,
        window_s=60.0,
        replicas=Replicas(2),
        arrival_rate_rps=10.0,
        prompt_tokens_mean=1000.0,
        prompt_tokens_p90=2500.0,
        output_tokens_mean=200.0,
        ttft_ms=100.0,
        tpot_ms=10.0,
        arrival_rate_slices_rps=(5.0, 5.0, 5.0, 5.0, 5.0, 35.0),
    )
    sized = size_pool(obs, cfg, 10.0)
    assert sized.rate_rps == pytest.approx(35.0, rel=0.01)  # the burst, less what Poisson noise explains
    burst = PrefillLoad(sized.rate_rps, 1000.0, 2500.0)
    assert sized.need == colocated_need(H200, burst, DecodeLoad(10.0, 1000.0, 200.0), slo, cfg.margin)
    assert sized.need != colocated_need(H200, burst, DecodeLoad(35.0, 1000.0, 200.0), slo, cfg.margin)
