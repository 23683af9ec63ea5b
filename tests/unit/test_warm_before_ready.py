"""Warm before ready: after the worker's warm-up, a first request of any kind takes no step path for the first
time."""

import dataclasses
import subprocess
import sys

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner import step_paths
from tandem.worker.engine.runner.compiled import EVERY_SAMPLING_PATH, warm_up
from tandem.worker.engine.runner.engine import EngineConfig

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
FIRST_REQUESTS = {
    "greedy": [([7, 8, 9], GREEDY)],
    "a long prompt": [(list(range(10, 70)), GREEDY)],
    "sampled, every knob": [([4, 5], dataclasses.replace(EVERY_SAMPLING_PATH, seed=9, min_tokens=2))],
    "logprobs alone": [([6], SamplingParams(max_tokens=2, logprobs=True))],
    "a batch": [([3, 3], GREEDY), ([5, 5, 5], dataclasses.replace(GREEDY, temperature=1.0))],
}


def engine(tiny_model_dir):
    return build_engine(
        tiny_model_dir, EngineConfig(num_kv_blocks=64, block_size=4, prefill_chunk_tokens=32)
    )[0]


def serve(engine, requests):
    for prompt, params in requests:
        engine.add_request(prompt, params)
    while engine.has_work():
        engine.step()


@pytest.mark.parametrize("kind", FIRST_REQUESTS)
def test_the_first_request_after_warm_up_takes_no_new_path(tiny_model_dir, kind):
    warmed = engine(tiny_model_dir)
    warm_up(warmed)
    assert warmed.ready
    expected = {
        step_paths.PREFILL,
        step_paths.DECODE,
        step_paths.GREEDY,
        step_paths.SAMPLED,
        step_paths.SEEDED,
        step_paths.FILTERED,
        step_paths.PENALISED,
        step_paths.CONSTRAINED,
        step_paths.LOGPROBS,
        step_paths.TOP_LOGPROBS,
    }
    assert expected <= warmed.paths_run
    serve(warmed, FIRST_REQUESTS[kind])
    assert warmed.cold_after_ready == []


def test_without_warm_up_the_first_requests_take_cold_paths(tiny_model_dir):
    """The record can fail: an engine marked ready without a warm-up reports the paths its first requests
    took."""
    cold = engine(tiny_model_dir)
    cold.ready = True
    serve(cold, FIRST_REQUESTS["sampled, every knob"])
    assert {step_paths.PREFILL, step_paths.SAMPLED, step_paths.PENALISED} <= set(cold.cold_after_ready)


def test_step_paths_name_each_kind_of_row():
    assert step_paths.forward_paths([5, 1], [[], []]) == [step_paths.PREFILL, step_paths.DECODE]
    assert step_paths.forward_paths([3], [[7, 8]]) == [step_paths.VERIFY]
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.5, seed=1)]
    assert step_paths.sampling_paths(params, [False, True]) == [
        step_paths.GREEDY,
        step_paths.SAMPLED,
        step_paths.SEEDED,
        step_paths.FILTERED,
        step_paths.CONSTRAINED,
    ]


START_WITHOUT_DYNAMO = """
import sys
from pathlib import Path
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.engine import EngineConfig

config = EngineConfig(num_kv_blocks=64, block_size=4, prefill_chunk_tokens=32)
engine = build_engine(Path(sys.argv[1]), config)[0]
warm_up(engine)
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""


def test_an_eager_start_never_imports_torch_dynamo(tiny_model_dir):
    """Loading the model (built on `meta`) and the warm-up (grammar masks included) stay off torch._dynamo,
    whose import is seconds of every worker's start; only a compiled decode step needs it. A fresh
    interpreter: this one may have imported it already."""
    out = subprocess.run(
        [sys.executable, "-c", START_WITHOUT_DYNAMO, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
