"""`tandem profile` as a user runs it: measure a tiny model on the real engine, and rescale a profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.profile import load_profile, shipped_profile


def run_profile(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "profile", *args], capture_output=True, text=True, timeout=300
    )


def test_measures_the_real_engine(tiny_model_dir, tmp_path):
    out = tmp_path / "p.json"
    done = run_profile(
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        "--threads",
        "1",
        "-o",
        str(out),
        "--prompt-lengths",
        "16,64",
        "--batches",
        "1,2,4",
        "--contexts",
        "16",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
        "--num-kv-blocks",
        "64",
    )
    assert done.returncode == 0, done.stderr
    p = load_profile(out)
    assert [x.prompt_tokens for x in p.prefill] == [16, 64]
    assert sorted(x.batch for x in p.decode) == [1, 2, 4]
    assert all(x.ms > 0 for x in p.prefill) and all(x.step_ms > 0 for x in p.decode)
    assert p.kv_capacity_tokens == 64 * 16 and p.cold_start_ms > 0 and p.device == "cpu"
    made = p.provenance
    assert made is not None and made.command.startswith("tandem profile --model ")
    assert made.torch and made.device_name and made.date.endswith("Z")
    assert made.engine["attention"] == "sdpa" and made.engine["decode_step"] == "eager"
    # the cold start is the worker's own startup phases: load, KV plan and warm-up
    phases = made.startup_s
    assert set(phases) == {"load", "kv_plan", "warmup", "decode_graphs"}
    assert p.cold_start_ms == pytest.approx(
        1000 * (phases["load"] + phases["kv_plan"] + phases["warmup"]), abs=1
    )


def test_a_knob_the_device_cannot_serve_is_refused_with_its_reason(tiny_model_dir, tmp_path):
    out = tmp_path / "p.json"
    done = run_profile(
        "--model", str(tiny_model_dir), "--device", "cpu", "--decode-step", "cudaGraphs", "-o", str(out)
    )
    assert done.returncode == 2 and "cudaGraphs" in done.stderr and not out.exists()
    bad = run_profile("--model", str(tiny_model_dir), "--attention", "paged", "-o", str(out))
    assert bad.returncode == 2 and "--attention" in bad.stderr


def test_rescales_an_existing_profile_for_a_what_if(tmp_path):
    src, out = tmp_path / "src.json", tmp_path / "fast.json"
    src.write_text(shipped_profile().model_dump_json())
    done = run_profile(
        "--from",
        str(src),
        "--prefill-speedup",
        "20",
        "--decode-speedup",
        "5",
        "--note",
        "gpu",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    base, fast = shipped_profile(), load_profile(out)
    assert fast.prefill_ms(512) * 20 == pytest.approx(base.prefill_ms(512))
    assert fast.decode_step_ms(8, 256) * 5 == pytest.approx(base.decode_step_ms(8, 256), rel=1e-6)
    assert fast.scale.note == "gpu"


def test_scales_to_published_figures(tmp_path):
    src, out = tmp_path / "src.json", tmp_path / "gpu.json"
    src.write_text(shipped_profile().model_dump_json())
    done = run_profile(
        "--from",
        str(src),
        "--scale-to-prefill-tokens-per-s",
        "20000",
        "--scale-to-decode-step-ms",
        "8",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    gpu = load_profile(out)
    chunk = gpu.prefill_chunk_tokens
    assert chunk / gpu.prefill_ms(chunk) * 1000 == pytest.approx(20000)
    assert gpu.decode_step_ms(1, 512) == pytest.approx(8.0, rel=1e-6)


def test_missing_model_dir_is_a_usage_error(tmp_path):
    done = run_profile("--model", str(tmp_path / "nope"), "-o", str(tmp_path / "p.json"))
    assert done.returncode == 2 and "does not exist" in done.stderr
