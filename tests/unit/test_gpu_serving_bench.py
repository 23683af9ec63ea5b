"""bench.gpu_serving's decisions (pure): a probe's row beside the engine-alone step at its batch, saturation,
goodput at the SLO, KV pushes against the copy floor; and a quantization the engine lacks is refused
before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._goodput_sweep import Latency
from bench._serving_report import (
    PROBE_COLUMNS,
    engine_batch,
    kv_row,
    mode_goodput,
    probe_row,
    saturated,
    with_engine_step,
)
from bench.gpu_serving import main
from tandem.slo import Slo

SLO = Slo(500, 50)


def _requests(ttft_s: float, tpot_s: float, n: int = 10, failed: int = 0) -> list[Latency]:
    return [Latency(True, ttft_s, tpot_s, 100)] * (n - failed) + [Latency(False, None, None, 100)] * failed


def test_a_probe_row_puts_the_stacks_tpot_over_the_engines_step_at_its_mean_batch():
    row = probe_row("colocated", 4.0, _requests(0.2, 0.011), mean_batch=7.6, slo=SLO)
    assert row["attainment"] == 1.0 and row["tpot_p50_ms"] == pytest.approx(11.0)
    full = with_engine_step(row, {1: 8.0, 8: 10.0})
    assert set(full) == set(PROBE_COLUMNS)
    assert (full["engine_batch"], full["engine_step_ms"]) == (8, 10.0) and full[
        "tpot_over_engine"
    ] == pytest.approx(1.1)
    assert engine_batch(None) == 1 and engine_batch(0.2) == 1  # no decode steps seen: batch 1


def test_saturation_and_goodput_read_the_slo():
    rows = [
        probe_row("disaggregated", rate, _requests(0.2, 0.02, failed=failed), 1.0, SLO)
        for rate, failed in ((2, 0), (4, 0), (8, 6))
    ]
    assert [saturated(r) for r in rows] == [False, False, True]
    assert (
        mode_goodput(rows, "disaggregated", SLO) == "4.67"
    )  # 1.0 at 4 req/s, 0.4 at 8: 0.9 crossed at 4 + 4 x 0.1/0.6
    assert mode_goodput(rows[:2], "disaggregated", SLO) == ">=4.00"
    slow = [probe_row("colocated", 2, _requests(0.9, 0.02), 1.0, SLO)]  # every TTFT over 500 ms
    assert mode_goodput(slow, "colocated", SLO) == "<0.00" and mode_goodput([], "colocated", SLO) == "-"


def test_a_kv_row_sets_the_tail_against_one_copy_at_the_device_bandwidth():
    row = kv_row(2048, "cuda_ipc", 256 * 2**20, span_s=0.05, tail_s=0.0004, copy_gbps=2000.0)
    assert row["copy_floor_ms"] == pytest.approx(1000 * 256 * 2**20 / 2e12)
    assert row["tail_over_floor"] == pytest.approx(0.4 / row["copy_floor_ms"])


def test_a_quantization_the_engine_lacks_is_refused_before_anything_runs(tmp_path: Path, capsys):
    trace = tmp_path / "never-read.csv"  # refused first: the trace is not even opened
    assert main(["--tiny", "--trace", str(trace), "--quantization", "awq"]) == 2
    assert "--quantization awq: the engine loads only" in capsys.readouterr().err


def test_the_llama_3_shaped_model_decodes_every_id_it_can_sample_to_text(tmp_path: Path):
    """The served stream is timed on its text: a model whose vocabulary outruns its tokenizer would stream
    tokens with no text, and the load generator would time nothing."""
    import json

    import tokenizers

    from bench._shapes import LLAMA_3_1_ROPE_SCALING, write_llama_shaped
    from tandem.worker.devtools.tiny import TinySpec

    shape = TinySpec(layers=1, hidden=64, heads=2, kv_heads=1, intermediate=128, dtype="bfloat16")
    model_dir = write_llama_shaped(tmp_path, shape, LLAMA_3_1_ROPE_SCALING)
    config = json.loads((model_dir / "config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == config["vocab_size"] == 128256
    assert config["rope_scaling"]["factor"] == 8.0  # Llama 3.1's
    for token_id in (500, 1200, 64000, 128255):
        assert tok.decode([token_id]), token_id
