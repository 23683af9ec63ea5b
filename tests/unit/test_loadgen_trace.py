"""Trace parsing for `tandem bench`: Azure CSV, JSONL, and the real Azure traces the repository carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._traces import TRACES
from tandem.loadgen.trace import attribution_for, load_trace, parse_azure_csv, parse_jsonl

AZURE_SAMPLE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""


def test_azure_csv_is_relative_to_first_row(tmp_path: Path) -> None:
    path = tmp_path / "azure_llm_sample.csv"
    path.write_text(AZURE_SAMPLE)
    specs = load_trace(path)
    assert [(s.input_len, s.output_len) for s in specs] == [(374, 44), (396, 109), (879, 55)]
    assert specs[0].arrival_s == 0.0
    assert specs[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert specs[2].arrival_s == pytest.approx(4.541877, abs=1e-6)


def test_azure_csv_across_midnight() -> None:
    rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5,1,1\n2023-11-17 00:00:00.25,2,2\n"
    specs = parse_azure_csv(rows.splitlines(keepends=True))
    assert specs[1].arrival_s == pytest.approx(0.75)


def test_azure_csv_missing_column_is_an_error() -> None:
    with pytest.raises(ValueError, match="GeneratedTokens"):
        parse_azure_csv(["TIMESTAMP,ContextTokens\n", "0,5\n"])


def test_jsonl_numeric_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 100.5, "input_len": 10, "output_len": 3},
        {"timestamp": 101.0, "input_len": 20, "output_len": 4},
        {"timestamp": 103.5, "input_len": 30, "output_len": 5},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    specs = load_trace(path)
    assert [s.arrival_s for s in specs] == [0.0, 0.5, 3.0]
    assert [s.input_len for s in specs] == [10, 20, 30]
    assert parse_jsonl([]) == []


def test_attribution_only_for_azure_traces() -> None:
    assert "Splitwise" in (attribution_for("traces/azure_llm_2023_conv.csv") or "")
    assert attribution_for("mine.jsonl") is None
    assert attribution_for(None) is None


@pytest.mark.parametrize("name", ["azure_llm_2023_conv.csv", "azure_llm_2023_code.csv"])
def test_real_trace_first_rows(name: str, tmp_path: Path) -> None:
    source = TRACES / name
    with source.open() as f:
        head = [next(f) for _ in range(201)]
    sample = tmp_path / name
    sample.write_text("".join(head))
    specs = load_trace(sample)
    assert len(specs) == 200
    assert specs[0].arrival_s == 0.0
    arrivals = [s.arrival_s for s in specs]
    assert arrivals == sorted(arrivals)
    assert 0 < arrivals[-1] < 3600  # 200 requests of an hour-long trace
    assert all(s.input_len > 0 and s.output_len >= 0 for s in specs)
