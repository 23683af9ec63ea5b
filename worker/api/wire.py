"""Sampling parameters and finish reasons to and from tandem.v1 messages (torch-free; router and workers)."""

from __future__ import annotations

from collections.abc import Iterable

from tandem.v1 import common_pb2
from tandem.worker.api.params import PromptLogprobs, SamplingParams

FINISH_REASONS = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
    "error": common_pb2.FINISH_REASON_ERROR,
}
FINISH_NAMES = {v: k for k, v in FINISH_REASONS.items()}


def params_to_proto(p: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        max_tokens=p.max_tokens,
        stop_token_ids=p.stop_token_ids,
        logprobs=p.logprobs,
        ignore_eos=p.ignore_eos,
        min_tokens=p.min_tokens,
        top_logprobs=p.top_logprobs,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
    )
    if p.grammar is not None:
        msg.grammar = p.grammar
    if p.seed is not None:
        msg.seed = p.seed
    if p.cache_salt is not None:
        msg.cache_salt = p.cache_salt
    if p.prompt_logprobs is not None:
        msg.prompt_logprobs = p.prompt_logprobs
    return msg


def params_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Raises InvalidRequest for out-of-range values."""
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=list(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs,
        cache_salt=msg.cache_salt if msg.HasField("cache_salt") else None,
        grammar=msg.grammar if msg.HasField("grammar") else None,
        min_tokens=msg.min_tokens,
        top_logprobs=msg.top_logprobs,
        min_p=msg.min_p,
        repetition_penalty=msg.repetition_penalty or 1.0,  # unset (an older sender): off
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
    )


def top_logprobs_to_proto(top: list[tuple[int, float]]) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in top]


def top_logprobs_from_proto(msgs: Iterable[common_pb2.TokenLogprob]) -> list[tuple[int, float]]:
    return [(m.token_id, m.logprob) for m in msgs]


def prompt_logprobs_to_proto(entries: PromptLogprobs) -> list[common_pb2.PromptLogprob]:
    return [
        common_pb2.PromptLogprob(logprob=lp, rank=rank, top=top_logprobs_to_proto(top))
        for lp, rank, top in entries
    ]


def prompt_logprobs_from_proto(msgs: Iterable[common_pb2.PromptLogprob]) -> PromptLogprobs:
    return [(m.logprob, m.rank, top_logprobs_from_proto(m.top)) for m in msgs]
