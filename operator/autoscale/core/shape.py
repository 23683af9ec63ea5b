"""The shape as a decision (pure): colocated workers or a prefill/decode split, whichever serves the load at
the SLO on fewer GPUs, with hysteresis and a cost for each change.

The rule sizes both shapes for the window's load at the policy's margin (a share of the SLO) with the
capacity model of the profile in use: the split with capacity.prefill_need and decode_need (at least one
replica of each), colocated workers with colocated.colocated_need (prefill and decode sharing chunked
steps). It asks for the other shape only when that needs at most `1 - band` of the GPUs the current one
needs (at least one fewer), so a load near the crossover does not send the service back and forth; the
band is on GPUs, not on latency, because near the idle step a latency band would price a tight-TPOT split
out of reach. A change also waits `dwell_s` after the last one, and its cost must be repaid: every worker
drains (a generation at the observed TPOT) and flips (`flip_s`), and the GPUs saved over `horizon_s` must
exceed those GPU-seconds. At the trough this collapses a split service to one colocated GPU.

The live loop runs it for `spec.mode: auto` (shape_tick.py); `tandem simulate` replays fixed colocated
workers (sim/colocated.py) without this rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum

from tandem.operator.autoscale.core.capacity import (
    MAX_REPLICAS_SEARCHED,
    DecodeLoad,
    Need,
    PrefillLoad,
    burst_rate,
    decode_need,
    prefill_need,
)
from tandem.operator.autoscale.core.colocated import colocated_need, colocated_tpot_ms
from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.sizing import missing
from tandem.operator.autoscale.core.types import Pool, PoolObservation
from tandem.profile import Profile
from tandem.slo import Slo


class ShapeAction(Enum):
    keep = "keep"
    collapse = "collapse"
    split = "split"


@dataclass(frozen=True)
class Shape:
    """Workers by role: `colocated` ones, or `prefill` plus `decode` ones."""

    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        if min(self.colocated, self.prefill, self.decode) < 0 or (
            self.colocated and (self.prefill or self.decode)
        ):
            raise ValueError(f"a shape is colocated workers or a split, not both: {self!r}")

    @property
    def split(self) -> bool:
        return self.colocated == 0

    @property
    def workers(self) -> int:
        return self.colocated + self.prefill + self.decode

    def __str__(self) -> str:
        return f"{self.prefill}P+{self.decode}D" if self.split else f"{self.colocated} colocated"


@dataclass(frozen=True)
class ShapeLoad:
    """The window the policy already reads (router-side): arrivals, lengths, and the latencies at the SLO
    percentile."""

    rate_rps: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    prompt_tokens_p90: float | None = None
    prefix_hit_rate: float = 0.0
    ttft_ms: float | None = None  # observed
    tpot_ms: float | None = None  # observed
    burst_rate_rps: float | None = (
        None  # the rate the SLO percentile's request arrived at (capacity.burst_rate)
    )

    @classmethod
    def observed(
        cls, observations: dict[Pool, PoolObservation], percentile: float = 90.0
    ) -> ShapeLoad | None:
        """The load from the policy's own observations: requests and prompts where prefill runs (the prefill
        or colocated pool), outputs and TPOT where decode runs, and the burst rate from the arrival slices (at
        the SLO's `percentile`); None while a metric the rule needs is missing."""
        front = observations.get(Pool.colocated) or observations.get(Pool.prefill)
        back = observations.get(Pool.colocated) or observations.get(Pool.decode)
        if front is None or back is None:
            return None
        needed = (front.arrival_rate_rps, front.prompt_tokens_mean, back.output_tokens_mean)
        if any(missing(v) for v in needed):
            return None
        rate, prompt, output = (float(v) for v in needed)  # type: ignore[arg-type]

        def present(v: float | None) -> float | None:
            return None if missing(v) else v

        slices = front.arrival_rate_slices_rps
        return cls(
            rate,
            prompt,
            output,
            present(front.prompt_tokens_p90),
            present(front.prefix_hit_rate) or 0.0,
            present(front.ttft_ms),
            present(back.tpot_ms),
            burst_rate(slices, percentile, front.window_s / len(slices)) if slices else None,
        )


@dataclass(frozen=True)
class ShapeConfig:
    slo: Slo
    profile: Profile
    margin: float = 0.8  # the current shape is sized for this share of the SLO (the policy's margin)
    band: float = 0.1  # the other shape must need at most 1 - band of the current shape's GPUs
    dwell_s: float = 600.0  # no change sooner than this after the last one
    flip_s: float = 2.0  # a drained worker serves its new role this long after it was asked to flip
    horizon_s: float = 1800.0  # the GPU saving over this long must repay the change
    gpus_per_replica: int = 1

    @classmethod
    def from_policy(cls, cfg: PolicyConfig, **overrides: float) -> ShapeConfig:
        """The shape rule's settings from the policy's: its SLO, profile, margin and flip time."""
        return cls(slo=cfg.slo, profile=cfg.profile, margin=cfg.margin, flip_s=cfg.flip_s, **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ShapeDecision:
    action: ShapeAction
    current: Shape
    target: Shape  # the current shape when kept
    reason: str  # "Collapsed: 0.4 req/s fits 1 colocated worker at TPOT p90 5 ms <= 50 ms; ..."
    details: dict[str, float] = field(default_factory=dict)


def decide_shape(
    load: ShapeLoad, current: Shape, since_change_s: float, cfg: ShapeConfig, colocated_factor: float = 1.0
) -> ShapeDecision:
    """Keep the current shape, or collapse to colocated workers, or split, and say why. Colocated workers are
    sized for `colocated_factor` times the load (`learn_colocated`: what this service's traffic taught)."""
    colocated, split = _sized(load, cfg, colocated_factor)
    need_now, other = (split, colocated) if current.split else (colocated, split)
    if load.ttft_ms is not None and load.tpot_ms is not None and current.workers > need_now.workers:
        if load.ttft_ms > cfg.slo.ttft_ms or load.tpot_ms > cfg.slo.tpot_ms:
            need_now = (
                current  # the shape breaches on more workers than the model says it needs: it costs these
            )
    gpus_now, gpus_other = _gpus(need_now, cfg), _gpus(other, cfg)
    details = {"current_need_gpus": float(gpus_now), "other_need_gpus": float(gpus_other)}
    if _unreachable(other) or gpus_other > min((1 - cfg.band) * gpus_now, gpus_now - 1):
        now = (
            "it needs " + _described(need_now, cfg)
            if not _unreachable(need_now)
            else _described(need_now, cfg)
        )
        then = (
            _described(other, cfg)
            if _unreachable(other)
            else f"{_described(other, cfg)} saves less than {cfg.band:.0%}"
        )
        return _keep(current, f"Kept {current}: {now}; {then}", details)
    action = ShapeAction.collapse if current.split else ShapeAction.split
    why = _why(load, current, colocated, split, cfg, colocated_factor)
    if since_change_s < cfg.dwell_s:
        text = (
            f"Kept {current}: would {action.value} ({why}), but the last change was "
            f"{since_change_s:.0f} s ago (dwell {cfg.dwell_s:.0f} s)"
        )
        return _keep(current, text, details)
    drain_s = load.output_tokens_mean * (load.tpot_ms if load.tpot_ms is not None else cfg.slo.tpot_ms) / 1000
    cost = current.workers * cfg.gpus_per_replica * (drain_s + cfg.flip_s)
    saving = (gpus_now - gpus_other) * cfg.horizon_s
    details |= {"change_cost_gpu_s": cost, "saving_gpu_s": saving}
    if saving <= cost:
        text = (
            f"Kept {current}: would {action.value} ({why}), but the change costs {cost:.0f} GPU-s "
            f"({current.workers} workers drain {drain_s:.1f} s + flip {cfg.flip_s:g} s) "
            f"and saves {saving:.0f} GPU-s in {cfg.horizon_s:.0f} s"
        )
        return _keep(current, text, details)
    return ShapeDecision(
        action, current, other, f"{'Collapsed' if current.split else 'Split'}: {why}", details
    )


def sized(load: ShapeLoad, cfg: ShapeConfig) -> tuple[Shape, Shape]:
    """The colocated workers and the split the rule compares for this load (its capacity model at the
    margin); a count of MAX_REPLICAS_SEARCHED says no count of that kind meets the SLO."""
    return _sized(load, cfg)


def peak_load(
    recent: tuple[tuple[float, ShapeLoad], ...], load: ShapeLoad, now_s: float, span_s: float
) -> tuple[ShapeLoad, tuple[tuple[float, ShapeLoad], ...]]:
    """The window of the last `span_s` (the dwell) with the most prompt work, and the windows kept for the
    next tick (pure): the rule sizes for it, so a quiet minute between bursts does not collapse a service that
    the next burst splits again, while a surge splits at once."""
    kept = tuple((t, seen) for t, seen in recent if t > now_s - span_s) + ((now_s, load),)

    def work(seen: ShapeLoad) -> float:
        return max(seen.rate_rps, seen.burst_rate_rps or 0.0) * seen.prompt_tokens_mean

    return max((seen for _, seen in kept), key=work), kept


MAX_COLOCATED_FACTOR = 4.0  # the most the learned factor may weigh the load colocated workers see


@dataclass(frozen=True)
class Learned:
    """How much heavier than the model says this service's load runs on colocated workers (1: as modelled),
    and when that was last looked at."""

    factor: float = 1.0
    at_s: float = 0.0


def learn_colocated(
    learned: Learned, load: ShapeLoad, current: Shape, cfg: ShapeConfig, now_s: float
) -> Learned:
    """The colocated model's error on this traffic (pure): colocated workers that breach the SLO while the
    model says fewer of them meet it (bursts of long prompts stalling short generations) raise the factor to
    the ratio of the workers running to the workers the model asked for; the excess over 1 fades with
    `horizon_s`. A split service keeps what it learned while colocated, fading."""
    age = max(now_s - learned.at_s, 0.0)
    factor = 1 + (learned.factor - 1) * math.exp(-age / cfg.horizon_s)
    if current.split or load.ttft_ms is None or load.tpot_ms is None:
        return Learned(factor, now_s)
    if load.ttft_ms <= cfg.slo.ttft_ms and load.tpot_ms <= cfg.slo.tpot_ms:
        return Learned(factor, now_s)
    need = _sized(load, cfg, factor)[0].colocated
    if _unreachable(Shape(colocated=need)) or need >= current.colocated:
        return Learned(factor, now_s)
    return Learned(min(factor * current.colocated / need, MAX_COLOCATED_FACTOR), now_s)


def _loads(load: ShapeLoad) -> tuple[PrefillLoad, DecodeLoad]:
    """Prompts at the burst's rate (a queue has no time to scale, as the policy sizes prefill), decode at the
    mean."""
    p90 = load.prompt_tokens_p90 if load.prompt_tokens_p90 is not None else load.prompt_tokens_mean
    rate = max(load.rate_rps, load.burst_rate_rps or 0.0)
    prefill = PrefillLoad(rate, load.prompt_tokens_mean, p90, load.prefix_hit_rate)
    return prefill, DecodeLoad(load.rate_rps, load.prompt_tokens_mean, load.output_tokens_mean)


def _sized(load: ShapeLoad, cfg: ShapeConfig, colocated_factor: float = 1.0) -> tuple[Shape, Shape]:
    """Colocated workers (for `colocated_factor` times the load) and the split that meet both SLOs within the
    margin; a count of MAX_REPLICAS_SEARCHED says no count does (the capacity model's need misses its
    target)."""
    prefill, decode = _loads(load)
    slo, share = cfg.slo, cfg.margin

    def count(need: Need, target_ms: float) -> int:
        return need.replicas if need.latency_ms <= target_ms * share * (1 + 1e-9) else MAX_REPLICAS_SEARCHED

    heavier = (
        replace(prefill, rate_rps=prefill.rate_rps * colocated_factor),
        replace(decode, rate_rps=decode.rate_rps * colocated_factor),
    )
    colocated = count(colocated_need(cfg.profile, *heavier, slo, share), slo.tpot_ms)
    p = count(prefill_need(cfg.profile, prefill, slo, share), slo.ttft_ms)
    d = count(decode_need(cfg.profile, decode, slo, share), slo.tpot_ms)
    return Shape(colocated=max(colocated, 1)), Shape(prefill=max(p, 1), decode=max(d, 1))


def _gpus(shape: Shape, cfg: ShapeConfig) -> int:
    return shape.workers * cfg.gpus_per_replica


def _keep(current: Shape, reason: str, details: dict[str, float]) -> ShapeDecision:
    return ShapeDecision(ShapeAction.keep, current, current, reason, details)


def _unreachable(shape: Shape) -> bool:
    """No count of this kind meets the SLO (the capacity search ran to its end)."""
    return max(shape.colocated, shape.prefill, shape.decode) >= MAX_REPLICAS_SEARCHED


def _described(shape: Shape, cfg: ShapeConfig) -> str:
    """A shape and its GPUs ("2P+3D at 5 GPUs"), or that no count of its kind meets the SLO."""
    if _unreachable(shape):
        return f"no {'split' if shape.split else 'count of colocated workers'} meets the SLO"
    return f"{shape} at {_gpus(shape, cfg)} GPUs"


def _why(
    load: ShapeLoad, current: Shape, colocated: Shape, split: Shape, cfg: ShapeConfig, factor: float = 1.0
) -> str:
    slo, p = cfg.slo, f"p{cfg.slo.percentile:g}"
    if current.split:
        n = colocated.colocated
        prefill, decode = _loads(load)
        heavier = (
            replace(prefill, rate_rps=prefill.rate_rps * factor),
            replace(decode, rate_rps=decode.rate_rps * factor),
        )
        tpot = colocated_tpot_ms(cfg.profile, n, *heavier, slo.percentile)
        learned = (
            f" (sized for {factor:.2g}x the load, as colocated workers breached)" if factor >= 1.05 else ""
        )
        return (
            f"{load.rate_rps:.2g} req/s fits {n} colocated worker{'s' if n > 1 else ''} "
            f"at TPOT {p} {tpot:.0f} ms <= {slo.tpot_ms:.0f} ms{learned}; "
            f"the split needs {_described(split, cfg)}"
        )
    if load.tpot_ms is not None and load.tpot_ms > slo.tpot_ms:
        head = f"TPOT {p} {load.tpot_ms:.0f} ms > {slo.tpot_ms:.0f} ms under prefill interference"
    else:
        head = f"{load.rate_rps:.2g} req/s"
    if _unreachable(colocated):
        return (
            f"{head}; {split} serves it at {_gpus(split, cfg)} GPUs, "
            "no count of colocated workers meets the SLO"
        )
    return (
        f"{head}; {split} serves it at {_gpus(split, cfg)} GPUs, "
        f"{colocated} would need {_gpus(colocated, cfg)}"
    )
