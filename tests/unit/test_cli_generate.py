"""`tandem generate` as a user runs it: a subprocess whose JSON must match the engine run in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROMPT = "The quick brown fox"
MAX_TOKENS = 12


def run_generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "generate", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def engine_greedy(model_dir, prompt_ids: list[int], max_tokens: int) -> list[int]:
    from tandem.worker.api.params import SamplingParams
    from tandem.worker.engine.loading import build_engine
    from tandem.worker.engine.runner.engine import EngineConfig

    engine, _ = build_engine(model_dir, EngineConfig(block_size=16, num_kv_blocks=64), "float32", "cpu")
    request_id = engine.add_request(
        prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    )
    tokens = []
    while engine.has_work():
        tokens += [out.token_id for out in engine.step() if out.request_id == request_id]
    return tokens


@pytest.fixture(scope="module")
def json_result(tiny_model_dir):
    proc = run_generate(
        "--model",
        str(tiny_model_dir),
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(MAX_TOKENS),
        "--ignore-eos",
        "--device",
        "cpu",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_ids_equal_the_engines_greedy_output(tiny_model_dir, json_result):
    from tandem.worker.hf.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    assert json_result["prompt"] == PROMPT
    assert json_result["prompt_token_ids"] == tokenizer.encode(PROMPT)
    assert json_result["completion_token_ids"] == engine_greedy(
        tiny_model_dir, json_result["prompt_token_ids"], MAX_TOKENS
    )
    assert json_result["completion"] == tokenizer.decode(json_result["completion_token_ids"])
    assert json_result["finish_reason"] == "length"


def test_json_reports_latencies(json_result):
    assert json_result["ttft_ms"] > 0
    assert json_result["tpot_ms"] > 0


def test_streamed_text_is_the_completion(tiny_model_dir, json_result):
    proc = run_generate(
        "--model",
        str(tiny_model_dir),
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(MAX_TOKENS),
        "--ignore-eos",
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == json_result["completion"] + "\n"


def test_chat_prompt_goes_through_the_template(tiny_model_dir):
    proc = run_generate(
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "Hello",
        "--chat",
        "--max-tokens",
        "2",
        "--device",
        "cpu",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["prompt"].startswith("<s><|user|>\nHello<|end|>\n<|assistant|>")
    assert result["prompt_token_ids"].count(result["prompt_token_ids"][0]) == 1  # BOS once, from the template


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "temperature must be in [0, 100]"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--max-tokens", "0"], "max_tokens must be an integer in [1,"),
        (["--prompt", ""], "prompt is empty"),
        (["--dtype", "int8"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(tiny_model_dir, args, message):
    proc = run_generate("--model", str(tiny_model_dir), "--prompt", "Hi", "--device", "cpu", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr


def test_missing_model_dir_exits_2(tmp_path):
    proc = run_generate("--model", str(tmp_path / "absent"), "--prompt", "Hi")
    assert proc.returncode == 2
    assert "model directory does not exist" in proc.stderr and "Traceback" not in proc.stderr
