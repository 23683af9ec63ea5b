"""The static-shape decode step (`engine.decodeStep`): the same logits and greedy tokens as the general path
across batch and page-table buckets, padding rows that write only the scratch page, every other step on the
general path, and (once, small) the step under torch.compile with no recompile after the warm-up."""

from __future__ import annotations

import re

import pytest
import torch

from tandem.launch import worker_argv
from tandem.spec import InferenceServiceSpec
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.decode_graphs import CUDA_GRAPHS_NEED_CUDA, check_decode_step
from tandem.worker.engine.runner.decode_plan import bucket_for, buckets, is_pure_decode, padded_decode_inputs
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.serve.main import parse_args
from tests.decode_parity import GREEDY, requests, run_lockstep, static_engine

SMALL = dict(block_size=4, num_kv_blocks=128, max_running_sequences=8, max_model_len=64)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


# --- the plan: pure decisions ------------------------------------------------------------------------
def test_buckets_are_powers_of_two_up_to_the_limit():
    assert buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets(48, smallest=2) == (2, 4, 8, 16, 32, 48)
    assert buckets(1, smallest=2) == (1,)
    assert [bucket_for(n, buckets(48)) for n in (1, 3, 32, 33, 48)] == [1, 4, 32, 48, 48]
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        bucket_for(49, buckets(48))


def test_only_one_sampled_token_per_sequence_is_pure_decode():
    assert is_pure_decode([1, 1], [[], []], [1, 1])
    assert not is_pure_decode([], [], [])
    assert not is_pure_decode([1, 5], [[], []], [1, 5])  # a prompt chunk
    assert not is_pure_decode([1, 3], [[], [7, 8]], [1, 1])  # drafts to verify
    assert not is_pure_decode([1, 1], [[], []], [1, 4])  # a one-token chunk that is not the prompt's last


def test_padding_rows_write_and_read_only_the_scratch_block():
    tables = [[5, 9, 2], [7]]
    inputs = padded_decode_inputs([11, 12], [9, 2], tables, (4, 4), block_size=4, scratch_block=99)
    assert inputs.shape == (4, 4) and inputs.num_seqs == 2
    assert inputs.input_ids.tolist() == [11, 12, 0, 0]
    assert inputs.slot_mapping.tolist() == [2 * 4 + 1, 7 * 4 + 2, 99 * 4, 99 * 4]
    assert inputs.context_lens.tolist() == [10, 3, 1, 1]
    assert inputs.table.tolist() == [[5, 9, 2, 99], [7, 99, 99, 99], [99] * 4, [99] * 4]
    with pytest.raises(ValueError, match="do not fit"):
        padded_decode_inputs([1] * 5, [0] * 5, [[0]] * 5, (4, 4), 4, 99)


def test_kv_planner_leaves_room_for_full_padded_buckets():
    from tandem.worker.engine.memory import decode_gather_bytes

    # a cache that holds 64 tokens: the general path never gathers more; the static step gathers every
    # padded row's whole bucket (8 rows x 256 tokens here), whatever the cache holds
    capped = decode_gather_bytes(4 * 1024, 1024, 16, num_layers=2, max_context_tokens=8 * 256)
    padded = decode_gather_bytes(4 * 1024, 1024, 16, num_layers=2, max_context_tokens=8 * 256, padded=True)
    assert (capped, padded) == (64 * 64 // 2, 8 * 256 * 64 // 2)


# --- the step on the engine ------------------------------------------------------------------------
def test_static_step_matches_the_general_path_across_buckets(tiny_model):
    general = Engine(tiny_model, EngineConfig(**SMALL))
    static = static_engine(tiny_model, compile=False, **SMALL)
    run = run_lockstep(general, static, requests(9, longest=12), late=3)
    assert run.tokens[0] == run.tokens[1]
    assert run.max_logit_diff < 1e-4, run.max_logit_diff
    assert run.static_steps > 10 and run.general_steps > 3  # late prompts made mixed steps: general path
    assert {b for b, _ in run.shapes} >= {2, 4, 8} and len({w for _, w in run.shapes}) >= 2, run.shapes
    assert static.blocks.num_used == 0 and general.blocks.num_used == 0
    assert static.kv.k[0].shape[0] == static.blocks.num_blocks + 1  # the scratch page is past the pool


def test_static_step_with_the_8bit_cache(tiny_model):
    config = {**SMALL, "kv_cache_dtype": "int8"}
    run = run_lockstep(
        Engine(tiny_model, EngineConfig(**config)), static_engine(tiny_model, False, **config), requests(5)
    )
    assert run.tokens[0] == run.tokens[1] and run.static_steps > 0
    assert run.max_logit_diff < 1e-4, run.max_logit_diff


def test_padding_never_touches_a_sequence_kv(tiny_model):
    engine = static_engine(tiny_model, compile=False, **SMALL)
    runner = engine.decode_step
    assert runner is not None
    for cache in (*engine.kv.k, *engine.kv.v):
        cache.normal_()
    before = [c.clone() for c in (*engine.kv.k, *engine.kv.v)]
    scratch = runner.scratch_block
    # two sequences in a batch of 8: rows 2..7 are padding
    inputs = padded_decode_inputs([5, 6], [6, 1], [[3, 4], [10]], (8, 4), 4, scratch)
    with torch.inference_mode():
        runner.execute(inputs)
    for old, new in zip(before, (*engine.kv.k, *engine.kv.v), strict=True):
        changed = (old != new).flatten(2).any(-1).nonzero().tolist()  # [(block, offset)]
        real = {(b, o) for b, o in changed if b != scratch}
        assert real == {(4, 2), (10, 1)}, real  # (block, offset): only the two real tokens' slots
        assert any(b == scratch for b, _ in changed)  # the padding rows wrote somewhere: the scratch page


def test_other_steps_take_the_general_path(tiny_model):
    engine = static_engine(tiny_model, compile=False, **SMALL)
    runner = engine.decode_step
    assert runner is not None
    engine.add_request(list(range(2, 12)), SamplingParams(max_tokens=4, **GREEDY))
    sched = engine.scheduler.schedule()
    assert runner.inputs(sched) is None  # a prompt
    engine._update(sched, engine._execute(sched))
    assert runner.steps == 0
    engine.step()
    assert runner.steps == 1  # its first decode
    calls = []
    engine.layer_hook = lambda layer, sched: calls.append(layer)  # the prefill worker's KV push
    engine.step()
    assert runner.steps == 1 and len(calls) == tiny_model.config.num_layers


def test_speculative_steps_take_the_general_path(tiny_model):
    from tandem.worker.engine.speculative.proposer import SpeculativeConfig

    config = {**SMALL, "speculative": SpeculativeConfig(num_tokens=3)}
    prompt = [5, 6, 7, 8] * 6  # repeats: the n-gram proposer drafts
    general = Engine(tiny_model, EngineConfig(**config))
    run = run_lockstep(
        general,
        static_engine(tiny_model, False, **config),
        [(prompt, SamplingParams(max_tokens=12, **GREEDY))],
    )
    assert run.tokens[0] == run.tokens[1] and run.general_steps > 1


# --- flags ---------------------------------------------------------------------------------------------
def _spec(**engine) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "x"}, "engine": engine}
    )


