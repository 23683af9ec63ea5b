"""Role flips as a scaling action (pure): a warm worker of the pool with slack serves a breaching pool within
its drain plus the flip time, instead of after a cold start.

Next to add and remove, the policy may lend workers: when one pool's decision is a scale-up for a breach
(the SLO breached now, a stall, a growing queue, the running batch) and the other pool has slack that
survives losing them (its own capacity model keeps its latency within the margin at the fewer replicas, and
it meets its SLO with margin now), the fewest of (the breaching pool's shortfall, the lender's slack) flip
now and the breaching pool's new pods start in the background, as without flips. A flip costs the
lender's drain (a generation at the observed TPOT, or a prefill step) plus `flip_s`; when that is not
shorter than a cold start, adding pods is as fast and nothing is lent.

While workers are lent, the lender holds its scale-downs (they come back) and the pools' bounds stretch by
the loan. They flip back once the borrower's own new pods are Ready and it meets its SLO with margin
without them, or at once when the lender itself breaches (before it adds pods). Counts are by the role a
worker serves now, as the actuators report them; the loan (home pool, serving pool, count) is remembered
here. A flip back marks the returned workers for removal first (the pod deletion cost) when their home pool
later steps down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from tandem.operator.autoscale.core.capacity import prefill_drain_tokens_per_ms
from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.policy import PolicyState, decide
from tandem.operator.autoscale.core.sizing import Sizing, missing, size_pool
from tandem.operator.autoscale.core.types import Decision, Pool, PoolObservation

BREACH_CODES = frozenset({"SLOBreach", "Stalled", "QueueGrowing", "RunningBatch"})
OTHER = {Pool.prefill: Pool.decode, Pool.decode: Pool.prefill}
FLIPPED_BACK = "FlippedBack"
K = TypeVar("K")


@dataclass(frozen=True)
class Flip:
    """`count` workers stop serving `source` now and serve `target` after `cost_s` (their drain plus the
    flip)."""

    source: Pool
    target: Pool
    count: int
    reason: str  # "FlippedToDecode: TPOT p90 74 ms > 50 ms SLO; prefill has 1.8 replicas of slack; ..."
    reason_code: str  # FlippedToDecode, FlippedToPrefill, FlippedBack
    cost_s: float = 0.0
    details: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Loan:
    """Workers of `home` (their Deployment) serving `serving` since `since_s`."""

    home: Pool
    serving: Pool
    count: int
    since_s: float


@dataclass(frozen=True)
class FlipState:
    policy: PolicyState = field(default_factory=PolicyState)
    loan: Loan | None = None


def flipped_to(pool: Pool) -> str:
    return f"FlippedTo{pool.value.capitalize()}"


def decide_with_flips(
    observations: dict[Pool, PoolObservation], state: FlipState, config: PolicyConfig, now_s: float
) -> tuple[dict[Pool, Decision], tuple[Flip, ...], FlipState]:
    """`decide`, then the flip rules: settle an open loan (hold the lender, return the workers) or open
    one."""
    if not config.flip_enabled or set(observations) != {Pool.prefill, Pool.decode}:
        decisions, policy = decide(observations, state.policy, config, now_s)
        return decisions, (), replace(state, policy=policy)
    decisions, policy = decide(observations, state.policy, with_loan(config, state.loan), now_s)
    if state.loan is not None:
        settled, flip, loan = settle(observations, decisions, state.loan, config)
        policy = _unrecord(policy, state.policy, decisions, settled)
        decisions = settled
    else:
        flip, loan = lend(observations, decisions, config, now_s)
    return decisions, (flip,) if flip else (), FlipState(policy, loan)


def _unrecord(
    policy: PolicyState, before: PolicyState, decided: dict[Pool, Decision], final: dict[Pool, Decision]
) -> PolicyState:
    """A step down the flip rules turned into a hold did not happen: the pool's last change stays the one
    before."""
    pools = dict(policy.pools)
    for pool, d in final.items():
        if decided[pool].desired < decided[pool].current and not d.changes and pool in before.pools:
            old = before.pools[pool]
            pools[pool] = replace(
                pools[pool],
                target=old.target,
                target_since_s=old.target_since_s,
                last_change_s=old.last_change_s,
                last_direction=old.last_direction,
            )
    return PolicyState(pools)


def with_loan(config: PolicyConfig, loan: Loan | None) -> PolicyConfig:
    """Bounds stretched by the loan: the borrower holds its own pods plus the lent ones, the lender fewer."""
    if loan is None:
        return config
    limits = dict(config.limits)
    home, serving = config.limits_for(loan.home), config.limits_for(loan.serving)
    limits[loan.home] = replace(home, min_replicas=max(home.min_replicas - loan.count, 0))
    limits[loan.serving] = replace(serving, max_replicas=serving.max_replicas + loan.count)
    return replace(config, limits=limits)


# --- lending --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """What a pool can lend: how many workers, its slack in replicas, and how long one takes to drain."""

    count: int
    slack: float
    drain_s: float


def lend(
    observations: dict[Pool, PoolObservation],
    decisions: dict[Pool, Decision],
    config: PolicyConfig,
    now_s: float,
) -> tuple[Flip | None, Loan | None]:
    """Flip workers to a pool that breaches, from the other pool's slack, if that is faster than a cold
    start."""
    for target in (Pool.decode, Pool.prefill):
        d = decisions[target]
        breach = _breach(observations[target], d, config)
        if not (d.desired > d.current and breach):
            continue
        source = OTHER[target]
        offer = slack(observations[source], decisions[source], config)
        if offer is None:
            continue
        cost = offer.drain_s + config.flip_s
        if cost >= config.cold_start:
            continue
        count = min(offer.count, d.desired - d.current)
        reason = (
            f"{flipped_to(target)}: {breach}; {source} has {offer.slack:.1f} replicas of slack; "
            f"{count} {source} worker{'s serve' if count > 1 else ' serves'} {target} in {cost:.1f} s "
            f"(drain {offer.drain_s:.1f} s + flip {config.flip_s:g} s) while {d.desired - d.current} new "
            "pods start"
        )
        details = {"slack_replicas": offer.slack, "drain_s": offer.drain_s, "flip_s": config.flip_s}
        return Flip(source, target, count, reason, flipped_to(target), cost, details), Loan(
            source, target, count, now_s
        )
    return None, None


def _breach(obs: PoolObservation, d: Decision, config: PolicyConfig) -> str:
    """Why the pool breaches now ('' if it does not): its latency above the SLO (even when the forecast asks
    for more than the breach alone), or a reactive scale-up (a stall, a growing queue, the running batch)."""
    latency, slo, label = (
        (obs.ttft_ms, config.slo.ttft_ms, "TTFT")
        if obs.pool == Pool.prefill
        else (obs.tpot_ms, config.slo.tpot_ms, "TPOT")
    )
    if not missing(latency) and float(latency) > slo:  # type: ignore[arg-type]
        return f"{label} p{config.slo.percentile:g} {latency:.0f} ms > {slo:.0f} ms SLO"
    return d.reason.split(": ", 1)[-1].split(";")[0] if d.reason_code in BREACH_CODES else ""


def slack(obs: PoolObservation, d: Decision, config: PolicyConfig) -> Offer | None:
    """The workers `obs.pool` can lose with its own SLO model still meeting the margin, never its last one;
    None if none. `minReplicas` does not hold them back: it bounds the pool's pods, and a lent pod is one."""
    r = obs.replicas
    if d.desired > d.current or r.starting or missing(obs.arrival_rate_rps):
        return None
    spare = r.ready - 1  # never the last worker; minReplicas bounds the pods, and a lent pod is still one
    if spare <= 0:
        return None
    if _idle(obs):
        return Offer(spare, float(r.ready), 0.0)
    sizing = _sizing(obs, config, d)
    if sizing is None or sizing.observed_ms > config.margin * sizing.slo_ms:
        return None
    count = 0
    for k in range(1, spare + 1):
        if sizing.latency_share(r.ready - k) > config.margin or not _present_fits(obs, config, r.ready - k):
            break
        count = k
    if count == 0:
        return None
    return Offer(count, r.ready - sizing.need.load_replicas, _drain_s(obs, config))


