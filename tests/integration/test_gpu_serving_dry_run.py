"""bench.gpu_serving cannot rot: its dry run (tiny model, CPU, small counts) runs end to end through real
`tandem up` stacks, and its JSON carries every column the GPU run prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench._serving_report import KV_COLUMNS, PROBE_COLUMNS, STARTUP_COLUMNS

pytestmark = pytest.mark.slow  # two stacks start one after the other, and the engine alone runs

ROOT = Path(__file__).resolve().parents[2]


def _trace(path: Path, rows: int = 40) -> Path:
    """An Azure-format trace: a request every ~0.3 s, prompts of 20-200 tokens, outputs of 4-40."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(rows):
        lines.append(f"2023-11-16 18:15:{i * 0.3 + 10:010.7f},{20 + 37 * i % 180},{4 + 11 * i % 36}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(600)
def test_the_dry_run_writes_every_column(tmp_path: Path):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu_serving",
            "--tiny",
            "--trace",
            str(_trace(tmp_path / "t.csv")),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    modes = {r["mode"] for r in result["probes"]}
    assert modes == {"colocated", "disaggregated"}
    for row in result["probes"]:
        assert set(row) == set(PROBE_COLUMNS)
        assert row["completed"] == row["requests"] > 0 and row["engine_step_ms"] > 0
    assert set(result["goodput"]) == modes
    kv = result["kv"]
    assert [k["prompt_tokens"] for k in kv] == [32, 64, 128]
    for k in kv:
        assert set(k) == set(KV_COLUMNS) and k["transport"] == "shm" and k["copy_floor_ms"] > 0
    assert kv[0]["kv_bytes"] < kv[1]["kv_bytes"] < kv[2]["kv_bytes"]  # more prompt, more KV
    assert sorted(s["worker"] for s in result["startup"]) == ["colocated-0", "decode-0", "prefill-0"]
    for s in result["startup"]:
        assert set(s) == set(STARTUP_COLUMNS) and s["load_s"] > 0
    assert "TPOT p50 / engine step" in done.stdout and "copy floor ms" in done.stdout
