"""`tandem simulate` as users run it: JSON per policy on a small trace slice, a plot, a clear usage error."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench._traces import CONV

FIELDS = {
    "policy",
    "gpu_hours",
    "slo_attainment",
    "ttft_p90_ms",
    "tpot_p90_ms",
    "scaling_actions",
    "reversals_per_hour",
    "goodput_per_gpu_hour",
    "flips_per_hour",
}


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "simulate", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def jsonl_trace(tmp_path: Path) -> Path:
    rng, t, lines = random.Random(3), 1_700_000_000_000.0, []
    for _ in range(400):
        t += rng.expovariate(4.0) * 1000  # epoch milliseconds
        lines.append(
            json.dumps(
                {"timestamp": t, "input_length": rng.randint(50, 800), "output_length": rng.randint(2, 60)}
            )
        )
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_per_policy(jsonl_trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "run.png"
    done = simulate(
        "--trace",
        str(jsonl_trace),
        "--policy",
        "all",
        "--json",
        "--slo-ttft-ms",
        "800",
        "--slo-tpot-ms",
        "200",
        "--plot",
        str(plot),
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["policy"] for r in rows] == [
        "tandem",
        "tandem-flips",
        "dynamo",
        "hpa",
        "static-peak",
        "static-mean",
        "static-colocated",
        "auto",
    ]
    for r in rows:
        assert FIELDS <= set(r)
        assert r["requests"] == 400 and 0 <= r["slo_attainment"] <= 1 and r["gpu_hours"] > 0
    assert plot.stat().st_size > 10_000


def test_time_and_rate_scale(jsonl_trace: Path) -> None:
    base = json.loads(simulate("--trace", str(jsonl_trace), "--policy", "static-mean", "--json").stdout)
    fast = json.loads(
        simulate(
            "--trace",
            str(jsonl_trace),
            "--policy",
            "static-mean",
            "--json",
            "--time-scale",
            "2",
            "--rate-scale",
            "1.5",
        ).stdout
    )
    assert fast["requests"] == 600
    assert fast["simulated_hours"] < base["simulated_hours"]


def test_azure_slice(tmp_path: Path) -> None:
    source = CONV
    sliced = tmp_path / "azure_llm_2023_conv.csv"
    with source.open() as f:
        sliced.write_text("".join(next(f) for _ in range(301)))
    done = simulate(
        "--trace", str(sliced), "--policy", "tandem,hpa", "--profile-speedup", "10", "--slo-ttft-ms", "1000"
    )
    assert done.returncode == 0, done.stderr
    assert "tandem" in done.stdout and "Splitwise" in done.stdout


def test_missing_trace_is_a_usage_error(tmp_path: Path) -> None:
    done = simulate("--trace", str(tmp_path / "none.csv"))
    assert done.returncode == 2 and "no such trace" in done.stderr