def _idle(obs: PoolObservation) -> bool:
    return (
        not (obs.arrival_rate_rps or 0) > 0
        and not (obs.queued_prompt_tokens or 0) > 0
        and not (obs.running_sequences or 0) > 0
    )


def _sizing(obs: PoolObservation, config: PolicyConfig, d: Decision) -> Sizing | None:
    needed = (
        ("prompt_tokens_mean", "ttft_ms")
        if obs.pool == Pool.prefill
        else ("prompt_tokens_mean", "output_tokens_mean", "tpot_ms")
    )
    if any(missing(getattr(obs, name)) for name in needed):
        return None
    rate = max(float(obs.arrival_rate_rps or 0.0), d.details.get("predicted_rate_rps", 0.0))
    return size_pool(obs, config, rate)


def _present_fits(obs: PoolObservation, config: PolicyConfig, replicas: int) -> bool:
    """The work running now fits the fewer replicas within the margin: decode's batch, prefill's backlog."""
    profile, margin = config.profile, config.margin
    if obs.pool == Pool.decode:
        running = float(obs.running_sequences or 0.0)
        context = float(obs.prompt_tokens_mean or 0.0) + float(obs.output_tokens_mean or 0.0) / 2
        batch = running / replicas
        return (
            batch <= profile.max_running_sequences
            and profile.decode_step_ms(max(batch, 1.0), context) <= margin * config.slo.tpot_ms
        )
    prompt = float(obs.prompt_tokens_mean or 0.0)
    if prompt <= 0:
        return True
    backlog_ms = float(obs.queued_prompt_tokens or 0.0) / (
        replicas * prefill_drain_tokens_per_ms(profile, prompt)
    )
    return (
        backlog_ms + profile.prefill_ms(float(obs.prompt_tokens_p90 or prompt)) <= margin * config.slo.ttft_ms
    )


