"""Grammar-constrained decoding libraries side by side: the per-token cost of the allowed-token mask, on the
tiny model's vocabulary, for llguidance, xgrammar and outlines-core in one run.

Beside them, the tiny model's own decode step at batch 1 on this host (the engine unconstrained), which each
mask adds to. Each library compiles the same JSON schema (the shape `client.chat.completions.parse` sends for
a small pydantic model) and walks the same valid document token by token: before each token it computes the
mask of allowed next tokens (timed), then commits the token. Reported per library: the median and p99 of the
per-token mask time (a fresh matcher's first mask apart, in its own column), the schema's compile time, and
each figure's ratio to llguidance's; `--repeats` runs, median with the spread (min-max) of the per-run
medians. Optional libraries that are not installed are skipped (`pip install -e '.[bench]'`; the worker itself
depends on llguidance only).

    python -m bench.grammar_mask [--repeats 3] [--tokens-per-run 400]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench._smoke import add_smoke, smoke_sizes
from tandem.worker.devtools.tiny import create_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "temperature_c": {"type": "number"},
        "conditions": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]},
        "hourly": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["city", "temperature_c", "conditions", "hourly"],
    "additionalProperties": False,
}
DOCUMENT = {
    "city": "Lisbon by the sea",
    "temperature_c": 21.5,
    "conditions": "sunny",
    "hourly": [1, 2, 3, 42],
}

# A walker: (model dir, schema, token ids of the document) -> (compile seconds, per-token mask seconds)
Walker = Callable[[Path, dict, list[int]], tuple[float, list[float]]]


def walk_llguidance(model_dir: Path, schema: dict, ids: list[int]) -> tuple[float, list[float]]:
    import llguidance
    import llguidance.torch as llt

    tok = llguidance.LLTokenizer(str(model_dir / "tokenizer.json"))
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    compiled = time.perf_counter() - t0
    mask = llt.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for t in ids:
        t0 = time.perf_counter()
        llt.fill_next_token_bitmask(matcher, mask)
        times.append(time.perf_counter() - t0)
        assert matcher.consume_token(t), matcher.get_error()
    return compiled, times


def walk_xgrammar(model_dir: Path, schema: dict, ids: list[int]) -> tuple[float, list[float]]:
    import transformers
    import xgrammar

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    t0 = time.perf_counter()
    compiled_grammar = compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
    compiled = time.perf_counter() - t0
    matcher = xgrammar.GrammarMatcher(compiled_grammar)
    mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for t in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - t0)
        assert matcher.accept_token(t)
    return compiled, times


def walk_outlines_core(model_dir: Path, schema: dict, ids: list[int]) -> tuple[float, list[float]]:
    import outlines_core
    import tokenizers
    import torch
    from outlines_core.kernels.torch import allocate_token_bitmask, fill_next_token_bitmask

    backend = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    decoder = backend.decoder
    by_text: dict[str, list[int]] = {}
    eos = backend.token_to_id("</s>")
    for token, i in backend.get_vocab(with_added_tokens=False).items():
        if i != eos:
            by_text.setdefault(decoder.decode([token]), []).append(i)
    vocabulary = outlines_core.Vocabulary(eos, by_text)
    t0 = time.perf_counter()
    index = outlines_core.Index(
        outlines_core.json_schema.build_regex_from_schema(json.dumps(schema)), vocabulary
    )
    compiled = time.perf_counter() - t0
    guide = outlines_core.Guide(index)
    mask = allocate_token_bitmask(backend.get_vocab_size(with_added_tokens=True))
    times = []
    for t in ids:
        t0 = time.perf_counter()
        fill_next_token_bitmask(guide, mask)
        times.append(time.perf_counter() - t0)
        guide.advance(t)
    del torch
    return compiled, times


LIBRARIES: dict[str, tuple[str, Walker]] = {
    "llguidance": ("llguidance", walk_llguidance),
    "xgrammar": ("xgrammar", walk_xgrammar),
    "outlines-core": ("outlines_core", walk_outlines_core),
}


def document_ids(model_dir: Path, copies: int) -> list[int]:
    """The document's tokens, then the same object again `copies - 1` times inside an array key."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return list(tok.encode(json.dumps(DOCUMENT), add_special_tokens=False).ids) * copies


def decode_step_us(model_dir: Path, steps: int = 60) -> float:
    """The median decode step of the tiny model, batch 1, no constraint (what a mask's cost adds to)."""
    import torch

    from tandem.worker.api.params import SamplingParams
    from tandem.worker.engine.loading import build_engine
    from tandem.worker.engine.runner.engine import EngineConfig

    torch.set_num_threads(1)
    engine, tokenizer = build_engine(model_dir, EngineConfig(num_kv_blocks=64))
    engine.add_request(
        tokenizer.encode("Once upon a time"),
        SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True),
    )
    engine.step()  # the prefill
    times = []
    while engine.has_work():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tokens-per-run", type=int, default=400, help="masks timed per run (documents walked)"
    )
    add_smoke(parser)
    args = smoke_sizes(parser.parse_args(), repeats=1, tokens_per_run=1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(Path(tmp) / "tiny")
        one_doc = document_ids(model_dir, 1)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        print(f"vocabulary {vocab} tokens; document {len(one_doc)} tokens; schema {json.dumps(SCHEMA)}")
        docs = max(1, args.tokens_per_run // len(one_doc))
        rows: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
        for name, (module, walk) in LIBRARIES.items():
            if importlib.util.find_spec(module) is None:
                print(f"{name}: not installed, skipped")
                continue
            medians, tails, compiles, firsts = [], [], [], []
            for _ in range(args.repeats):
                times: list[float] = []
                compile_s, first_masks = [], []
                for _ in range(docs):
                    c, t = walk(model_dir, SCHEMA, one_doc)
                    compile_s.append(c)
                    first_masks.append(t[0])  # a fresh matcher's first mask (lazy set-up) apart from the rest
                    times += t[1:]
                medians.append(statistics.median(times) * 1e6)
                tails.append(p99(times) * 1e6)
                firsts.append(statistics.median(first_masks) * 1e6)
                compiles.append(statistics.median(compile_s) * 1e3)
            rows[name] = (medians, tails, compiles, firsts)
        base = rows.get("llguidance")
        heads = ("mask p50 us", "mask p99 us", "compile ms", "first mask us")
        print(f"{'library':<14} " + " ".join(f"{h:>22}" for h in heads) + "  ratios to llguidance")
        for name, columns in rows.items():
            cells = [f"{statistics.median(v):8.1f} ({min(v):.1f}-{max(v):.1f})" for v in columns]
            ratio = ""
            if base is not None:
                ratio = " / ".join(
                    f"{statistics.median(v) / statistics.median(b):.2f}x"
                    for v, b in zip(columns, base, strict=True)
                )
            print(f"{name:<14} " + " ".join(f"{c:>22}" for c in cells) + f"  {ratio}")
        steps = [decode_step_us(model_dir) for _ in range(args.repeats)]
        print(
            f"tiny model decode step, batch 1: {statistics.median(steps):.0f} us "
            f"({min(steps):.0f}-{max(steps):.0f})"
        )


if __name__ == "__main__":
    main()
