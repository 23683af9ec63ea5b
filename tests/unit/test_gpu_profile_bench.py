"""bench.gpu_profile's pure parts: the file names it writes and the `tandem profile` command of a variant."""

from __future__ import annotations

from pathlib import Path

from bench.gpu_profile import GPU, card_slug, knobs_for, parse_args, profile_argv, profile_name, summary
from tandem.worker.devtools.profile import build_parser


def test_the_card_names_the_profile():
    assert card_slug("NVIDIA H200") == "h200"
    assert card_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert profile_name(card_slug("NVIDIA H200"), "bf16") == "h200-llama-3.1-8b-bf16-tandem"


def test_a_gpu_variant_runs_with_the_serving_knobs_a_user_runs_and_tandem_profile_accepts_them():
    a = parse_args(["--out-dir", "out"])
    assert (a.attention, a.decode_step, a.variants) == ("triton", "cudaGraphs", ["bf16", "fp8"])
    argv = profile_argv(Path("m"), Path("p.json"), "cuda", "fp8", GPU, a)
    parsed = build_parser().parse_args(argv)  # the profile command's own parser takes every flag
    assert (parsed.quantization, parsed.dtype, parsed.decode_step) == ("fp8", "bfloat16", "cudaGraphs")
    assert parsed.max_running_sequences == GPU["max_running_sequences"] and parsed.num_kv_blocks is None
    knobs = knobs_for(parse_args(["--max-model-len", "8192"]))
    assert knobs["max_model_len"] == 8192 and knobs["max_running_sequences"] == GPU["max_running_sequences"]
    assert knobs_for(parse_args(["--dry-run"]))["max_model_len"] < GPU["max_model_len"]


def test_the_summary_says_what_was_skipped_and_why():
    report = {
        "model_write_s": 1.0,
        "variants": {"bf16": {"exit": 0, "export_exit": 0, "profile_s": 90.0}, "fp8": {"skipped": "no GPU"}},
    }
    line = summary(report, Path("out"))
    assert "bf16: ok (90.0 s)" in line and "fp8: skipped (no GPU)" in line