def _drain_s(obs: PoolObservation, config: PolicyConfig) -> float:
    """How long a worker takes to finish the work it holds: a whole generation (decode; waiting sequences go
    elsewhere), or the prefill step in progress (queued prompts go elsewhere)."""
    if obs.pool == Pool.decode:
        return float(obs.output_tokens_mean or 0.0) * float(obs.tpot_ms or 0.0) / 1000
    prompt = float(obs.prompt_tokens_p90 or obs.prompt_tokens_mean or 0.0)
    return config.profile.prefill_ms(prompt) / 1000 if prompt > 0 else 0.0


# --- an open loan ---------------------------------------------------------------------------------------


def settle(
    observations: dict[Pool, PoolObservation],
    decisions: dict[Pool, Decision],
    loan: Loan,
    config: PolicyConfig,
) -> tuple[dict[Pool, Decision], Flip | None, Loan | None]:
    """Return the workers when the lender needs them or the borrower's own pods are Ready; else hold the
    lender."""
    home, serving = loan.home, loan.serving
    d_home, d_serving = decisions[home], decisions[serving]
    out = dict(decisions)
    if d_home.desired > d_home.current:  # the lender breaches: its own workers first, then new pods
        back = min(loan.count, d_home.desired - d_home.current)
        why = d_home.reason.split(": ", 1)[-1].split(";")[0]
        out[home] = _less(d_home, back, f"{back} of its workers flip back from {serving}")
        reason = f"{FLIPPED_BACK}: {home} needs its workers back: {why}; {back} return from {serving}"
        cost = _drain_s(observations[serving], config) + config.flip_s
        return out, Flip(serving, home, back, reason, FLIPPED_BACK, cost), _smaller(loan, back)
    back = _returnable(observations[serving], d_serving, loan, config)
    if back:
        if d_serving.desired < d_serving.current:  # the return is this tick's step down
            out[serving] = _hold(d_serving, f"{back} lent workers flip back to {home} instead", FLIPPED_BACK)
        if d_home.desired < d_home.current:
            out[home] = _hold(d_home, f"{back} of its workers flip back from {serving}", FLIPPED_BACK)
        r = observations[serving].replicas
        reason = (
            f"{FLIPPED_BACK}: {serving} meets its SLO on {r.ready - back} workers of its own "
            f"(new pods Ready); {back} return to {home}"
        )
        cost = _drain_s(observations[serving], config) + config.flip_s
        return out, Flip(serving, home, back, reason, FLIPPED_BACK, cost), _smaller(loan, back)
    if d_home.desired < d_home.current:
        out[home] = _hold(d_home, f"{loan.count} of its workers serve {serving} and come back", "Lent")
    return out, None, loan


