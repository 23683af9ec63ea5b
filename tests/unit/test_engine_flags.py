"""Engine flags from the spec to the worker: attention backend and compile reach the command line, and a
compiled model still gives transformers' greedy tokens after the warm-up."""

from __future__ import annotations

import pytest
import torch

from tandem.launch import worker_argv
from tandem.spec import InferenceServiceSpec
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.runner.engine import EngineConfig
from tandem.worker.serve.main import parse_args


def _spec(**engine) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/models/x"}, "servedName": "x"}, "engine": engine}
    )


def test_spec_engine_flags_reach_the_worker_arguments():
    argv = worker_argv(_spec(attention="flex", compile=True), "svc", "decode", "/models/x")
    args = parse_args(argv[1:])
    assert args.attention == "flex" and args.compile
    plain = parse_args(worker_argv(_spec(), "svc", "decode", "/models/x")[1:])
    assert plain.attention == "sdpa" and not plain.compile


def test_unknown_attention_backend_is_refused():
    with pytest.raises(ValueError, match="attention"):
        EngineConfig(attention="paged-magic")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiling on this CPU takes minutes; CUDA only")
def test_compiled_layers_keep_greedy_tokens():
    from tandem.worker.engine.runner.compiled import compile_layers, warm_up
    from tests.hf_reference import LLAMA_GQA, engine_for, hf_greedy, hf_model, ours_from

    hf = hf_model(LLAMA_GQA)
    engine = engine_for(compile_layers(ours_from(hf)))
    assert warm_up(engine) > 0 and engine.blocks.num_used == 0
    prompt = list(range(3, 20))
    rid = engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    got = []
    while engine.has_work():
        got += [o.token_id for o in engine.step() if o.request_id == rid]
    assert got == hf_greedy(hf, prompt, 8)