def test_decode_step_flag_reaches_decode_workers_only():
    spec = _spec(decodeStep="cudaGraphs")
    assert parse_args(worker_argv(spec, "svc", "decode", "/m")[1:]).decode_step == "cudaGraphs"
    assert parse_args(worker_argv(spec, "svc", "prefill", "/m")[1:]).decode_step == "eager"
    assert parse_args(worker_argv(_spec(), "svc", "decode", "/m")[1:]).decode_step == "eager"


def test_cuda_graphs_without_cuda_is_refused(tiny_model):
    check_decode_step("compiled", torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_decode_step("cudaGraphs", torch.device("cpu"))
    with pytest.raises(ValueError, match=re.escape(CUDA_GRAPHS_NEED_CUDA)):
        Engine(tiny_model, EngineConfig(**SMALL, decode_step="cudaGraphs"))
    with pytest.raises(ValueError, match="decode_step must be one of"):
        EngineConfig(decode_step="graphs")


def test_worker_without_cuda_refuses_cuda_graphs_before_loading(capsys):
    from tandem.worker.serve.main import main

    argv = [
        "--role",
        "decode",
        "--model-dir",
        "/nonexistent",
        "--device",
        "cpu",
        "--decode-step",
        "cudaGraphs",
    ]
    assert main(argv) == 2
    assert CUDA_GRAPHS_NEED_CUDA in capsys.readouterr().err


def test_layers_kv_pools_do_not_alias(tiny_model):
    # aliased pools would make the compiled step copy the whole cache on every write
    engine = static_engine(tiny_model, compile=True, **SMALL)
    pools = [*engine.kv.k, *engine.kv.v]
    assert len({p.untyped_storage().data_ptr() for p in pools}) == len(pools)


# --- torch.compile, once and small ------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_layers(tmp_path_factory):
    """A 2-layer tiny model: torch.compile's time grows with the layers it traces."""
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model

    return load_model(create_tiny_model(tmp_path_factory.mktemp("two-layers"), TinySpec(layers=2, seed=1)))


def test_compiled_step_matches_and_warm_up_compiles_every_bucket(two_layers):
    tiny_model = two_layers
    config = dict(block_size=8, num_kv_blocks=64, max_running_sequences=4, max_model_len=32)  # 2 x 2 buckets
    static = static_engine(tiny_model, compile=True, **config)
    runner = static.decode_step
    assert runner is not None and warm_up(static) > 0
    assert runner.shapes and runner.warm_up_seconds is not None and static.blocks.num_used == 0
    with torch.compiler.set_stance("fail_on_recompile"):  # every bucket was compiled before serving
        run = run_lockstep(Engine(tiny_model, EngineConfig(**config)), static, requests(6, longest=6), late=2)
    assert run.tokens[0] == run.tokens[1] and run.static_steps > 5
    assert run.max_logit_diff < 1e-4, run.max_logit_diff
    assert {b for b, _ in run.shapes} == {2, 4} and {w for _, w in run.shapes} == {2, 4}, run.shapes


def test_a_first_request_takes_only_the_smallest_batch_buckets():
    from tandem.worker.engine.runner.decode_plan import first_request_shapes

    shapes = [(4, 4), (4, 2), (2, 4), (2, 2)]
    assert first_request_shapes(shapes, 2) == [(2, 4), (2, 2)]
    assert first_request_shapes([(2, 2)], 2) == [
        (2, 2)
    ]  # no shape with unlike sizes: the only one goes first
    assert first_request_shapes([(1, 1), (1, 2)], 1) == [(1, 2), (1, 1)]
