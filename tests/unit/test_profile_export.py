"""`tandem profile export-dynamo` and `compare`: a profile written in Dynamo's profiler layout is the inverse
of the import, and two profiles side by side."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tandem.profile import shipped_profile
from tandem.profile_compare import itl_cell, render, ttft_cell
from tandem.profile_dynamo import DECODE_FILE, PREFILL_FILE, SOURCE_FILE, from_dynamo, to_dynamo
from tests.unit.autoscale_fixtures import linear_profile

NVIDIA = "h200-llama-3.1-8b-fp8"


def _rows(p):
    prefill = [(x.prompt_tokens, x.chunk_tokens, x.ms) for x in p.prefill]
    decode = [(x.batch, x.context_tokens, x.step_ms) for x in p.decode]
    return prefill, decode


def test_nvidias_profile_survives_export_then_import(tmp_path):
    nvidia = shipped_profile(NVIDIA)
    to_dynamo(nvidia, tmp_path)
    back = from_dynamo(tmp_path, model=nvidia.model, device=nvidia.device, dtype=nvidia.dtype)
    (pre_a, dec_a), (pre_b, dec_b) = _rows(nvidia), _rows(back)
    assert [r[:2] for r in pre_b] == [r[:2] for r in pre_a]
    assert [r[2] for r in pre_b] == pytest.approx([r[2] for r in pre_a], rel=1e-12)
    assert [r[:2] for r in dec_b] == [r[:2] for r in dec_a]
    assert [r[2] for r in dec_b] == pytest.approx([r[2] for r in dec_a], rel=1e-12)
    assert back.kv_capacity_tokens == nvidia.kv_capacity_tokens
    assert back.decode_step_ms(64, 2048) == pytest.approx(nvidia.decode_step_ms(64, 2048), rel=1e-9)


def test_the_arrays_are_named_and_in_the_units_dynamos_profiler_writes(tmp_path):
    p = linear_profile()
    written = to_dynamo(p, tmp_path)
    assert written == [tmp_path / PREFILL_FILE, tmp_path / DECODE_FILE, tmp_path / SOURCE_FILE]
    with np.load(tmp_path / PREFILL_FILE) as pre:
        assert sorted(pre.files) == ["prefill_isl", "prefill_thpt_per_gpu", "prefill_ttft"]
        assert pre["prefill_isl"].dtype == np.int64
        first = min(p.prefill, key=lambda x: x.prompt_tokens)
        assert pre["prefill_isl"][0] == first.prompt_tokens and pre["prefill_ttft"][0] == first.ms
        # tokens per second per GPU, as Dynamo's profile_prefill computes it
        assert pre["prefill_thpt_per_gpu"][0] == pytest.approx(first.prompt_tokens / first.ms * 1000)
    with np.load(tmp_path / DECODE_FILE) as dec:
        assert sorted(dec.files) == [
            "max_kv_tokens",
            "x_kv_usage",
            "y_context_length",
            "z_itl",
            "z_thpt_per_gpu",
        ]
        assert dec["max_kv_tokens"].tolist() == [p.kv_capacity_tokens]
        row = p.decode[-1]
        assert dec["x_kv_usage"][-1] == pytest.approx(row.batch * row.context_tokens / p.kv_capacity_tokens)
        assert dec["z_itl"][-1] == row.step_ms
        assert dec["z_thpt_per_gpu"][-1] == pytest.approx(row.batch / row.step_ms * 1000)


def test_only_the_profiles_own_chunk_goes_out(tmp_path):
    data = linear_profile().model_dump()
    data["prefill"] += [{"prompt_tokens": 100, "chunk_tokens": 64, "ms": 99.0}]
    p = type(linear_profile()).model_validate(data)
    to_dynamo(p, tmp_path)
    with np.load(tmp_path / PREFILL_FILE) as pre:
        assert 99.0 not in pre["prefill_ttft"].tolist()
        assert len(pre["prefill_isl"]) == sum(x.chunk_tokens == p.prefill_chunk_tokens for x in p.prefill)


def test_compare_marks_extrapolation_and_what_does_not_fit():
    a, b = shipped_profile(NVIDIA), linear_profile()
    longest = max(x.prompt_tokens for x in b.prefill)
    assert not ttft_cell(b, longest).extrapolated and ttft_cell(b, longest + 1).extrapolated
    assert itl_cell(b, b.max_running_sequences + 1, 16).ms is None  # over the batch cap
    assert itl_cell(b, 1, b.kv_capacity_tokens + 1).ms is None  # over the KV cache
    table = render(a, b, "nvidia", "linear", [512], [1], [512])
    ratio = b.prefill_ms(512) / a.prefill_ms(512)
    assert f"| 512 | {a.prefill_ms(512):.2f} | {b.prefill_ms(512):.2f} | {ratio:.2f} |" in table
    assert f"| 1 | 512 | {a.decode_step_ms(1, 512):.2f} |" in table


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "profile", *args], capture_output=True, text=True, timeout=120
    )


def test_export_and_compare_from_the_command_line(tmp_path):
    done = _cli("export-dynamo", NVIDIA, "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / DECODE_FILE).is_file()
    again = from_dynamo(tmp_path / "out", model="m", device="d")
    assert len(again.decode) == len(shipped_profile(NVIDIA).decode)
    shown = _cli("compare", NVIDIA, "tiny-cpu", "--batches", "1", "--contexts", "128")
    assert shown.returncode == 0, shown.stderr
    assert "| 1 | 128 |" in shown.stdout and "nvidia/Llama-3.1-8B-Instruct-FP8" in shown.stdout


def test_export_of_a_missing_profile_is_a_usage_error(tmp_path):
    done = _cli("export-dynamo", str(tmp_path / "nope.json"), "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "nope.json" in done.stderr
    assert not (tmp_path / "out").exists()
