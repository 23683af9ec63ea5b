"""`tandem profile` on a GPU with the knobs a GPU user serves with (triton attention, the decode step captured
as CUDA graphs, the cache planned from the card's memory): the profile names the card and times the
captures."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tandem.profile import load_profile
from tandem.worker.devtools.tiny import TinySpec, create_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_gpu_profile_records_the_card_and_the_graph_capture(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", TinySpec(layers=2, dtype="bfloat16"))
    out = tmp_path / "p.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "tandem", "profile", "--model", str(model_dir), "--device", "cuda",
            "--dtype", "bfloat16", "--attention", "triton", "--decode-step", "cudaGraphs",
            "--prompt-lengths", "64,256", "--batches", "1,4,16", "--contexts", "64,256",
            "--max-running-sequences", "16", "--max-model-len", "1024", "--kv-memory-percent", "20",
            "--decode-steps", "3", "--repeats", "1", "-o", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    p = load_profile(out)
    made = p.provenance
    assert made is not None and made.device_name == torch.cuda.get_device_name()
    assert made.engine["decode_step"] == "cudaGraphs" and made.startup_s["decode_graphs"] > 0
    assert made.startup_s["decode_graphs"] <= made.startup_s["warmup"]  # the captures are part of the warm-up
    assert len(p.decode) == 6 and p.kv_capacity_tokens > 16 * 1024  # planned from the card, not a fixed count