def _returnable(obs: PoolObservation, d: Decision, loan: Loan, config: PolicyConfig) -> int:
    """How many lent workers the borrower can give back: none while its new pods start; else the most whose
    loss keeps it within the margin by its own SLO model (all of them when it went idle)."""
    r = obs.replicas
    if r.starting or d.desired > d.current or missing(obs.arrival_rate_rps):
        return 0
    if _idle(obs):
        return loan.count
    sizing = _sizing(obs, config, d)
    if sizing is None:
        return 0
    back = 0
    for k in range(1, min(loan.count, r.ready - 1) + 1):
        if sizing.latency_share(r.ready - k) > config.margin or not _present_fits(obs, config, r.ready - k):
            break
        back = k
    return back


def _smaller(loan: Loan, back: int) -> Loan | None:
    return replace(loan, count=loan.count - back) if loan.count > back else None


def _hold(d: Decision, why: str, code: str) -> Decision:
    return Decision(d.pool, d.current, d.current, f"{d.pool} holds at {d.current}: {why}", code, d.details)


def _less(d: Decision, back: int, why: str) -> Decision:
    """The lender's scale-up, less the workers that come back."""
    desired = d.desired - back
    if desired <= d.current:
        return _hold(d, why, FLIPPED_BACK)
    reason = d.reason.replace(f"{d.current}->{d.desired}", f"{d.current}->{desired}", 1) + f"; {why}"
    return replace(d, desired=desired, reason=reason)


# --- sequencing the flips of one tick -------------------------------------------------------------------


_SIDE = {"colocated": "decode"}  # a colocated worker stands in for a decode worker (the router's view too)


def flip_waves(roles: Mapping[K, str], flips: Mapping[K, str]) -> tuple[list[list[K]], list[K]]:
    """In what order `flips` (worker -> new role) may run so that no pool is left without a worker (pure).
    The waves run one after another, the workers of one wave at once; a worker leaves its pool only while
    another is there, counting those that came in an earlier wave (one arriving in the same wave is still
    draining its old role's work). `roles`: the pool each worker is in now. Returns the waves and the
    flips refused because they would empty their pool. Decode and colocated workers count as one pool here:
    either takes a request's decode (a colocated one its prompt too)."""
    now = dict(roles)
    pending = [k for k, to in flips.items() if now.get(k) != to]
    waves: list[list[K]] = []
    while pending:
        sides = [_SIDE.get(r, r) for r in now.values()]
        left = {side: sides.count(side) for side in set(sides)}
        wave = []
        for k in pending:
            source = _SIDE.get(now[k], now[k]) if k in now else None
            if source is None or left[source] > 1:
                wave.append(k)
                if source is not None:
                    left[source] -= 1
        if not wave:
            break
        waves.append(wave)
        now.update({k: flips[k] for k in wave})
        pending = [k for k in pending if k not in wave]
    return waves, pending
