"""Stall-free batching: beside running decodes a step carries at most `max_prefill_tokens_with_decodes`
prompt tokens; alone, a prompt uses the whole budget; and output is unchanged token for token."""

from __future__ import annotations

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.core.block_manager import BlockManager
from tandem.worker.engine.core.scheduler import Scheduler, SchedulerConfig
from tandem.worker.engine.core.sequence import Sequence
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner.engine import EngineConfig

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _decoding(blocks: BlockManager, sched: Scheduler, name: str) -> Sequence:
    seq = Sequence(name, list(range(6)), GREEDY, output_ids=[7])
    seq.num_computed = 6  # its prompt is in the cache; one token left to compute
    seq.block_table = blocks.allocate(2)
    sched.add_running(seq)
    return seq


def _scheduled(out) -> dict[str, int]:
    return {s.request_id: n for s, n in zip(out.seqs, out.num_new_tokens, strict=True)}


def test_beside_decodes_a_prompt_runs_a_slice_per_step():
    blocks = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_prefill_tokens_with_decodes=8), blocks)
    _decoding(blocks, sched, "d")
    sched.add(Sequence("p", list(range(40)), GREEDY))
    assert _scheduled(sched.schedule()) == {"d": 1, "p": 8}
    assert _scheduled(sched.schedule()) == {"d": 1, "p": 8}  # the running prompt's next slice, still capped


def test_the_cap_is_shared_by_every_prompt_in_the_step():
    blocks = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_prefill_tokens_with_decodes=8), blocks)
    _decoding(blocks, sched, "d")
    for name in ("p1", "p2"):
        sched.add(Sequence(name, list(range(5)), GREEDY))
    assert _scheduled(sched.schedule()) == {"d": 1, "p1": 5, "p2": 3}


@pytest.mark.parametrize("cap", [None, 8])
def test_without_decodes_or_without_a_cap_a_prompt_takes_the_whole_budget(cap):
    blocks = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_prefill_tokens_with_decodes=cap), blocks)
    sched.add(Sequence("p", list(range(40)), GREEDY))
    assert _scheduled(sched.schedule()) == {"p": 40}
    if cap is None:
        sched2 = Scheduler(SchedulerConfig(), BlockManager(num_blocks=64, block_size=4))
        _decoding(sched2.blocks, sched2, "d")
        sched2.add(Sequence("p", list(range(40)), GREEDY))
        assert _scheduled(sched2.schedule()) == {"d": 1, "p": 40}


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max_prefill_tokens_with_decodes"):
        SchedulerConfig(max_prefill_tokens_with_decodes=0)


def _run(tiny_model_dir, cap: int | None) -> tuple[dict[str, list[int]], int]:
    """A long prompt that arrives while another request decodes; (tokens per request, steps)."""
    config = EngineConfig(num_kv_blocks=64, max_prefill_tokens_with_decodes=cap)
    engine, _ = build_engine(tiny_model_dir, config, "float32", "cpu")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    out: dict[str, list[int]] = {"first": [], "late": []}
    engine.add_request(list(range(3, 20)), params, request_id="first")
    steps = 0
    while engine.has_work():
        if steps == 3:
            engine.add_request(list(range(5, 80)), params, request_id="late")
        for o in engine.step():
            out[o.request_id].append(o.token_id)
        steps += 1
    assert engine.blocks.num_used == 0  # nothing held once both finish
    return out, steps


def test_stall_free_batching_keeps_greedy_tokens(tiny_model_dir):
    plain, plain_steps = _run(tiny_model_dir, None)
    sliced, sliced_steps = _run(tiny_model_dir, 16)
    assert sliced == plain and all(len(v) == 12 for v in plain.values())
    assert sliced_steps > plain_steps  # the late prompt really was prefilled over several steps
